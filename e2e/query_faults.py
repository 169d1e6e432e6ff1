"""A Prometheus in front of the real one that fails some queries: the operator's queries of one
revision answer 503 while the fault is on, every other query goes through unchanged.

The operator is pointed at the proxy (`prometheusUrl`); `fail_revision(r)` makes every query
naming `specdeploy_dev_revision="r"` fail as an overloaded or timed-out Prometheus would;
`heal()` ends it. Listens on 127.0.0.1 only.
"""

from __future__ import annotations

import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

REVISION_MATCHER = 'specdeploy_dev_revision="{}"'


class QueryFaultProxy:
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.failing: str | None = None
        self.failed = 0
        self.passed = 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                proxy.forward(self, None)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                proxy.forward(self, self.rfile.read(length))

            def log_message(self, format: str, *args: Any) -> None:
                """Quiet."""

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}"

    def forward(self, handler: BaseHTTPRequestHandler, body: bytes | None) -> None:
        query = urllib.parse.unquote_plus(handler.path + "&" + (body or b"").decode())
        failing = self.failing
        if failing is not None and REVISION_MATCHER.format(failing) in query:
            self.failed += 1
            handler.send_response(503)
            handler.send_header("Content-Type", "application/json")
            handler.end_headers()
            handler.wfile.write(b'{"status":"error","error":"query timed out (injected)"}')
            return
        self.passed += 1
        request = urllib.request.Request(self.upstream + handler.path, data=body)
        for key in ("Content-Type",):
            if handler.headers.get(key):
                request.add_header(key, handler.headers[key])
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                status, payload = answer.status, answer.read()
        except urllib.error.HTTPError as error:
            status, payload = error.code, error.read()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.end_headers()
        handler.wfile.write(payload)

    def fail_revision(self, revision: str) -> None:
        self.failing = revision

    def heal(self) -> None:
        self.failing = None

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextmanager
def query_fault_proxy(upstream: str) -> Iterator[QueryFaultProxy]:
    proxy = QueryFaultProxy(upstream)
    proxy.start()
    try:
        yield proxy
    finally:
        proxy.stop()
