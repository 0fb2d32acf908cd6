"""How long a model stays loaded unused, as Ollama's keep_alive and `shoal node
--unload-after` say it: the one parser the API and the CLI use."""

from __future__ import annotations

import re
from typing import Any

DURATION = re.compile(r"(\d+(?:\.\d*)?)(ns|us|µs|ms|s|m|h)")
UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def duration_seconds(v: Any) -> float | None:
    """How long a model stays loaded unused, as Ollama's keep_alive says it: seconds, or a
    Go duration ("5m", "1h30m"); negative (or "never") keeps it loaded (None), 0 unloads
    it once its requests are done. A ValueError says what is wrong."""
    text = v.strip() if isinstance(v, str) else None
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        seconds = float(v)
    elif text == "never":
        return None
    elif text is not None and re.fullmatch(r"-?\d+(\.\d*)?", text):
        seconds = float(text)
    elif text is not None and re.fullmatch(r"-?(" + DURATION.pattern + ")+", text):
        sign = -1.0 if text.startswith("-") else 1.0
        seconds = sign * sum(float(n) * UNITS[u] for n, u in DURATION.findall(text))
    else:
        raise ValueError(f"expected seconds or a duration like \"5m\" or \"1h\" "
                         f"(negative: keep the model loaded), not {v!r}")
    return None if seconds < 0 else seconds
