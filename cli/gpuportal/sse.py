"""Server-Sent Events, as the portal's streams send them (docs/api.md, Live events)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any


@dataclass
class StreamEvent:
    """One Server-Sent Event: its type, id (None when it has none) and JSON data."""

    event: str
    id: str | None
    data: dict[str, Any]


def parse_sse(lines: Iterator[str]) -> Iterator[StreamEvent]:
    """Server-Sent Events from a body's lines (the WHATWG rules this API needs: `event`, `id`,
    multi-line `data`, comments); an event whose data is not JSON is skipped, and each comment
    (the server's keep-alive) is passed on as an event of type `comment`."""
    event, event_id, data = "", None, []
    for line in lines:
        if line == "":
            if data:
                try:
                    payload = json.loads("\n".join(data))
                except ValueError:
                    payload = None
                if isinstance(payload, dict):
                    yield StreamEvent(event or "message", event_id, payload)
            event, event_id, data = "", None, []
            continue
        if line.startswith(":"):
            yield StreamEvent("comment", None, {})  # a keep-alive: the reader may look at its clock
            continue
        name, _sep, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            event = value
        elif name == "data":
            data.append(value)
        elif name == "id" and "\0" not in value:
            event_id = value
