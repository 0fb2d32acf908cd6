"""The `shoal` command: `shoal` opens the app; `shoal node` runs a headless node;
`shoal models ...` manages models; `shoal chat` asks a running node."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path

from engine.errors import ShoalError
from engine.net import DEFAULT_PORT
from engine.paths import default_home, ensure, logs_dir, models_dir


def _setup_logging(home: Path | None, name: str, verbose: bool) -> None:
    from engine.logs import setup
    setup(ensure(logs_dir(home)) / f"{name}.log" if home is not None else None, verbose)


def _cmd_node(a: argparse.Namespace) -> int:
    from engine.node.main import NodeConfig, run_node
    home = Path(a.home).expanduser() if a.home else default_home()
    if a.max_streams < 1 or not a.queue_wait > 0 or not a.max_body_mb > 0 \
            or not a.stall_timeout > 0:
        print("shoal node: --max-streams must be 1 or more, --queue-wait, --stall-timeout and "
              "--max-body-mb above 0.", file=sys.stderr)
        return 2
    if a.memory_limit is not None and a.memory_limit <= 0:
        print("shoal node: --memory-limit must be above 0 GB.", file=sys.stderr)
        return 2
    if a.prefix_disk_gb < 0:
        print("shoal node: --prefix-disk-gb must be 0 (off) or more.", file=sys.stderr)
        return 2
    if not 1 <= a.draft_tokens <= 16:
        print(f"shoal node: --draft-tokens must be 1 to 16 (got {a.draft_tokens}).",
              file=sys.stderr)
        return 2
    from engine.durations import duration_seconds
    try:
        unload_after = duration_seconds(a.unload_after)
    except ValueError as e:
        print(f"shoal node: --unload-after: {e}.", file=sys.stderr)
        return 2
    try:
        api_key = secret_arg("--api-key", a.api_key, a.api_key_file, "SHOAL_API_KEY",
                             "set SHOAL_API_KEY or use --api-key-file PATH instead")
        secret = secret_arg("--secret", a.secret, a.secret_file, "SHOAL_SECRET",
                            "set SHOAL_SECRET, use --secret-file PATH, or store it once "
                            "with `shoal secret set -` (it reads stdin)")
    except ValueError as e:
        print(f"shoal node: {e}.", file=sys.stderr)
        return 2
    _setup_logging(home, "node", a.verbose)
    asyncio.run(run_node(NodeConfig(
        host=a.host, port=a.port, home=home, model=a.model, api_key=api_key, peers=a.peer,
        secret=secret, cluster_host=a.cluster_host,
        cluster_tls=os.environ.get("SHOAL_CLUSTER_TLS", "on") != "off",
        tls_cert=a.tls_cert, tls_key=a.tls_key,
        cluster_port=a.cluster_port, mdns=a.mdns == "on",
        mdns_interfaces=a.mdns_interface, cors_origins=a.cors_origin or [
            o for o in os.environ.get("SHOAL_CORS_ORIGINS", "").split(",") if o.strip()],
        allowed_hosts=a.allowed_host or [
            h for h in os.environ.get("SHOAL_ALLOWED_HOSTS", "").split(",") if h.strip()],
        max_body_mb=a.max_body_mb, max_streams=a.max_streams, queue_wait_s=a.queue_wait,
        stall_s=a.stall_timeout, speculative=a.speculative == "on",
        draft_model=a.draft_model, draft_tokens=a.draft_tokens,
        kv_bits=int(a.kv_bits) if a.kv_bits in ("8", "4") else None,
        keep_alive_s=unload_after, prefix_disk_gb=a.prefix_disk_gb,
        memory_limit_gb=a.memory_limit, heal=a.heal)))
    # Everything is closed and every worker reaped. Leave without C++ static destructors:
    # MLX (imported for this machine's facts) can still hold a thread then, and a joinable
    # std::thread destroyed at exit aborts the process (seen once: exit code -6 after a
    # clean stop of the frozen app).
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _cmd_models_list(a: argparse.Namespace) -> int:
    from engine.hub.local import list_local_models
    home = Path(a.home).expanduser() if a.home else default_home()
    models = list_local_models(models_dir(home))
    if not models:
        print("No models yet. Import one with `shoal models import FILE.gguf`.")
        return 0
    print(f"{'MODEL':48} {'SOURCE':9} {'SIZE':>9} {'LAYERS':>6}  QUANTIZATION")
    for m in models:
        size = f"{m.size_bytes / 1e9:.2f} GB" if m.size_bytes >= 1e9 else \
            f"{m.size_bytes / 1e6:.0f} MB"
        print(f"{m.id:48} {m.source:9} {size:>9} {m.layers or '?':>6}  {m.quantization}")
    return 0


def _cmd_models_import(a: argparse.Namespace) -> int:
    from engine.hub.gguf import import_gguf
    home = Path(a.home).expanduser() if a.home else default_home()
    dest = import_gguf(Path(a.file), ensure(models_dir(home)), name=a.name)
    print(f"Imported {a.file} as {dest.name} ({dest})")
    return 0


def secret_arg(flag: str, value: str | None, file: str | None, env: str,
               safer: str) -> str | None:
    """A secret for `flag`: from its file (`flag`-file), from the command line (with a
    warning that `ps` shows it to every user, and `safer` ways), else from the environment
    variable `env`; None where none is given. ValueError for a file it can't read."""
    if file is not None:
        return read_secret_file(file, f"{flag}-file")
    if value:
        print(f"shoal: warning: {flag}'s value is visible to every user of this machine "
              f"(in `ps`); {safer}.", file=sys.stderr)
        return value
    return os.environ.get(env) or None


