"""A server on 127.0.0.1 for tests that play an outside service's endpoint (a DCGM exporter, a
chat robot): every request, whatever its method, answered by a function of the test."""

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

MAX_BODY = 1 << 20


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]  # the first value of each name
    headers: dict[str, str]
    body: bytes


# What the test's function answers: the status, the Content-Type and the body.
Answer = tuple[int, str, bytes]


@contextmanager
def loopback_server(answer: Callable[[Request], Answer]) -> Iterator[str]:
    """Serve until the block ends; yields the server's "127.0.0.1:<port>"."""

    class Handler(BaseHTTPRequestHandler):
        def _answer(self):
            length = min(int(self.headers.get("Content-Length") or 0), MAX_BODY)
            parts = urlsplit(self.path)
            request = Request(
                method=self.command,
                path=parts.path,
                query={name: values[0] for name, values in parse_qs(parts.query).items()},
                headers=dict(self.headers.items()),
                body=self.rfile.read(length) if length else b"",
            )
            status, content_type, body = answer(request)
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_PUT = do_DELETE = _answer

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
