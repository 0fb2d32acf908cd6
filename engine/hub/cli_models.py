"""`shoal models search|pull|rm|login`: the Hub side of the models command. They work on
this machine directly (no node needed); the node's API offers the same to the GUI."""

from __future__ import annotations

import argparse
import getpass
import logging
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.errors import BadRequest, Cancelled, ShoalError

if TYPE_CHECKING:
    from engine.hub.token import TokenStore

log = logging.getLogger(__name__)


def add_models_parsers(models: Any) -> None:
    """Add search, pull, rm and login to the `shoal models` subparsers."""
    s = models.add_parser("search", help="find models: catalog, this machine, the Hub")
    s.add_argument("query", nargs="*", help="words the model id must contain")
    s.add_argument("--offline", action="store_true", help="don't ask the Hub")
    s.add_argument("--home", default=argparse.SUPPRESS)
    s.set_defaults(func=cmd_search)

    p = models.add_parser("pull", help="download a model into the Hugging Face cache")
    p.add_argument("repo", help="owner/name, e.g. mlx-community/Qwen3-8B-4bit")
    p.add_argument("--revision", default="main")
    p.add_argument("--layers", metavar="START:END",
                   help="only the weight files holding layers [START, END)")
    p.add_argument("--include", action="append", metavar="PATTERN",
                   help="only files matching this pattern (repeatable)")
    p.add_argument("--cache-dir", help="Hugging Face cache (default: HF_HUB_CACHE, then "
                   "HF_HOME/hub, then ~/.cache/huggingface/hub)")
    p.add_argument("--home", default=argparse.SUPPRESS)
    p.set_defaults(func=cmd_pull)

    r = models.add_parser("rm", help="delete a model from this machine")
    r.add_argument("model", help="a Shoal model name or owner/name in the HF cache")
    r.add_argument("--home", default=argparse.SUPPRESS)
    r.set_defaults(func=cmd_rm)

    lg = models.add_parser("login", help="store a Hugging Face token (read from stdin)")
    lg.add_argument("--forget", action="store_true", help="remove the stored token")
    lg.add_argument("--home", default=argparse.SUPPRESS)
    lg.set_defaults(func=cmd_login)


def _home(a: argparse.Namespace) -> Path:
    from engine.paths import default_home
    return Path(a.home).expanduser() if getattr(a, "home", None) else default_home()


def _size(n: float | None) -> str:
    if not n:
        return "?"
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"


def cmd_search(a: argparse.Namespace) -> int:
    from engine.hub.catalog import browse
    from engine.hub.token import TokenStore
    from engine.paths import models_dir
    from engine.telemetry.memory import memory_info
    home = _home(a)
    found = browse(models_dir(home), " ".join(a.query), memory_info().available_bytes,
                   online=not a.offline, token=TokenStore(home).get())
    if found.hub_error:
        print(f"(Hub search unavailable: {found.hub_error})", file=sys.stderr)
    if not found.models:
        print("No model matches.")
        return 0
    print(f"{'MODEL':52} {'SIZE':>9} {'LAYERS':>6} {'QUANT':6} {'FITS':4}  WHERE")
    for m in found.models:
        approx = "~" if "size_bytes" in m.approximate else ""
        where = ", ".join(w.source for w in m.local) or m.source
        fit = {True: "yes", False: "no", None: "?"}[m.fits]
        print(f"{m.id:52} {approx + _size(m.size_bytes):>9} {m.layers or '?':>6} "
              f"{m.quantization or '?':6} {fit:4}  {where}")
    return 0


