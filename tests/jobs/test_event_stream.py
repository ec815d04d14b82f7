"""The job event stream (jobs/stream.py) through a real ASGI server: events pushed to watchers
of the tenant and to no one else, a reconnect with Last-Event-ID that misses nothing, a job's
log followed as it grows; and the same frames from the WSGI fallback."""

import threading
import time

import httpx
import pytest
from django.test import override_settings

from jobs.models import Job, JobState
from jobs.services.common import job_move
from jobs.stream import latest_event_id, new_lines
from portal.core.tokens import token_create
from tests.api_support import assert_problem
from tests.jobs_support import api_submit, follow
from tests.stream_support import asgi_server, read_events
from tests.wait_support import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

SLOW_PRINTER = "#!/bin/bash\nfor i in 1 2 3 4; do echo line-$i; sleep 1; done\n"
FAST = {"EVENTS_POLL_MS": "100", "EVENTS_HEARTBEAT_S": "1", "EVENTS_LOG_POLL_MS": "300"}


@pytest.fixture
def server(transactional_db, tmp_path):
    with asgi_server(tmp_path / "asgi.log", **FAST) as base:
        yield base


def headers(user, **more) -> dict:
    return {"Authorization": f"Token {token_create(user=user)[1]}", **more}


def moves(job: Job, *states: str) -> list[int]:
    ids = []
    for state in states:
        job_move(job, state, reason=f"to {state}")
        job.save(update_fields=["state", "reason", "raw_state"])
        ids.append(job.events.latest("id").pk)
    return ids


def open_stream(base: str, user, url: str = "/api/v1/events/stream/", **more):
    client = httpx.Client(base_url=base, headers=headers(user, **more), timeout=httpx.Timeout(10, read=10))
    return client, client.stream("GET", url)


def later(delay_s: float, action) -> threading.Thread:
    thread = threading.Thread(target=lambda: (time.sleep(delay_s), action()))
    thread.start()
    return thread


def test_a_state_change_reaches_the_tenants_watchers_and_no_one_elses(server, make_job, member, outsider):
    job = make_job(member)
    client, stream = open_stream(server, member)
    other, other_stream = open_stream(server, outsider)
    with client, stream as response, other, other_stream as outsiders:
        assert response.status_code == 200 and response.headers["content-type"] == "text/event-stream"
        mover = later(0.5, lambda: moves(job, JobState.SUBMITTING, JobState.PENDING))
        events = read_events(response.iter_lines(), count=2, timeout_s=10)
        mover.join()
        assert [(e.event, e.data["to_state"], e.data["reason"]) for e in events] == [
            ("job", "SUBMITTING", "to SUBMITTING"), ("job", "PENDING", "to PENDING"),
        ]  # fmt: skip
        assert events[0].data["job"] == str(job.pk) and events[0].id == events[0].data["id"]
        # the outsider's stream says nothing of it: only keep-alives until its read gives up
        assert read_events(outsiders.iter_lines(), count=1, timeout_s=2.5) == []


def test_a_reconnect_with_last_event_id_gets_what_it_missed(server, make_job, member):
    job = make_job(member)
    first, *missed = moves(job, JobState.SUBMITTING, JobState.PENDING, JobState.RUNNING)
    client, stream = open_stream(server, member, **{"Last-Event-ID": str(first)})
    with client, stream as response:
        events = read_events(response.iter_lines(), count=2, timeout_s=10)
    assert [int(e.id) for e in events] == missed


def test_a_tenant_the_caller_cannot_see_is_404_and_a_bad_last_event_id_400(server, member, other_tenant):
    with httpx.Client(base_url=server, headers=headers(member), timeout=10) as client:
        assert client.get(f"/api/v1/events/stream/?tenant={other_tenant.slug}").status_code == 404
        bad = client.get("/api/v1/events/stream/", headers={"Last-Event-ID": "x1"})
        assert bad.status_code == 400 and list(bad.json()["errors"]) == ["Last-Event-ID"]
        assert client.get("/api/v1/events/stream/", headers={"Authorization": ""}).status_code == 401


