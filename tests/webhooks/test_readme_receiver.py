"""The README's webhook receiver, run as it is written there, against real deliveries: it
accepts a signed one and refuses a forged and a replayed one."""

import re
import subprocess
import sys
import time

import httpx
import pytest

from jobs.models import JobState
from jobs.services.common import job_move
from tests.conftest import ROOT, free_port, stop, wait_for_port
from webhooks import services
from webhooks.models import AllowedRange, Delivery
from webhooks.outbound import signature

pytestmark = pytest.mark.django_db


def readme_receiver() -> str:
    text = (ROOT / "README.md").read_text()
    (code,) = re.findall(r"```python\n(# receiver\.py.*?)```", text, flags=re.S)
    return code


def test_the_readme_receiver_takes_a_signed_delivery_and_refuses_forged_and_replayed_ones(
    tmp_path, client_for, owner, member, make_job
):
    AllowedRange.objects.create(cidr="127.0.0.0/8")
    port = free_port()
    made = (
        client_for(owner)
        .post(
            "/api/v1/tenants/protein-lab/webhooks/",
            {"url": f"http://127.0.0.1:{port}/", "events": ["job.state_changed"]},
        )
        .json()
    )
    script = tmp_path / "receiver.py"
    script.write_text(readme_receiver())
    env = {"WEBHOOK_SECRET": made["secret"], "PORT": str(port), "PATH": "/usr/bin:/bin"}
    receiver = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE, text=True)
    try:
        wait_for_port(port, timeout_s=10, proc=receiver)
        services.events_scan()
        job = make_job(member)
        job_move(job, JobState.SUBMITTING, reason="sent")
        job.save()
        services.events_scan()
        delivery = Delivery.objects.get()
        services.delivery_attempt(delivery_id=delivery.pk)
        delivery.refresh_from_db()
        assert (delivery.status, delivery.response_status) == ("sent", 204)
        body = services.body_of(delivery)
        now = str(int(time.time()))
        forged = httpx.post(f"http://127.0.0.1:{port}/", content=body,
                            headers={"X-Portal-Timestamp": now, "X-Portal-Signature": "sha256=" + "0" * 64})  # fmt: skip
        old = str(int(time.time()) - 3600)
        replayed = httpx.post(f"http://127.0.0.1:{port}/", content=body,
                              headers={"X-Portal-Timestamp": old,
                                       "X-Portal-Signature": signature(made["secret"], old, body)})  # fmt: skip
        assert (forged.status_code, replayed.status_code) == (401, 401)
    finally:
        stop(receiver)
    printed = receiver.stdout.read()
    assert printed == f"job {job.pk} {job.name}: QUEUED → SUBMITTING sent\n"
