"""Shared fixtures: a loopback HTTP server speaking whatever protocol a test scripts, and the
location of the team's shared traces (../shared beside the repo root), skipped when absent."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

# ``RAYPIPE_SHARED`` where the project is checked out elsewhere than beside ``shared`` (a worktree)
SHARED = Path(os.environ.get("RAYPIPE_SHARED") or Path(__file__).resolve().parents[2].parent / "shared")
TRACES = SHARED / "pricing_traces" / "training_on_a_dime"

Route = Callable[[str, str, dict[str, str]], tuple[Any, ...]]


class Loopback:
    """127.0.0.1 server on an ephemeral port; ``route(method, path, headers) -> (status, body[, headers])``.

    A POSTed body reaches the route as ``headers[":body"]``.
    """

    def __init__(self, route: Route) -> None:
        self.route = route
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                headers = {k.lower(): v for k, v in self.headers.items()}
                length = int(headers.get("content-length", 0) or 0)
                if length:  # a POSTed form (EC2's query protocol) reaches the route as ":body"
                    headers[":body"] = self.rfile.read(length).decode()
                outer.requests.append((self.command, self.path, headers))
                answer = outer.route(self.command, self.path, headers)
                status, body = answer[0], answer[1]
                extra: dict[str, str] = answer[2] if len(answer) > 2 else {}  # type: ignore[misc]
                data = body if isinstance(body, bytes) else (body if isinstance(body, str) else json.dumps(body)).encode()
                self.send_response(status)
                kind = "text/xml" if data.lstrip().startswith(b"<") else "application/json"
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                for key, value in extra.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_PUT = do_POST = _serve

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def loopback() -> Iterator[Callable[[Route], Loopback]]:
    servers: list[Loopback] = []

    def make(route: Route) -> Loopback:
        servers.append(Loopback(route))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


@pytest.fixture
def traces() -> Path:
    if not TRACES.is_dir():
        pytest.skip("shared training_on_a_dime traces not present")
    return TRACES