def read_secret_file(path: str, what: str) -> str:
    """The first line of the file at `path`, stripped; ValueError, naming `what`, for a
    missing, unreadable or empty file."""
    try:
        with open(path, encoding="utf-8") as f:
            line = f.readline(65536)  # a secret, not a file's worth of text
    except FileNotFoundError:
        raise ValueError(f"{what}: there is no file {path}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{what}: could not read {path} "
                         f"({getattr(e, 'strerror', None) or e})") from None
    if not line.strip():
        raise ValueError(f"{what}: the first line of {path} is empty; put the secret there")
    return line.strip()


def _secret_to_set(a: argparse.Namespace) -> str:
    """What `shoal secret set` stores: from --file, stdin (`-`), the command line (with a
    warning), or asked for on a terminal."""
    if a.file is not None:
        if a.value:
            raise ValueError("give the secret or --file, not both")
        return read_secret_file(a.file, "--file")
    if a.value == "-":
        value = sys.stdin.readline(65536).strip()
        if not value:
            raise ValueError("nothing came on stdin: pipe the secret in, e.g. "
                             "`shoal secret set - < FILE`")
        return value
    if a.value:
        return secret_arg("the secret", a.value, None, "",
                          "use `shoal secret set -` (stdin) or --file PATH instead") or ""
    if sys.stdin.isatty():
        import getpass
        value = getpass.getpass("cluster secret: ").strip()
        if value:
            return value
    raise ValueError("give the secret: `shoal secret set -` reads it from stdin, "
                     "`shoal secret set --file PATH` from a file")


def _cmd_secret(a: argparse.Namespace) -> int:
    from engine.cluster.auth import pairing_code
    from engine.cluster.secret import SecretStore, new_secret
    home = Path(a.home).expanduser() if a.home else default_home()
    store = SecretStore(home)
    if a.action != "set" and (a.value or a.file):
        print(f"shoal secret: `{a.action}` takes no secret; `shoal secret set` does.",
              file=sys.stderr)
        return 2
    if a.action == "set":
        try:
            store.set(_secret_to_set(a))
        except ValueError as e:
            print(f"shoal secret: {e}.", file=sys.stderr)
            return 2
    elif a.action == "rotate":
        store.set(new_secret())
        print("A new secret: give it to every node of the cluster (shoal secret set -, "
              "then paste it), then restart them.")
    value = store.ensure()
    print(f"cluster secret: {value}\npairing code:   {pairing_code(value)}\n"
          f"kept in:        {store.where}")
    return 0


