"""A node's stable identity: an id and a name kept in its home folder, so a restarted
node is the same node."""

from __future__ import annotations

import json
import logging
import os
import socket
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Identity:
    id: str
    name: str


def load_identity(home: Path) -> Identity:
    """Read home/node.json, creating it on first run (written atomically)."""
    path = home / "node.json"
    try:
        data = json.loads(path.read_text())
        return Identity(id=str(data["id"]), name=str(data.get("name") or data["id"]))
    except FileNotFoundError:
        pass
    except (ValueError, KeyError, TypeError) as e:
        log.warning("%s is unreadable (%s); making a new identity", path, e)
    ident = Identity(id=uuid.uuid4().hex[:12], name=socket.gethostname() or "node")
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(ident)))
    os.replace(tmp, path)
    return ident
