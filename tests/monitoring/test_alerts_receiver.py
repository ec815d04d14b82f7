"""POST /hooks/alertmanager: who may post, what a bad body gets, how each alert finds its tenant
(through the job it concerns) or the platform, and that repeats are grouped and resolutions
notified."""

import json

import pytest
from django.core import mail

from jobs.models import JobState
from monitoring.models import Alert, AlertScope, AlertStatus, Delivery, DeliveryStatus
from monitoring.services import delivery_attempt
from tests.api_support import assert_problem
from tests.factories import UserFactory

HOOK = "/hooks/alertmanager"
TOKEN = "alertmanager-token-for-tests"

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _receiver_on(settings):
    settings.ALERTMANAGER_TOKEN = TOKEN


def alert(name="GpuMemoryHigh", status="firing", fingerprint="a1b2c3d4e5f60718", starts="2026-12-02T10:00:00.123456789Z",
          ends="0001-01-01T00:00:00Z", **labels) -> dict:  # fmt: skip
    return {
        "status": status,
        "labels": {"alertname": name, "severity": "warning", "scope": "job", **labels},
        "annotations": {"summary": f"{name} summary", "runbook": "Do the right thing."},
        "startsAt": starts,
        "endsAt": ends,
        "generatorURL": "http://prometheus/graph",
        "fingerprint": fingerprint,
    }


def post(client, *alerts: dict, token: str = TOKEN):
    """The message as Alertmanager posts it; then the deliveries it made, as the worker's task
    would send them after the commit (these tests run inside one transaction, and no worker)."""
    response = _post(client, *alerts, token=token)
    for delivery_id in Delivery.objects.filter(status=DeliveryStatus.PENDING).values_list("pk", flat=True):
        delivery_attempt(delivery_id=delivery_id)
    return response


def _post(client, *alerts: dict, token: str):
    body = {"version": "4", "status": alerts[0]["status"] if alerts else "firing", "receiver": "portal",
            "groupLabels": {}, "commonLabels": {}, "commonAnnotations": {}, "externalURL": "http://am",
            "groupKey": "{}:{}", "truncatedAlerts": 0, "alerts": list(alerts)}  # fmt: skip
    return client.post(HOOK, json.dumps(body), content_type="application/json",
                       HTTP_AUTHORIZATION=f"Bearer {token}")  # fmt: skip


@pytest.fixture
def running(make_job, member):
    """A RUNNING job of protein-lab on the cluster "local" with Slurm-like id 4242, submitted by
    member (who has a mail address)."""
    member.email = "member@lab.example"
    member.save()
    return make_job(member, state=JobState.RUNNING, backend_id="4242", holds_gpus=True)


def test_the_receiver_is_off_without_a_token_setting(client, settings):
    settings.ALERTMANAGER_TOKEN = None
    assert post(client, alert()).status_code == 404


@pytest.mark.parametrize("token", ["wrong", ""])
def test_the_receiver_refuses_a_post_without_the_token(client, token):
    assert_problem(post(client, alert(), token=token), 401, "not_authenticated")
    assert not Alert.objects.exists()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"version": "3", "alerts": []}, "version"),
        ({"version": "4", "alerts": [{"status": "firing"}]}, "alerts.0.labels"),
        ({"version": "4", "alerts": [alert(fingerprint="not hex!")]}, "alerts.0.fingerprint"),
        ({"version": "4", "alerts": [alert(status="burning")]}, "alerts.0.status"),
        ({"version": "4", "alerts": [alert() | {"labels": {"severity": "warning"}}]}, "alerts.0.labels"),
        ({"version": "4", "alerts": [alert() | {"labels": {"alertname": 5}}]}, "alerts.0.labels"),
        ({"version": "4", "alerts": [alert(starts="yesterday")]}, "alerts.0.startsAt"),
    ],
)
def test_a_bad_message_is_a_400_naming_the_field(client, body, field):
    response = client.post(HOOK, json.dumps(body), content_type="application/json",
                           HTTP_AUTHORIZATION=f"Bearer {TOKEN}")  # fmt: skip
    problem = assert_problem(response, 400, "invalid")
    assert field in problem["errors"], problem


