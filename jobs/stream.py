"""Job events pushed to watchers (docs/architecture.md, Live events): a tenant's job events and
one job's log as Server-Sent Events.

One design, two servers. Under ASGI (the stream's own process in production, scripts/stack;
`make run`) every watcher is an async generator waiting on a queue, and one hub per process
reads the new JobEvents for all of them: one indexed query every EVENTS_POLL_S whether 1 or
500 watch, fanned out in memory by tenant. Under WSGI (Django's test server, a site that has
not routed the stream to the ASGI process) the same frames come from a plain generator that
reads for itself and holds its worker; it works, but a worker per watcher.

Events are JobEvents and their id is the event's id (read as they are committed, which is not
always in id order: portal/core/tailing.py), so a client that reconnects with
`Last-Event-ID` gets what it missed (up to EVENTS_BACKLOG events; beyond that an `event: reset`
tells it to reload from the REST API). Who sees what is the job list's rule: the jobs of the
tenants the caller may see (jobs.selectors), fixed when the stream opens; a stream ends after
EVENTS_STREAM_MAX_S and the client's reconnect is checked anew, so a member removed from a
tenant stops receiving it within that time.
"""

import asyncio
import logging
import re
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

import orjson
from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.cache import cache
from django.db import DatabaseError, connection
from django.db.models import Max, Q
from django.http import StreamingHttpResponse
from rest_framework.exceptions import NotFound, Throttled

from jobs.models import Job, JobEvent
from jobs.services import job_log_tail
from jobs.states import END_STATES
from portal.core.errors import Unavailable
from portal.core.serializers import SLUG_PATTERN
from portal.core.tailing import IdTail
from tenants.models import Tenant
from tenants.selectors import tenant_id_list_visible_to

log = logging.getLogger(__name__)
SLUG_RE = re.compile(SLUG_PATTERN)

# A JobEvent as the stream says it: these columns, in this order (frame() names them).
EVENT_COLUMNS = ("id", "job_id", "job__tenant_id", "job__tenant__slug", "job__name", "from_state", "to_state",
                 "reason", "at")  # fmt: skip
LOG_WINDOW = 200  # the lines read at each look at a job's log: more new lines between two looks are cut


@dataclass(frozen=True)
class Watch:
    """Who watches and what they may see: tenant ids, or None for staff who see every tenant."""

    user_id: int
    tenant_ids: frozenset[int] | None

    def sees(self, tenant_id: int) -> bool:
        return self.tenant_ids is None or tenant_id in self.tenant_ids


def watch_of(user, tenant_slug: str | None) -> Watch:
    """The caller's scope, narrowed to one tenant when asked: a tenant they cannot see is 404."""
    visible = tenant_id_list_visible_to(user=user)
    ids = frozenset(visible) if isinstance(visible, list) else None
    if tenant_slug:
        if not SLUG_RE.fullmatch(tenant_slug):
            raise NotFound  # as a path slug in an impossible form: before any lookup
        tenant_id = Tenant.objects.filter(slug=tenant_slug).values_list("pk", flat=True).first()
        if tenant_id is None or (ids is not None and tenant_id not in ids):
            raise NotFound
        ids = frozenset({tenant_id})
    return Watch(user_id=user.pk, tenant_ids=ids)


def events_where(wanted: Q, *, tenant_ids: frozenset[int] | None, limit: int) -> list[tuple]:
    rows = JobEvent.objects.filter(wanted)
    if tenant_ids is not None:
        rows = rows.filter(job__tenant_id__in=tenant_ids)
    return list(rows.order_by("id").values_list(*EVENT_COLUMNS)[:limit])


def latest_event_id() -> int:
    return JobEvent.objects.aggregate(latest=Max("id"))["latest"] or 0


def frame(event: str, data: dict, *, event_id: int | None = None) -> bytes:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\n".encode() + b"data: " + orjson.dumps(data) + b"\n\n"