def _plan_inputs(url: str) -> Callable[[str], tuple]:
    """What `shoal plan` needs from the running cluster, asked of the local node."""
    def fetch(model: str) -> tuple:
        from engine.client import NodeClient
        with NodeClient(url) as c:
            src = c._call("GET", "/shoal/plan/inputs", params={"model": model})
        return src["nodes"], src["links"], src["config"]
    return fetch


def _cmd_chat(a: argparse.Namespace) -> int:
    from engine.client import NodeClient
    with NodeClient(a.url) as c:
        stream = c.chat([{"role": "user", "content": a.prompt}], model=a.model,
                        max_tokens=a.max_tokens)
        for d in stream:
            sys.stdout.write(d.text)
            sys.stdout.flush()
            if d.usage and d.shoal:
                sys.stderr.write(f"\n[{d.usage['completion_tokens']} tokens, "
                                 f"{d.shoal.get('generation_tps', 0):.1f} tokens/s, "
                                 f"first token {d.shoal.get('ttft_s', 0) * 1000:.0f} ms]\n")
    return 0


def _cmd_connect(a: argparse.Namespace) -> int:
    from engine.connect import KEY_ENV, render, target, write_config
    from engine.connect_fit import about
    t = target(a.url, a.model, os.environ.get(KEY_ENV), a.agent)
    if a.write:
        w = write_config(a.agent, t, Path.home())
        if not w.changed:
            print(f"{w.path} already has {a.agent}'s settings for {t.model} at {t.url}; "
                  "nothing changed.")
        else:
            kept = f"; the file as it was is kept as {w.backup.name}" if w.backup else ""
            print(f"Wrote {a.agent}'s settings for {t.model} at {t.url} to {w.path}{kept}.")
        print(f"{t.model}: {about(a.agent, t.context)}. {t.note}".strip())
        return 0
    sys.stdout.write(render(a.agent, t))
    return 0