def test_a_job_alert_reaches_its_tenant_and_submitter_once_and_its_resolution_too(
    client, running, owner, manager, viewer, tenant
):
    owner.email, manager.email, viewer.email = (
        "owner@lab.example",
        "manager@lab.example",
        "viewer@lab.example",
    )
    for user in (owner, manager, viewer):
        user.save()
    firing = alert(hpc_job="4242", cluster="local", gpu="0", Hostname="node-1")
    answer = post(client, firing)
    assert answer.status_code == 200, answer.content
    assert answer.json() == {"new": 1, "repeated": 0, "resolved": 0, "deliveries": 1}
    kept = Alert.objects.get()
    assert (kept.scope, kept.tenant, kept.job_id, kept.status) == (
        AlertScope.JOB,
        tenant,
        running.pk,
        "firing",
    )
    assert kept.starts_at.isoformat() == "2026-12-02T10:00:00.123456+00:00"
    assert kept.ends_at is None and kept.cluster.slug == "local"
    [sent] = mail.outbox
    assert sorted(sent.to) == ["manager@lab.example", "member@lab.example", "owner@lab.example"]  # no viewer
    assert sent.subject == "[FIRING:1] GpuMemoryHigh (protein-lab)"
    assert "GpuMemoryHigh summary" in sent.body and "Do the right thing." in sent.body
    assert f"/t/protein-lab/jobs/{running.pk}/" in sent.body

    # Alertmanager repeats it every group_interval while it fires: counted, not sent again.
    assert post(client, firing).json() == {"new": 0, "repeated": 1, "resolved": 0, "deliveries": 0}
    assert len(mail.outbox) == 1
    kept.refresh_from_db()
    assert kept.times_received == 2

    resolved = firing | {"status": "resolved", "endsAt": "2026-12-02T10:20:00Z"}
    assert post(client, resolved).json() == {"new": 0, "repeated": 0, "resolved": 1, "deliveries": 1}
    kept.refresh_from_db()
    assert kept.status == AlertStatus.RESOLVED and kept.ends_at.isoformat() == "2026-12-02T10:20:00+00:00"
    assert mail.outbox[1].subject == "[RESOLVED:1] GpuMemoryHigh (protein-lab)"
    assert "resolved" in mail.outbox[1].body
    assert post(client, resolved).json()["deliveries"] == 0  # a resolution is told once


def test_alerts_of_one_message_go_out_together_per_tenant(client, running, owner):
    owner.email = "owner@lab.example"
    owner.save()
    gpus = [alert(hpc_job="4242", cluster="local", gpu=str(n), fingerprint=f"{n:016x}") for n in range(4)]
    assert post(client, *gpus).json() == {"new": 4, "repeated": 0, "resolved": 0, "deliveries": 1}
    [sent] = mail.outbox
    assert sent.subject == "[FIRING:4] GpuMemoryHigh (protein-lab)"
    assert Delivery.objects.get().alerts.count() == 4


def test_a_kubernetes_pod_names_its_job(client, make_job, member, tenant):
    job = make_job(member, state=JobState.RUNNING, backend_id="protein-lab/train-7")
    post(client, alert(exported_namespace="protein-lab", exported_pod="train-7-x9k2p", namespace="gpu-operator",
                       pod="dcgm-exporter-abcde", cluster="local"))  # fmt: skip
    kept = Alert.objects.get()
    assert (kept.job_id, kept.tenant) == (job.pk, tenant)


def test_an_alert_of_an_unknown_job_or_tenant_goes_to_the_platform_admins(client, running, db):
    admin = UserFactory(username="root-admin", email="root@site.example", is_staff=True, is_superuser=True)
    UserFactory(username="plain-staff", email="staff@site.example", is_staff=True)  # no power: not told
    post(
        client,
        alert(hpc_job="9999", cluster="local", fingerprint="01"),
        alert("GrantNearlySpent", scope="tenant", tenant="no-such-team", fingerprint="02"),
        alert("ClusterUnreachable", scope="platform", cluster="local", fingerprint="03"),
    )
    assert set(Alert.objects.values_list("scope", "tenant")) == {(AlertScope.PLATFORM, None)}
    [sent] = mail.outbox
    assert sent.to == [admin.email]
    assert sent.subject.startswith("[FIRING:3]") and sent.subject.endswith("(platform)")


def test_a_grant_alert_names_its_tenant(client, tenant, owner):
    owner.email = "owner@lab.example"
    owner.save()
    post(client, alert("GrantNearlySpent", scope="tenant", tenant="protein-lab", scenario="ai-training"))
    kept = Alert.objects.get()
    assert (kept.scope, kept.tenant, kept.job) == (AlertScope.TENANT, tenant, None)
    assert mail.outbox[0].to == ["owner@lab.example"]