def test_a_jobs_log_is_followed_until_it_ends(
    server, celery_worker, client_for, member, local_partition, grant
):
    """A real job on the local cluster that prints a line a second: the stream gives the lines as
    they come, the job's states, and ends with it."""
    job = api_submit(client_for(member), script=SLOW_PRINTER)
    wait_until(
        lambda: Job.objects.filter(pk=job["id"]).exclude(backend_id="").exists(), timeout_s=30, what="sent"
    )
    client, stream = open_stream(server, member, url=f"/api/v1/jobs/{job['id']}/log/stream/")
    with client, stream as response:
        # beat's polls, as follow() makes them, while the stream is read
        poller = later(
            0, lambda: follow(client_for(member), job["id"], local_partition.cluster_id, {"COMPLETED"})
        )
        events = read_events(response.iter_lines(), count=50, timeout_s=40, until="end")
        poller.join()
    lines = [line for e in events if e.event == "log" for line in e.data["lines"]]
    assert lines == [f"line-{i}" for i in range(1, 5)]
    logs = [e for e in events if e.event == "log"]
    assert len(logs) >= 2  # they came as printed, not at the end
    assert [e.data["whole"] for e in logs] == [True] + [False] * (len(logs) - 1)  # then additions
    assert events[-1].event == "end" and events[-1].data["state"] == "COMPLETED"
    assert "COMPLETED" in [e.data["state"] for e in events if e.event == "state"]


def test_new_lines_finds_what_two_tails_share():
    assert new_lines([], ["a", "b"]) == (["a", "b"], False)
    assert new_lines(["a", "b"], ["a", "b", "c"]) == (["c"], False)
    assert new_lines(["a", "b", "c"], ["b", "c", "d", "e"]) == (["d", "e"], False)
    assert new_lines(["x", "x"], ["x", "x", "x"]) == (["x"], False)
    assert new_lines(["a", "b"], ["c", "d"]) == (["c", "d"], True)  # more came than one tail holds


def test_the_wsgi_fallback_sends_the_same_frames(client_for, make_job, member, outsider):
    """Django's test client is WSGI: the generator that reads for itself."""
    job = make_job(member)
    before = latest_event_id()
    moves(job, JobState.SUBMITTING)
    with override_settings(EVENTS_STREAM_MAX_S=1, EVENTS_POLL_S=0.1, EVENTS_HEARTBEAT_S=1):
        response = client_for(member).get("/api/v1/events/stream/", HTTP_LAST_EVENT_ID=str(before))
        body = b"".join(response.streaming_content).decode()
        assert response["Content-Type"] == "text/event-stream"
        events = read_events(iter(body.splitlines()), count=5, timeout_s=5)
        assert [e.data["to_state"] for e in events] == ["SUBMITTING"]
        quiet = b"".join(
            client_for(outsider)
            .get("/api/v1/events/stream/", HTTP_LAST_EVENT_ID=str(before))
            .streaming_content
        )
        assert b"event: job" not in quiet
    assert_problem(client_for(outsider).get(f"/api/v1/jobs/{job.pk}/log/stream/"), 404, "not_found")


def test_a_tenant_in_an_impossible_form_is_404_and_streams_are_counted_per_user(client_for, member):
    """Both kinds of stream count toward one limit, under WSGI too; a stream that ends gives its
    slot back."""
    client = client_for(member)
    assert_problem(client.get("/api/v1/events/stream/?tenant=a%00b"), 404, "not_found")
    with override_settings(EVENTS_MAX_STREAMS_PER_USER=1, EVENTS_STREAM_MAX_S=1):
        first = client.get("/api/v1/events/stream/")
        assert first.status_code == 200
        assert_problem(client.get("/api/v1/events/stream/"), 429, "throttled")
        first.close()  # what the server does when the client leaves
        second = client.get("/api/v1/events/stream/")
        assert second.status_code == 200
        second.close()