def event_frame(row: tuple) -> bytes:
    event_id, job_id, _, tenant, name, from_state, to_state, reason, at = row
    data = {"id": str(event_id), "job": str(job_id), "tenant": tenant, "name": name,
            "from_state": from_state, "to_state": to_state, "reason": reason,
            "at": at.isoformat().replace("+00:00", "Z")}  # fmt: skip
    return frame("job", data, event_id=event_id)


def opening() -> bytes:
    # Reconnect after 2 s; the padding gets the headers and this past any proxy that buffers a little.
    return b"retry: 2000\n:" + b" " * 2048 + b"\n\n"


KEEPALIVE = b": keepalive\n\n"
RESET = frame("reset", {"detail": "More events were missed than the stream replays: reload from the API."})


def backlog(watch: Watch, last_id: int) -> tuple[list[bytes], list[int]]:
    """What a reconnecting client missed: its frames (a reset last if cut) and their ids."""
    rows = events_where(Q(id__gt=last_id), tenant_ids=watch.tenant_ids, limit=settings.EVENTS_BACKLOG + 1)
    sent = rows[: settings.EVENTS_BACKLOG]
    frames = [event_frame(row) for row in sent]
    if len(rows) > len(sent):
        frames.append(RESET)
    return frames, [row[0] for row in sent]


# -- WSGI: a generator that reads for itself -------------------------------------------------


def events_polled(watch: Watch, last_id: int | None) -> Iterator[bytes]:
    yield opening()
    tail, replayed = IdTail(latest_event_id()), set()
    if last_id is not None:
        frames, ids = backlog(watch, last_id)
        replayed = set(ids)
        yield from frames
    deadline, quiet_since = time.monotonic() + settings.EVENTS_STREAM_MAX_S, time.monotonic()
    while time.monotonic() < deadline:
        # Every tenant's rows, the caller's picked here: the gaps are the ids not yet committed,
        # not the other tenants' events (portal/core/tailing.py).
        rows = events_where(tail.wanted(), tenant_ids=None, limit=settings.EVENTS_BACKLOG)
        tail.took([row[0] for row in rows])
        for row in rows:
            if watch.sees(row[2]) and row[0] not in replayed:
                yield event_frame(row)
                quiet_since = time.monotonic()
        if time.monotonic() - quiet_since >= settings.EVENTS_HEARTBEAT_S:
            yield KEEPALIVE
            quiet_since = time.monotonic()
        time.sleep(settings.EVENTS_POLL_S)


# -- How many streams a user holds: across the site's processes, in the cache ------------------


def _slots(user_id: int) -> str:
    return f"streams:{user_id}"


def stream_slot_take(user_id: int) -> None:
    """One of the user's EVENTS_MAX_STREAMS_PER_USER open streams (both kinds, every process),
    or 429. The count lives in the cache and expires a little after the longest stream, so a
    stream whose end was never counted (a process killed) frees its slot by then. A cache that
    cannot be reached lets the stream open."""
    key = _slots(user_id)
    try:
        cache.add(key, 0, timeout=settings.EVENTS_STREAM_MAX_S + 60)
        held = cache.incr(key)
        cache.touch(key, timeout=settings.EVENTS_STREAM_MAX_S + 60)
    except Exception as exc:  # the cache backend's own errors differ (redis, file system)
        log.warning("stream count skipped, cache unavailable: %s", exc.__class__.__name__)
        return
    if held > settings.EVENTS_MAX_STREAMS_PER_USER:
        stream_slot_give(user_id)
        raise Throttled(detail="Too many open event streams; close one first.")


def stream_slot_give(user_id: int) -> None:
    try:
        if cache.decr(_slots(user_id)) < 0:
            cache.set(_slots(user_id), 0, timeout=settings.EVENTS_STREAM_MAX_S + 60)
    except Exception:  # gone (expired) or unreachable: nothing to give back
        log.debug("stream slot of %s already gone", user_id)


class _Released:
    """A stream's content that gives its slot back when the response is closed: Django closes
    it whether the stream ended, the client left, or it never started."""

    def __init__(self, content, release) -> None:
        self.content, self._release = content, release

    def close(self) -> None:
        release, self._release = self._release, None
        if release is not None:
            release()
        if (close := getattr(self.content, "close", None)) is not None:
            close()


