"""What the user set per model, kept in the node's home (model_settings.json): today a
context limit below what the model declares, which saves KV memory. The listings, the
planner and the worker (which enforces it) all read it from here."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, TypedDict, cast

from engine.errors import BadRequest

log = logging.getLogger(__name__)

MIN_CONTEXT = 256  # below this no chat template and answer fit


class Settings(TypedDict, total=False):
    """One model's entry in model_settings.json."""
    context_limit: int


class ModelSettings:
    def __init__(self, home: Path):
        self.path = home / "model_settings.json"
        self._data: dict[str, Settings] = self._read()

    def _read(self) -> dict[str, Settings]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:  # damaged: say so, keep serving with none set
            log.warning("ignoring %s: %s", self.path, e)
            return {}
        if not isinstance(data, dict):
            log.warning("ignoring %s: not a JSON object", self.path)
            return {}
        # kept as read (a newer version's keys too); context_limit() checks the value
        return {k: cast(Settings, v) for k, v in data.items() if isinstance(v, dict)}

    def context_limit(self, model: str) -> int | None:
        v = self._data.get(model, {}).get("context_limit")
        return v if isinstance(v, int) and v >= MIN_CONTEXT else None

    def capped(self, model: str, declared: int) -> int:
        """The context `model` runs with: what it declares, or the user's lower limit."""
        limit = self.context_limit(model)
        return min(declared, limit) if limit else declared

    def set_context_limit(self, model: str, limit: Any, declared: int) -> None:
        """Set (or with None clear) a model's limit; a 400 naming context_limit when it
        isn't a whole number from MIN_CONTEXT to what the model declares."""
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)
                                  or not MIN_CONTEXT <= limit <= declared):
            raise BadRequest(f"context_limit must be a whole number from {MIN_CONTEXT} to "
                             f"{declared} (what {model} declares), or null to clear it; not "
                             f"{limit!r}.", param="context_limit")
        entry = self._data.setdefault(model, {})
        if limit is None:
            entry.pop("context_limit", None)
        else:
            entry["context_limit"] = limit
        if not entry:
            del self._data[model]
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self._data, indent=2))
        os.replace(tmp, self.path)  # a crash mid-write never leaves half a file
