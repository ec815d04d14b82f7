"""A loopback HTTP endpoint that takes the posts of chat robots and webhooks as WeCom, DingTalk,
Feishu and a generic receiver would: it records each request and answers from a script (the
vendors' own success and error bodies), so that tests judge what the portal sent, signatures
included, and how it takes a refusal. The vendors' servers cannot be reached from here."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit


@dataclass
class Received:
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes

    def json(self) -> dict:
        return json.loads(self.body)


@dataclass
class RobotEndpoint:
    url: str
    received: list[Received] = field(default_factory=list)
    # (HTTP status, JSON body) per request, in order; the last one repeats.
    answers: list[tuple[int, dict]] = field(default_factory=lambda: [(200, {"errcode": 0, "errmsg": "ok"})])


@contextmanager
def robot_endpoint() -> Iterator[RobotEndpoint]:
    endpoint = RobotEndpoint(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            length = min(int(self.headers.get("Content-Length", 0)), 1 << 20)
            parts = urlsplit(self.path)
            endpoint.received.append(
                Received(
                    path=parts.path,
                    query={k: v[0] for k, v in parse_qs(parts.query).items()},
                    headers=dict(self.headers.items()),
                    body=self.rfile.read(length),
                )
            )
            index = min(len(endpoint.received), len(endpoint.answers)) - 1
            status, answer = endpoint.answers[index]
            body = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    endpoint.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield endpoint
    finally:
        server.shutdown()
        server.server_close()