def _cmd_app(a: argparse.Namespace) -> int:
    print("shoal: the window is started by `shoal` (app.cli); try `shoal node` or "
          "`shoal models list` here.", file=sys.stderr)
    return 2


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="shoal", description=__doc__)
    p.add_argument("--home", help="state folder (default: per-user data folder)")
    p.add_argument("-v", "--verbose", action="store_true")
    p.set_defaults(func=_cmd_app)
    sub = p.add_subparsers(dest="cmd")

    n = sub.add_parser("node", help="run a headless node")
    n.add_argument("--host", default="127.0.0.1")
    n.add_argument("--port", type=int, default=DEFAULT_PORT)
    n.add_argument("--home", default=argparse.SUPPRESS)
    n.add_argument("--model", help="model to load at start ('none' to load nothing; "
                   "default: the bundled SmolLM2, imported on first run)")
    key = n.add_mutually_exclusive_group()
    key.add_argument("--api-key", metavar="KEY",
                     help="require this key of API clients (needed off loopback); `ps` shows "
                     "it to every user of the machine: prefer SHOAL_API_KEY or "
                     "--api-key-file")
    key.add_argument("--api-key-file", metavar="PATH",
                     help="read the API key from the first line of this file (default: "
                     "--api-key, else SHOAL_API_KEY)")
    n.add_argument("--speculative", choices=("on", "off"),
                   default=os.environ.get("SHOAL_SPECULATIVE", "on"),
                   help="speculative decoding: draft tokens and verify them in one pass, "
                        "where that measures faster (default on, or SHOAL_SPECULATIVE)")
    n.add_argument("--draft-model", metavar="MODEL",
                   default=os.environ.get("SHOAL_DRAFT_MODEL") or None,
                   help="a draft model (id or folder) with the served model's tokenizer; "
                        "default: drafts from prompt lookup (or SHOAL_DRAFT_MODEL)")
    n.add_argument("--draft-tokens", type=int, default=6, metavar="N",
                   help="the most drafted tokens per pass, 1 to 16 (default 6)")
    n.add_argument("--kv-bits", choices=("16", "8", "4"),
                   default=os.environ.get("SHOAL_KV_BITS", "16"),
                   help="the KV cache's bits: 16 (the model's own), or quantized to 8 or "
                        "4 for about 1.9x or 3.6x the context (default 16, or "
                        "SHOAL_KV_BITS); a launch may choose its own")
    n.add_argument("--prefix-disk-gb", type=float, metavar="GB",
                   default=float(os.environ.get("SHOAL_PREFIX_DISK_GB", "0") or 0),
                   help="keep finished prompts' KV on disk too, up to this much per model, "
                        "so it survives restarts (in HOME/cache/prefix; default 0: off, or "
                        "SHOAL_PREFIX_DISK_GB)")
    n.add_argument("--heal", action=argparse.BooleanOptionalAction,
                   default=os.environ.get("SHOAL_HEAL", "on") != "off",
                   help="when a node of a model this node runs over several dies, place "
                        "the model again on the nodes left if it fits (default on; "
                        "--no-heal or SHOAL_HEAL=off to leave it down)")
    n.add_argument("--memory-limit", type=float, metavar="GB", default=None,
                   help="admit requests only while the worker's memory stays under this "
                        "(default: what Metal may wire on a Mac, what the OS has available "
                        "elsewhere); a request that can't fit gets a 503 saying why")
    n.add_argument("--unload-after", metavar="DURATION",
                   default=os.environ.get("SHOAL_UNLOAD_AFTER", "never"),
                   help="unload a model nobody used for this long (e.g. 10m, 1h; the next "
                        "request loads it again; an Ollama request's keep_alive sets its "
                        "own); default never, or SHOAL_UNLOAD_AFTER")
    n.add_argument("--max-streams", type=int, default=16, metavar="N",
                   help="requests decoded together on this node (default 16); more wait")
    n.add_argument("--queue-wait", type=float, default=60.0, metavar="SECONDS",
                   help="how long a request waits for a turn before a 503 with "
                        "Retry-After (default 60)")
    n.add_argument("--stall-timeout", type=float, default=300.0, metavar="SECONDS",
                   help="a worker that says nothing this long (no token and no prefill "
                        "progress) is stuck and restarted (default 300)")
    n.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                   help="let web pages from ORIGIN (e.g. http://localhost:3000; '*' for any) "
                   "call the API from a browser; repeatable (default: none, or "
                   "SHOAL_CORS_ORIGINS, comma-separated)")
    n.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                   help="a host name (beside this node's address and localhost) clients "
                   "may reach the API by, e.g. a name in your DNS or a reverse proxy's; "
                   "repeatable; '*' for any (default: none, or SHOAL_ALLOWED_HOSTS, "
                   "comma-separated)")
    n.add_argument("--tls-cert", metavar="FILE", default=os.environ.get("SHOAL_TLS_CERT"),
                   help="serve the user API over HTTPS with this certificate (PEM; with "
                   "--tls-key), for clients on other machines")
    n.add_argument("--tls-key", metavar="FILE", default=os.environ.get("SHOAL_TLS_KEY"),
                   help="the private key of --tls-cert (PEM)")
    n.add_argument("--max-body-mb", type=float, default=32.0, metavar="MB",
                   help="refuse request bodies over this size with a 413 (default 32: "
                   "room for a few images inline, as clients send them)")
    n.add_argument("--cluster-host", default=os.environ.get("SHOAL_CLUSTER_HOST", "auto"),
                   help="the addresses (comma-separated) other nodes reach this one at; "
                   "only members holding the cluster secret get through, over TLS. "
                   "Default 'auto': this machine's private and link-local addresses "
                   "(never a public one; give 0.0.0.0 to serve every interface)")
    n.add_argument("--cluster-port", type=int, default=0,
                   help="port for other nodes (default: --port + 1)")
    secret = n.add_mutually_exclusive_group()
    secret.add_argument("--secret", metavar="SECRET",
                        help="the cluster secret to join (stored; default: SHOAL_SECRET, "
                        "else the stored one, else a new cluster); `ps` shows it to every "
                        "user of the machine: prefer SHOAL_SECRET, --secret-file, or "
                        "storing it once with `shoal secret set -`")
    secret.add_argument("--secret-file", metavar="PATH",
                        help="read the cluster secret from the first line of this file")
    n.add_argument("--mdns", choices=["on", "off"], default=os.environ.get("SHOAL_MDNS", "on"),
                   help="find and announce nodes on the local network (default on)")
    n.add_argument("--mdns-interface", action="append", default=[], metavar="ADDRESS",
                   help="announce/listen only on the interface with this address")
    n.add_argument("--peer", action="append", default=[], metavar="HOST:PORT",
                   help="another node to join (repeatable; remembered)")
    n.set_defaults(func=_cmd_node)

    m = sub.add_parser("models", help="list, import, search, pull, remove models"
                       ).add_subparsers(dest="mcmd")
    ml = m.add_parser("list", help="models on this machine")
    ml.add_argument("--home", default=argparse.SUPPRESS)
    ml.set_defaults(func=_cmd_models_list)
    mi = m.add_parser("import", help="import a GGUF file as an MLX model")
    mi.add_argument("file")
    mi.add_argument("--name", help="model id (default: from the file name)")
    mi.add_argument("--home", default=argparse.SUPPRESS)
    mi.set_defaults(func=_cmd_models_import)
    from engine.hub.cli_models import add_models_parsers
    add_models_parsers(m)

    s = sub.add_parser("secret", help="show, set or rotate the cluster secret",
                       description="Show, set or rotate the cluster secret (kept in the "
                       "system keyring, else in a file only you can read). `set` reads it "
                       "from stdin (`shoal secret set -`), a file (--file PATH) or asks for "
                       "it; a value on the command line works too, but `ps` shows it to "
                       "every user of the machine.")
    s.add_argument("action", choices=["show", "set", "rotate"], nargs="?", default="show")
    s.add_argument("value", nargs="?", help="for set: - to read the secret from stdin")
    s.add_argument("--file", metavar="PATH",
                   help="for set: read the secret from the first line of this file")
    s.add_argument("--home", default=argparse.SUPPRESS)
    s.set_defaults(func=_cmd_secret)

    from engine.placement_cli import add_plan_parser, cmd_plan
    pl = add_plan_parser(sub)
    pl.set_defaults(func=lambda a: cmd_plan(a, cluster=_plan_inputs(a.url)))

    from engine.connect import AGENTS
    co = sub.add_parser("connect", help="settings that point a coding agent at a node")
    co.add_argument("agent", choices=AGENTS)
    co.add_argument("--url", default=f"http://127.0.0.1:{DEFAULT_PORT}",
                    help="the node (default: this machine's)")
    co.add_argument("--model", help="the model (default: the loaded one if its window holds "
                    "the agent's prompt, else the smallest one on the node that does)")
    co.add_argument("--write", action="store_true",
                    help="write them into the agent's config file instead of printing")
    co.set_defaults(func=_cmd_connect)

    c = sub.add_parser("chat", help="ask a running node")
    c.add_argument("prompt")
    c.add_argument("--url", default=f"http://127.0.0.1:{DEFAULT_PORT}")
    c.add_argument("--model")
    c.add_argument("--max-tokens", type=int, default=256)
    c.set_defaults(func=_cmd_chat)
    return p


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    if getattr(a, "cmd", None) == "models" and not getattr(a, "mcmd", None):
        a.func = _cmd_models_list
    if not hasattr(a, "verbose"):
        a.verbose = False
    try:
        return a.func(a)
    except ShoalError as e:
        print(f"shoal: {e.message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
