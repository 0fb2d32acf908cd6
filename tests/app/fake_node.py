"""A stand-in node for GUI tests that need a process but not a model: it speaks the few
endpoints the app uses (health, status, models, load, shutdown, a streamed chat of
'tok' pieces) with the node's CLI arguments. Modes: --fail (exits at once with a message),
--hang (never answers)."""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

STATE = {"state": "idle", "model": "fake-model", "error": None, "version": "0.0-fake"}
MODELS = ["fake-model", "other-model"]


def _not_found(model: str) -> dict:
    return {"error": {"message": f"Model {model!r} not found. Pick one from the list.",
                      "type": "invalid_request_error", "param": "model",
                      "code": "model_not_found"}}


class Handler(BaseHTTPRequestHandler):
    server: ThreadingHTTPServer

    def log_message(self, fmt: str, *args: object) -> None:
        sys.stderr.write(fmt % args + "\n")

    def _json(self, body: object, status: int = 200) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> dict:
        n = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(n) or b"{}")

    def do_GET(self) -> None:  # noqa: N802
        if self.path == "/health":
            self._json({"status": "ok"})
        elif self.path == "/shoal/status":
            self._json(STATE)
        elif self.path == "/v1/models":
            self._json({"object": "list", "data": [{"id": m, "object": "model"} for m in MODELS]})
        else:
            self._json({"error": {"message": "no such path"}}, 404)

    def do_POST(self) -> None:  # noqa: N802
        body = self._body()
        if self.path == "/shoal/shutdown":
            self._json({"ok": True})
            threading.Thread(target=self.server.shutdown).start()
        elif self.path == "/shoal/load":
            if body.get("model") not in MODELS:
                self._json(_not_found(body.get("model")), 404)
            else:
                STATE["model"] = body["model"]
                self._json({"ok": True})
        elif self.path == "/v1/chat/completions":
            self._chat(body)
        else:
            self._json({"error": {"message": "no such path"}}, 404)

    def _chat(self, body: dict) -> None:
        if body.get("model") and body["model"] not in MODELS:
            self._json(_not_found(body["model"]), 404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()  # HTTP/1.0: the stream ends when the connection closes
        n, start = int(body.get("max_tokens") or 20), time.monotonic()
        STATE["state"] = "generating"
        try:
            for i in range(n):
                chunk = {"choices": [{"index": 0, "delta": {"content": "tok "},
                                      "finish_reason": None}]}
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()
                time.sleep(0.01)
            dt = time.monotonic() - start
            final = {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}],
                     "usage": {"prompt_tokens": 3, "completion_tokens": n,
                               "total_tokens": n + 3},
                     "shoal": {"ttft_s": 0.01, "generation_tps": n / dt, "prompt_tps": 300.0}}
            self.wfile.write(f"data: {json.dumps(final)}\n\ndata: [DONE]\n\n".encode())
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client closed the stream: stop generating, as the node does
        finally:
            STATE["state"] = "idle"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("node")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--home")
    p.add_argument("--fail", action="store_true")
    p.add_argument("--hang", action="store_true")
    args = p.parse_args()
    if args.fail:
        print("fake node: can't open the models folder (testing)", flush=True)
        sys.exit(3)
    if args.hang:
        time.sleep(3600)
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    print(f"fake node listening on {args.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