class _Printer:
    """Progress on stderr: one rewritten line on a terminal, a line every 2 s otherwise."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.last = 0.0

    def __call__(self, p: Any) -> None:
        now = time.monotonic()
        if not self.tty and now - self.last < 2.0 and p.done < p.total:
            return
        self.last = now
        pct = 100 * p.done / p.total if p.total else 100
        eta = f", {p.eta_s:.0f} s left" if p.eta_s is not None else ""
        line = (f"{p.repo_id}: {_size(p.done)} of {_size(p.total)} ({pct:.0f}%), "
                f"{p.speed_Bps / 1e6:.1f} MB/s{eta}")
        sys.stderr.write(f"\r{line:90}" if self.tty else line + "\n")
        sys.stderr.flush()


def cmd_pull(a: argparse.Namespace) -> int:
    from engine.hub.download import pull
    from engine.hub.token import TokenStore
    layers = None
    if a.layers:
        try:
            start, end = (int(v) for v in a.layers.split(":"))
        except ValueError:
            raise ShoalError("--layers takes START:END, e.g. --layers 0:16") from None
        layers = (start, end)
    cancel = threading.Event()
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["path"] = pull(a.repo, a.revision, Path(a.cache_dir) if a.cache_dir else None,
                               a.include, TokenStore(_home(a)).get(), _Printer(), cancel,
                               layers=layers)
        except BaseException as e:  # handed to the main thread below
            box["error"] = e
    # the download runs in a thread so Ctrl-C can stop it cleanly, keeping finished bytes
    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        while t.is_alive():
            t.join(0.2)
    except KeyboardInterrupt:
        cancel.set()
        t.join(30)
    if sys.stderr.isatty():
        sys.stderr.write("\n")
    if isinstance(box.get("error"), Cancelled):
        print("Stopped. The finished part is kept: run the same command to resume.",
              file=sys.stderr)
        return 130
    if "error" in box:
        raise box["error"]
    print(f"{a.repo} is in {box['path']}")
    return 0


def cmd_rm(a: argparse.Namespace) -> int:
    from engine.hub.catalog import remove_model
    from engine.paths import models_dir
    freed = remove_model(models_dir(_home(a)), a.model)
    print(f"Deleted {a.model} ({_size(freed)} freed).")
    return 0


def cmd_login(a: argparse.Namespace) -> int:
    from engine.hub.token import TokenStore
    store = TokenStore(_home(a))
    if a.forget:
        store.clear()
        print("The Hugging Face token is forgotten.")
        return 0
    if sys.stdin.isatty():
        token = getpass.getpass("Hugging Face token (input hidden): ")
    else:
        token = sys.stdin.readline()
    print(store_token(store, token, lambda note: print(note, file=sys.stderr)))
    return 0


def store_token(store: TokenStore, token: str,
                note: Callable[[str], None] = log.info) -> str:
    """Check a Hugging Face token with the Hub and keep it in `store` (the CLI's login and
    the node's settings route); what to tell the user. `note` hears that the Hub couldn't
    be asked (the token is stored anyway)."""
    from engine.hub.token import mask
    token = token.strip()
    if not token:
        raise BadRequest("No token given. Create one at "
                         "https://huggingface.co/settings/tokens and paste it.", param="token")
    who = _whoami(token, note)
    store.set(token)
    return f"Token {mask(token)} stored in {store.where}" + \
        (f"; it belongs to {who}." if who else ".")


def _whoami(token: str, note: Callable[[str], None]) -> str | None:
    """The account a token belongs to; TokenRejected if the Hub refuses it, None when the
    Hub can't be asked (offline): the token is stored anyway."""
    import os

    from huggingface_hub import HfApi

    from engine.hub.errors import HubUnreachable, TokenRejected, hub_error
    if os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE"):
        return None
    endpoint = os.environ.get("HF_ENDPOINT") or None
    try:
        return str(HfApi(endpoint=endpoint).whoami(token=token).get("name") or "") or None
    except Exception as e:
        err = hub_error(e, "", "main", endpoint or "https://huggingface.co", True)
        if isinstance(err, HubUnreachable):
            note(f"(could not check the token: {err.message})")
            return None
        if isinstance(err, TokenRejected) or "401" in str(e):
            raise TokenRejected("The Hugging Face Hub refused this token: check that you "
                                "copied all of it, or create a new one at "
                                "https://huggingface.co/settings/tokens.") from None
        raise err from None
