"""A real HTTP backend on 127.0.0.1 for the clamped clients (tests/http, the examples): ``/fast`` answers at once,
``/slow`` answers only once the test's gate opens (at teardown at the latest), ``/hop``
redirects to ``/fast``, ``/hang`` never answers and notes when the client closes the
connection (``hung``, ``closed``). Every request's headers are recorded."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from conftest import LONG

# the headers a clamped client sends a deadline in (lower case)
DEADLINE_HEADERS = {"grpc-timeout", "x-envoy-expected-rq-timeout-ms", "x-request-deadline"}


def lower(headers: Any) -> dict[str, str]:
    """``headers`` with lower-case names."""
    return {k.lower(): v for k, v in dict(headers).items()}


class Backend:
    """The server, the gate of ``/slow`` and what it received."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.lock = threading.Lock()
        self.received: list[tuple[str, dict[str, str]]] = []
        self.arrived = threading.Event()  # a request reached /slow
        self.hung = threading.Event()  # a request reached /hang
        self.closed = threading.Event()  # ... and its client closed the connection
        backend = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # http.server's name for a GET
                with backend.lock:
                    backend.received.append((self.path, dict(self.headers.items())))
                if self.path == "/hop":
                    self.send_response(302)
                    self.send_header("Location", "/fast")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if self.path == "/hang":
                    backend.hung.set()
                    self.connection.settimeout(LONG)
                    if self.rfile.read(1) == b"":  # a GET has no body: only the close ends it
                        backend.closed.set()
                    return
                if self.path == "/slow":
                    backend.arrived.set()
                    backend.release.wait(LONG)
                body = b"ok"
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # keep the test output clean

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a client that timed out has gone: writing to it fails, as expected

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever,
                                       kwargs={"poll_interval": 0.05},  # a prompt shutdown
                                       name="test-http-backend", daemon=True)

    def paths(self) -> list[str]:
        with self.lock:
            return [p for p, _ in self.received]

    def headers_of(self, path: str) -> list[dict[str, str]]:
        with self.lock:
            return [h for p, h in self.received if p == path]


@contextlib.contextmanager
def running_backend() -> Iterator[Backend]:
    """A started backend, its gate opened and its server closed on the way out."""
    b = Backend()
    b.thread.start()
    try:
        yield b
    finally:
        b.release.set()
        b.server.shutdown()
        b.server.server_close()
        b.thread.join(LONG)
