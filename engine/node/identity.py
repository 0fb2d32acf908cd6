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


def regenerate_identity(home: Path, old: Identity) -> Identity:
    """A new id (same name) for a node whose state folder was copied from another."""
    ident = Identity(id=uuid.uuid4().hex[:12], name=old.name)
    tmp = home / "node.json.tmp"
    tmp.write_text(json.dumps(asdict(ident)))
    os.replace(tmp, home / "node.json")
    log.warning("another node has this node's id %s (a copied state folder): this node is "
                "now %s", old.id, ident.id)
    return ident
