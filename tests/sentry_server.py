"""A Sentry-protocol endpoint on loopback: it accepts the envelopes sentry-sdk
posts (to /api/<project>/envelope/, gzip or plain) and keeps each raw body and
each event, so a test can search everything a worker process sent."""

from __future__ import annotations

import gzip
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class SentryServer:
    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.events: list[dict[str, Any]] = []
        received = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                received.bodies.append(body)
                received.events += _events(body)
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.dsn = f"http://public@127.0.0.1:{self.server.server_port}/1"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _events(body: bytes) -> list[dict[str, Any]]:
    """The event items of one envelope: a header line, then per item a header
    line and a payload (of the header's length, or one line)."""
    events = []
    lines = body.split(b"\n")
    i = 1
    while i < len(lines) - 1:
        header = json.loads(lines[i])
        payload = lines[i + 1]
        i += 2
        if header.get("type") == "event":
            events.append(json.loads(payload))
    return events