class _SyncReleased(_Released):
    def __iter__(self):
        return iter(self.content)


class _AsyncReleased(_Released):
    def __aiter__(self):
        return self.content.__aiter__()


def _counted(user_id: int, content) -> _Released:
    stream_slot_take(user_id)
    released = _AsyncReleased if hasattr(content, "__aiter__") else _SyncReleased
    return released(content, lambda: stream_slot_give(user_id))


# -- ASGI: one hub per process, a queue per watcher ------------------------------------------


def released(read):
    """`read` for a thread of asgiref's shared pool: its connection handed back after each call,
    so that no idle pool thread holds one of the process's few (portal/asgi.py)."""

    def call(*args, **kwargs):
        try:
            return read(*args, **kwargs)
        finally:
            connection.close()

    return call


@dataclass(eq=False)
class Subscriber:
    watch: Watch
    queue: asyncio.Queue = field(default_factory=lambda: asyncio.Queue(maxsize=settings.EVENTS_BACKLOG))


class Hub:
    """Reads every new JobEvent once per EVENTS_POLL_S while anyone watches, and hands each to
    the watchers who may see it. A watcher whose queue is full (a client that reads slower than
    events come) is dropped: its stream ends, and its reconnect replays what it missed."""

    def __init__(self) -> None:
        self.subscribers: set[Subscriber] = set()
        self.tail: IdTail | None = None
        self.task: asyncio.Task | None = None
        self.read = sync_to_async(self._read, thread_sensitive=False)

    async def subscribe(self, watch: Watch) -> Subscriber:
        if self.tail is None:
            self.tail = IdTail(await sync_to_async(released(latest_event_id), thread_sensitive=False)())
        subscriber = Subscriber(watch)
        self.subscribers.add(subscriber)
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self._run())
        return subscriber

    def unsubscribe(self, subscriber: Subscriber) -> None:
        self.subscribers.discard(subscriber)

    def _read(self, wanted: Q) -> list[tuple]:
        try:
            return events_where(wanted, tenant_ids=None, limit=settings.EVENTS_BACKLOG)
        except DatabaseError as exc:
            log.warning("event stream: the database did not answer: %s", exc.__class__.__name__)
            return []
        finally:
            connection.close()  # back to the pool (portal/asgi.py): the next read takes one

    async def _run(self) -> None:
        while self.subscribers and self.tail is not None:
            rows = await self.read(self.tail.wanted())
            self.tail.took([row[0] for row in rows])
            for row in rows:
                for subscriber in list(self.subscribers):
                    if subscriber.watch.sees(row[2]):
                        self._hand(subscriber, row)
            if len(rows) < settings.EVENTS_BACKLOG:
                await asyncio.sleep(settings.EVENTS_POLL_S)
        self.tail = None  # the next watcher starts from the newest event then

    def _hand(self, subscriber: Subscriber, row: tuple) -> None:
        try:
            subscriber.queue.put_nowait(row)
        except asyncio.QueueFull:
            self.unsubscribe(subscriber)
            subscriber.queue.get_nowait()
            subscriber.queue.put_nowait(None)  # wakes the watcher to end its stream


HUB = Hub()


async def events_pushed(watch: Watch, last_id: int | None) -> AsyncIterator[bytes]:
    # Subscribed here, in the stream, so that whatever ends the stream (the client gone before
    # the first byte included) unsubscribes it.
    subscriber = await HUB.subscribe(watch)
    try:
        yield opening()
        replayed: set[int] = set()
        if last_id is not None:
            frames, ids = await sync_to_async(released(backlog), thread_sensitive=False)(watch, last_id)
            replayed = set(ids)
            for chunk in frames:
                yield chunk
        deadline = time.monotonic() + settings.EVENTS_STREAM_MAX_S
        while (left := deadline - time.monotonic()) > 0:
            try:
                row = await asyncio.wait_for(subscriber.queue.get(), min(left, settings.EVENTS_HEARTBEAT_S))
            except TimeoutError:
                yield KEEPALIVE
                continue
            if row is None:
                return
            if row[0] not in replayed:
                yield event_frame(row)
    finally:
        HUB.unsubscribe(subscriber)


