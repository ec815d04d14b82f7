"""Jobs through the API in end-to-end tests: submit one, and follow it as beat would."""

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from jobs.models import Job
from jobs.services import JobRequest, job_submit
from jobs.services.admission import jobs_admit_marked
from jobs.tasks import poll_cluster

JOB = {
    "tenant": "protein-lab", "scenario": "ai-training", "gpu_model": "h100-80gb", "gpus": 2, "walltime_minutes": 5,
    "name": "hello", "script": "#!/bin/bash\necho gpus=$CUDA_VISIBLE_DEVICES\nsleep 1\n",
}  # fmt: skip


def api_submit(client, **fields) -> dict:
    """POST /api/v1/jobs/ with JOB's fields, `fields` replacing them; the 201 answer."""
    response = client.post("/api/v1/jobs/", JOB | fields, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def follow(client, job_id: str, cluster_id: int, until: set[str], timeout_s: float = 60) -> dict:
    """Poll the cluster through the worker, as beat would, until the job reaches one of `until`."""
    deadline = time.monotonic() + timeout_s
    seen = []
    while time.monotonic() < deadline:
        poll_cluster.delay(cluster_id=cluster_id).get(timeout=60)
        job = client.get(f"/api/v1/jobs/{job_id}/").json()
        seen.append((job["state"], job["reason"]))
        if job["state"] in until:
            return job
        time.sleep(0.3)
    raise AssertionError(f"job {job_id} never reached {until} in {timeout_s}s: {seen[-5:]}")


def submit_admitted(user, request: JobRequest) -> Job:
    """job_submit, then the admission pass that the admit task it sent would run: for tests that
    move jobs on without a Celery worker (the job as the pass left it)."""
    job = job_submit(user=user, request=request)[0]
    jobs_admit_marked(partition_id=job.partition_id)
    job.refresh_from_db()
    return job


MAX_POLLS = 600  # the stand-in for beat asks five minutes at most


@contextmanager
def beat(cluster_id: int, every_s: float = 0.5) -> Iterator[None]:
    """Stands in for Celery beat: asks the worker to poll the cluster every `every_s` while the
    block runs (a page or a command watches), MAX_POLLS times at most."""
    stop = threading.Event()

    def run() -> None:
        for _ in range(MAX_POLLS):
            if stop.is_set():
                return
            poll_cluster.delay(cluster_id=cluster_id).get(timeout=30)
            stop.wait(every_s)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=35)
