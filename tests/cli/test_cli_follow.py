"""Following jobs on the local cluster through the real event streams: `logs -f` prints the lines
while the job prints them, across the stream's reconnect (the test portal ends a stream after
10 s) without repeating one, and exits 0 or 1 by the job's end; `events --follow` resumes with
Last-Event-ID and misses nothing; `cancel` stops a running job. A real Celery worker dispatches
and a poller moves the jobs on, as beat would."""

import json
import time

import pytest

from jobs.models import Job
from jobs.stream import latest_event_id
from tests.cli_support import Reader, api_get, job_file
from tests.jobs_support import beat
from tests.wait_support import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

PRINTER = "#!/bin/bash\nfor i in $(seq 1 12); do echo line-$i; sleep 1; done\n"  # 12 s: past a stream's 10
FAILING = "#!/bin/bash\necho about to fail\nexit 3\n"
SLEEPER = "#!/bin/bash\necho sleeping\nsleep 300\n"


def test_logs_f_events_follow_and_cancel(member_cli, grant, local_partition, worker):
    cli = member_cli
    since = latest_event_id()
    with beat(local_partition.cluster_id):
        started = time.monotonic()
        watcher = Reader(cli.start("events", "--follow", "--json", "--since", str(since), "--timeout", "16"))
        ids = {}
        for name, script in (("printer", PRINTER), ("failing", FAILING), ("sleeper", SLEEPER)):
            path = job_file(cli.home, f"{name}.yaml", name=name, script=script)
            ids[name] = cli.run("submit", "-f", str(path), "--json").json()["id"]
        printer = Reader(cli.start("logs", "-f", ids["printer"]))
        failing = cli.run("logs", "-f", ids["failing"])
        assert failing.rc == 1 and failing.stdout == "about to fail\n", failing
        assert failing.stderr.splitlines()[-1] == f"Job {ids['failing']} ended FAILED (exit code 3)."

        wait_until(
            lambda: Job.objects.get(pk=ids["sleeper"]).state == "RUNNING",
            timeout_s=20,
            what="sleeper running",
        )
        following = Reader(cli.start("events", "--follow", ids["sleeper"]))  # until that job ends
        time.sleep(max(0.0, started + 10.5 - time.monotonic()))  # the watcher's first stream has ended
        cancelled = cli.run("cancel", ids["sleeper"])
        assert cancelled.rc == 0 and cancelled.stdout.startswith(
            f"Cancel asked for job {ids['sleeper']}: it is "
        )

        lines = printer.finish(timeout_s=30)
        assert printer.proc.returncode == 0, printer.proc.stderr.read()
        followed = following.finish(timeout_s=10)
        assert following.proc.returncode == 0
        events = [json.loads(line) for _, line in watcher.finish(timeout_s=30)]
        assert watcher.proc.returncode == 0  # its --timeout ended it: done

    # every line once, in order, though the log stream ended and was reconnected mid-job
    assert [line for _, line in lines] == [f"line-{i}" for i in range(1, 13)]
    assert lines[-1][0] - lines[0][0] > 8  # they came as printed, not all at the end
    assert (
        printer.proc.stderr.read().splitlines()[-1] == f"Job {ids['printer']} ended COMPLETED (exit code 0)."
    )
    assert cli.json("logs", ids["printer"]) == api_get(cli.url, cli.token, f"/jobs/{ids['printer']}/log/")
    assert cli.run("logs", ids["printer"], "--tail", "2").stdout == "line-11\nline-12\n"

    assert followed[-1][1].endswith(f"job {ids['sleeper']} sleeper  CANCELLING → CANCELLED  (cancelled)") or (
        "→ CANCELLED" in followed[-1][1]
    ), followed
    assert Job.objects.get(pk=ids["sleeper"]).state == "CANCELLED"

    # the watcher saw each event once, resumed across its reconnect, in the order they were made
    assert [e["event"] for e in events] == ["job"] * len(events)
    event_ids = [int(e["id"]) for e in events]
    assert event_ids == sorted(set(event_ids))
    by_job = {
        name: [e["data"]["to_state"] for e in events if e["data"]["job"] == job] for name, job in ids.items()
    }
    assert by_job["printer"][0] == "QUEUED" and by_job["printer"][-1] == "COMPLETED"
    assert by_job["failing"][-1] == "FAILED"
    assert by_job["sleeper"][-2:] == ["CANCELLING", "CANCELLED"]
    expected = [e["to_state"] for e in api_get(cli.url, cli.token, f"/jobs/{ids['sleeper']}/events/")]
    assert by_job["sleeper"] == expected