def is_asgi(request) -> bool:
    from django.core.handlers.asgi import ASGIRequest

    return isinstance(getattr(request, "_request", request), ASGIRequest)


def stream_response(content) -> StreamingHttpResponse:
    response = StreamingHttpResponse(content, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache, no-store"
    response["X-Accel-Buffering"] = "no"  # nginx passes each event on at once
    return response


def job_events_stream(request, watch: Watch, last_id: int | None) -> StreamingHttpResponse:
    if not is_asgi(request):
        return stream_response(_counted(watch.user_id, events_polled(watch, last_id)))
    content = _counted(watch.user_id, events_pushed(watch, last_id))
    connection.close()  # the request's thread's: a stream holds no connection (portal/asgi.py)
    return stream_response(content)


# -- One job's log ----------------------------------------------------------------------------


def new_lines(before: list[str], now: list[str]) -> tuple[list[str], bool]:
    """The lines of `now` after those of `before` (two tails of the same growing log), and whether
    some were cut: the longest end of `before` that `now` starts with is what both saw."""
    if not before:
        return now, False
    for overlap in range(min(len(before), len(now)), 0, -1):
        if before[-overlap:] == now[:overlap]:
            return now[overlap:], False
    return now, True


@dataclass
class LogFollow:
    """One look at a job's log and state, as the log stream takes it every EVENTS_LOG_POLL_S."""

    job_id: int
    lines: list[str] = field(default_factory=list)
    state: str = ""
    unavailable: bool = False

    def look(self) -> list[bytes]:
        job = Job.objects.select_related("tenant", "cluster").get(pk=self.job_id)
        frames = []
        try:
            tail = job_log_tail(job=job, lines=LOG_WINDOW)
        except Unavailable as exc:
            if not self.unavailable:
                frames.append(frame("unavailable", {"detail": str(exc.detail)}))
            self.unavailable = True
        else:
            self.unavailable = False
            whole = not self.lines  # the first lines of this stream: the tail as it is, not an addition
            added, cut = new_lines(self.lines, tail.lines)
            self.lines = tail.lines
            if added:
                truncated = cut or (tail.truncated and whole)  # earlier lines than these exist
                frames.append(frame("log", {"lines": added, "whole": whole, "truncated": truncated}))
        if job.state != self.state:
            frames.append(frame("state", {"job": str(job.pk), "state": job.state, "reason": job.reason}))
            self.state = job.state
        if job.state in END_STATES:
            frames.append(frame("end", {"job": str(job.pk), "state": job.state, "exit_code": job.exit_code}))
        return frames


def _ended(frames: list[bytes]) -> bool:
    return bool(frames) and frames[-1].startswith(b"event: end")


def log_polled(follow: LogFollow) -> Iterator[bytes]:
    yield opening()
    deadline = time.monotonic() + settings.EVENTS_STREAM_MAX_S
    while time.monotonic() < deadline:
        frames = follow.look()
        yield from frames or [KEEPALIVE]
        if _ended(frames):
            return
        time.sleep(settings.EVENTS_LOG_POLL_S)


async def log_pushed(follow: LogFollow) -> AsyncIterator[bytes]:
    look = sync_to_async(released(follow.look), thread_sensitive=False)
    yield opening()
    deadline = time.monotonic() + settings.EVENTS_STREAM_MAX_S
    while time.monotonic() < deadline:
        frames = await look()
        for chunk in frames or [KEEPALIVE]:
            yield chunk
        if _ended(frames):
            return
        await asyncio.sleep(settings.EVENTS_LOG_POLL_S)


def job_log_stream(request, job: Job) -> StreamingHttpResponse:
    follow = LogFollow(job_id=job.pk)
    if not is_asgi(request):
        return stream_response(_counted(request.user.pk, log_polled(follow)))
    content = _counted(request.user.pk, log_pushed(follow))
    connection.close()  # as job_events_stream
    return stream_response(content)
