"""A loopback HTTP endpoint that takes the posts of chat robots and webhooks as WeCom, DingTalk,
Feishu and a generic receiver would: it records each request and answers from a script (the
vendors' own success and error bodies), so that tests judge what the portal sent, signatures
included, and how it takes a refusal. The vendors' servers cannot be reached from here."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from tests.http_support import Answer, Request, loopback_server


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

    def answer(request: Request) -> Answer:
        endpoint.received.append(Received(request.path, request.query, request.headers, request.body))
        index = min(len(endpoint.received), len(endpoint.answers)) - 1
        status, body = endpoint.answers[index]
        return status, "application/json", json.dumps(body).encode()

    with loopback_server(answer) as address:
        endpoint.url = f"http://{address}"
        yield endpoint
