"""Webhooks (webhooks/): endpoints through the API, the scan that turns events into deliveries,
signed posts to a real receiver on loopback, retries with backoff, a day of failures disabling
the endpoint (and the mail), redelivery, redirects not followed, rows committed out of id order,
alerts, quota decisions, and the opt-in mail when a job ends."""

import hashlib
import hmac
import json
import threading
import time
from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection, transaction
from django.utils import timezone

from jobs.models import Job, JobState
from jobs.services.common import job_move
from tests.api_support import assert_problem
from tests.factories import TenantFactory
from tests.http_support import loopback_server
from webhooks import services
from webhooks.models import AllowedRange, Delivery, DeliveryStatus, Endpoint

pytestmark = pytest.mark.django_db

SECRETS = {}


def url_of(address: str, path: str = "/hook") -> str:
    return f"http://{address}{path}"


@pytest.fixture
def loopback_allowed(db):
    """An admin allowed loopback, as a site allows its own receivers' network."""
    return AllowedRange.objects.create(cidr="127.0.0.0/8", note="the tests' receivers")


@pytest.fixture
def received():
    """A receiver that records each request and answers as the test sets `answer` (200 first)."""
    state = {"requests": [], "answer": (200, "application/json", b"{}")}

    def answer(request):
        state["requests"].append(request)
        return state["answer"]

    with loopback_server(answer) as address:
        state["address"] = address
        yield state


def make_endpoint(client, address: str, events=("job.state_changed",), slug="protein-lab") -> dict:
    response = client.post(
        f"/api/v1/tenants/{slug}/webhooks/", {"url": url_of(address), "events": list(events)}
    )
    assert response.status_code == 201, response.content
    return response.json()


def moved(job: Job, state: str) -> None:
    job_move(job, state, reason=f"to {state}")
    job.save(update_fields=["state", "reason", "raw_state"])


def verify(request, secret: str, tolerance_s: int = 300) -> dict:
    """What a receiver does (docs/api.md, Webhooks): the signature over "<timestamp>." + body, a
    timestamp within five minutes, then the JSON."""
    timestamp = request.headers["X-Portal-Timestamp"]
    expected = (
        "sha256="
        + hmac.new(secret.encode(), timestamp.encode() + b"." + request.body, hashlib.sha256).hexdigest()
    )
    assert hmac.compare_digest(expected, request.headers["X-Portal-Signature"])
    assert abs(time.time() - int(timestamp)) < tolerance_s
    return json.loads(request.body)


def scan_and_deliver() -> list[Delivery]:
    services.events_scan()
    made = list(Delivery.objects.filter(status=DeliveryStatus.PENDING).order_by("id"))
    for delivery in made:
        services.delivery_attempt(delivery_id=delivery.pk)
    return [Delivery.objects.get(pk=d.pk) for d in made]


def test_an_owner_makes_an_endpoint_whose_secret_is_shown_once(client_for, owner, loopback_allowed, received):
    client = client_for(owner)
    made = make_endpoint(client, received["address"])
    assert made["secret"].startswith("whsec_") and made["events"] == ["job.state_changed"]
    shown = client.get(f"/api/v1/tenants/protein-lab/webhooks/{made['id']}/").json()
    assert "secret" not in shown and shown["url"] == url_of(received["address"])
    listed = client.get("/api/v1/tenants/protein-lab/webhooks/").json()["results"]
    assert [e["id"] for e in listed] == [made["id"]] and "secret" not in listed[0]
    rotated = client.patch(
        f"/api/v1/tenants/protein-lab/webhooks/{made['id']}/", {"rotate_secret": True}
    ).json()
    assert rotated["secret"] != made["secret"] and Endpoint.objects.get().secret == rotated["secret"]


def test_who_may_see_and_keep_endpoints(
    client_for, owner, manager, member, viewer, outsider, loopback_allowed, received
):
    made = make_endpoint(client_for(manager), received["address"])
    for user in (member, viewer):
        assert_problem(
            client_for(user).get("/api/v1/tenants/protein-lab/webhooks/"), 403, "permission_denied"
        )
        assert_problem(
            client_for(user).post("/api/v1/tenants/protein-lab/webhooks/", {"url": "x"}),
            403,
            "permission_denied",
        )
    # another tenant's endpoint answers 404 before its body is read
    assert_problem(client_for(outsider).get("/api/v1/tenants/protein-lab/webhooks/"), 404, "not_found")
    assert_problem(
        client_for(outsider).patch(f"/api/v1/tenants/protein-lab/webhooks/{made['id']}/", {"url": 5}),
        404,
        "not_found",
    )
    assert_problem(client_for(owner).get("/api/v1/tenants/protein-lab/webhooks/999/"), 404, "not_found")


@pytest.mark.parametrize(
    "url, why",
    [
        ("http://127.0.0.1:9/hook", "loopback"),  # no network allowed in this test
        ("https://localhost/hook", "loopback"),
        ("https://169.254.169.254/latest/meta-data/", "link-local"),  # a cloud's metadata service
        ("https://10.1.2.3/hook", "private"),
        ("https://192.168.1.1/hook", "private"),
        ("https://[::1]/hook", "loopback"),
        ("https://[::ffff:127.0.0.1]/hook", "loopback"),  # IPv4 in IPv6
        ("https://100.100.100.200/", "reserved"),  # Alibaba Cloud's metadata, in the shared range
        ("https://0.0.0.0/hook", "reserved"),
        ("https://[::7f00:1]/hook", "loopback"),  # IPv4-compatible 127.0.0.1
        ("https://[64:ff9b::a9fe:a9fe]/", "link-local"),  # NAT64 to 169.254.169.254
        ("https://[::ffff:0:a00:1]/", "private"),  # IPv4-translated 10.0.0.1
        ("https://[2002:7f00:1::1]/", "loopback"),  # 6to4 of 127.0.0.1
        ("https://[fec0::1]/", "reserved"),  # IPv6 site-local
        ("https://224.0.0.1/", "multicast"),
        ("https://192.0.0.8/", "reserved"),  # IANA special purpose, global by Python 3.11's count
        ("https://bücher.invalid/hook", "does not resolve"),  # a non-ASCII name: refused, not a 500
        ("ftp://example.org/hook", "https"),
        ("https://user:pw@example.org/hook", "user or password"),
        ("not a url", "https"),
    ],
)
def test_an_address_of_the_portals_own_network_is_refused_naming_the_url(client_for, owner, url, why):
    body = assert_problem(
        client_for(owner).post("/api/v1/tenants/protein-lab/webhooks/", {"url": url, "events": ["ping"]}),
        400,
        "invalid",
    )
    assert list(body["errors"]) == ["events.0"]  # "ping" is not one to subscribe to
    made = client_for(owner).post(
        "/api/v1/tenants/protein-lab/webhooks/", {"url": url, "events": ["grant.ended"]}
    )
    body = assert_problem(made, 400, "invalid")
    assert list(body["errors"]) == ["url"]
    message = body["errors"]["url"][0]
    assert why in message or (
        why in ("loopback", "private", "link-local", "reserved", "multicast") and "address" in message
    )
    assert not Endpoint.objects.exists()


def test_a_job_state_change_is_posted_signed(client_for, owner, member, make_job, loopback_allowed, received):
    made = make_endpoint(client_for(owner), received["address"])
    services.events_scan()  # the first scan starts the cursor at now
    job = make_job(member)
    moved(job, JobState.SUBMITTING)
    (delivery,) = scan_and_deliver()
    assert (delivery.status, delivery.attempts, delivery.response_status) == ("sent", 1, 200)
    (request,) = received["requests"]
    body = verify(request, made["secret"])
    assert (
        body["type"] == "job.state_changed"
        and body["tenant"] == "protein-lab"
        and body["id"] == str(delivery.pk)
    )
    assert body["data"]["job"] | {"at": None} == {
        "id": str(job.pk), "name": job.name, "from_state": "QUEUED", "state": "SUBMITTING", "reason": "to SUBMITTING",
        "at": None, "exit_code": None,
    }  # fmt: skip
    assert request.headers["X-Portal-Event"] == "job.state_changed"
    assert body["event_id"] == f"job_event:{job.events.latest('id').pk}"  # the same in every delivery of it
    # a second scan makes nothing more, and another tenant's events go to no one of this tenant
    assert services.events_scan() == 0
    others = make_job(member)
    Job.objects.filter(pk=others.pk).update(tenant=TenantFactory(slug="another-team"))
    moved(Job.objects.get(pk=others.pk), JobState.SUBMITTING)
    assert services.events_scan() == 0 and len(received["requests"]) == 1


def test_a_failing_receiver_is_retried_with_backoff_then_a_day_disables_it_and_mails(
    client_for,
    owner,
    manager,
    member,
    make_job,
    loopback_allowed,
    received,
    mailoutbox,
    django_capture_on_commit_callbacks,
):
    made = make_endpoint(client_for(owner), received["address"])
    services.events_scan()
    received["answer"] = (500, "text/plain", b"down")
    moved(make_job(member), JobState.SUBMITTING)
    services.events_scan()
    delivery = Delivery.objects.get()
    waits = []
    for _ in range(3):
        Delivery.objects.filter(pk=delivery.pk).update(next_attempt_at=timezone.now())
        waits.append(services.delivery_attempt(delivery_id=delivery.pk))
    assert waits == [30, 60, 120]  # 30 s, then doubling
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts, delivery.response_status, delivery.last_error) == (
        "pending",
        3,
        500,
        "answered HTTP 500",
    )
    assert not services.delivery_attempt(delivery_id=delivery.pk)  # not due yet: nothing sent
    assert len(received["requests"]) == 3
    endpoint = Endpoint.objects.get(pk=made["id"])
    assert endpoint.failing_since is not None and endpoint.enabled
    # a day of failures: the next one disables it and tells the owners and managers
    Endpoint.objects.filter(pk=endpoint.pk).update(
        failing_since=timezone.now() - timedelta(hours=24, minutes=1)
    )
    Delivery.objects.filter(pk=delivery.pk).update(next_attempt_at=timezone.now())
    with django_capture_on_commit_callbacks(execute=True):
        assert services.delivery_attempt(delivery_id=delivery.pk) is None
    endpoint.refresh_from_db()
    assert not endpoint.enabled and "every delivery failed since" in endpoint.disabled_reason
    assert Delivery.objects.get(pk=delivery.pk).status == "failed"
    (mail,) = mailoutbox
    assert sorted(mail.to) == ["manager@example.org", "owner@example.org"] and "disabled" in mail.subject
    # enabled again: the failing day is forgotten; a redelivery goes through
    client = client_for(owner)
    assert client.patch(f"/api/v1/tenants/protein-lab/webhooks/{made['id']}/", {"enabled": True}).json()[
        "enabled"
    ]
    received["answer"] = (200, "application/json", b"{}")
    again = client.post(
        f"/api/v1/tenants/protein-lab/webhooks/{made['id']}/deliveries/{delivery.pk}/redeliver/"
    )
    assert again.status_code == 202 and again.json()["redelivery_of"] == str(delivery.pk)
    services.delivery_attempt(delivery_id=int(again.json()["id"]))
    log = client.get(f"/api/v1/tenants/protein-lab/webhooks/{made['id']}/deliveries/").json()["results"]
    assert [(d["id"], d["status"]) for d in log] == [
        (again.json()["id"], "sent"),
        (str(delivery.pk), "failed"),
    ]
    assert verify(received["requests"][-1], made["secret"])["data"]["job"]["state"] == "SUBMITTING"
    # removed with its log, the redelivery included
    assert client.delete(f"/api/v1/tenants/protein-lab/webhooks/{made['id']}/").status_code == 204
    assert not Delivery.objects.exists()


def test_retries_stop_after_a_day(client_for, owner, member, make_job, loopback_allowed, received):
    make_endpoint(client_for(owner), received["address"])
    services.events_scan()
    received["answer"] = (503, "text/plain", b"")
    moved(make_job(member), JobState.SUBMITTING)
    services.events_scan()
    Delivery.objects.update(created=timezone.now() - timedelta(hours=23, minutes=59, seconds=50))
    assert (
        services.delivery_attempt(delivery_id=Delivery.objects.get().pk) is None
    )  # the next would be past the day
    assert Delivery.objects.get().status == "failed"


def test_a_redirect_is_an_answer_not_followed(
    client_for, owner, member, make_job, loopback_allowed, received
):
    make_endpoint(client_for(owner), received["address"])
    services.events_scan()
    received["answer"] = (302, "text/plain", b"")  # wherever it would lead, the portal does not go
    moved(make_job(member), JobState.SUBMITTING)
    (delivery,) = scan_and_deliver()
    assert (delivery.status, delivery.last_error) == ("pending", "answered HTTP 302")
    assert len(received["requests"]) == 1


def test_an_allowed_range_removed_stops_deliveries_there(
    client_for, owner, member, make_job, loopback_allowed, received
):
    """Checked again at each post: the address a name resolves to, the admin's ranges."""
    make_endpoint(client_for(owner), received["address"])
    services.events_scan()
    loopback_allowed.delete()
    moved(make_job(member), JobState.SUBMITTING)
    (delivery,) = scan_and_deliver()
    assert "loopback" in delivery.last_error and received["requests"] == []


@pytest.mark.django_db(transaction=True)
def test_an_event_committed_after_a_later_one_is_still_delivered(
    client_for, owner, member, make_job, loopback_allowed, received
):
    """Ids are taken at insert, rows appear at commit: a scan between the two commits passes over
    the first; the gap it noted brings it in at the next scan."""
    make_endpoint(client_for(owner), received["address"])
    services.events_scan()
    first, second = make_job(member), make_job(member)
    inserted, release = threading.Event(), threading.Event()

    def slow_writer():
        try:
            with transaction.atomic():
                moved(Job.objects.get(pk=first.pk), JobState.SUBMITTING)
                inserted.set()
                release.wait(10)
        finally:
            connection.close()  # this thread's: else the test database's teardown waits on it

    writer = threading.Thread(target=slow_writer)
    writer.start()
    assert inserted.wait(10)
    moved(second, JobState.SUBMITTING)  # a higher id, committed first
    services.events_scan()
    assert [d.payload["data"]["job"]["id"] for d in Delivery.objects.all()] == [str(second.pk)]
    release.set()
    writer.join(10)
    services.events_scan()
    assert sorted(d.payload["data"]["job"]["id"] for d in Delivery.objects.all()) == sorted(
        [str(first.pk), str(second.pk)]
    )


def test_quota_decisions_and_alerts_are_delivered(
    client_for, owner, admin_user, loopback_allowed, received, catalog
):
    from monitoring.services import IncomingAlert, alerts_receive
    from tenants.services import quota_request_approve
    from tests.api_support import request_body

    made = make_endpoint(
        client_for(owner), received["address"], events=("quota.decided", "alert.firing", "alert.resolved")
    )
    services.events_scan()
    request_id = client_for(owner).post("/api/v1/quota-requests/", request_body()).json()["id"]
    from tenants.models import QuotaRequest

    quota_request_approve(actor=admin_user, request=QuotaRequest.objects.get(pk=request_id), note="ok")
    labels = {
        "alertname": "GpuTemperatureHigh",
        "scope": "tenant",
        "tenant": "protein-lab",
        "severity": "warning",
    }
    start = timezone.now()
    alerts_receive([IncomingAlert("fp1", "firing", labels, {"summary": "hot"}, start, None)])
    alerts_receive([IncomingAlert("fp1", "resolved", labels, {"summary": "hot"}, start, timezone.now())])
    scan_and_deliver()
    bodies = [verify(r, made["secret"]) for r in received["requests"]]
    assert sorted(b["type"] for b in bodies) == ["alert.firing", "alert.resolved", "quota.decided"]
    decided = next(b for b in bodies if b["type"] == "quota.decided")["data"]["quota_request"]
    assert (decided["id"], decided["decision"]) == (str(request_id), "approved")


def test_mail_when_a_job_ends_only_for_who_asked(
    client_for, member, owner, make_job, mailoutbox, django_capture_on_commit_callbacks
):
    client = client_for(member)
    assert client.get("/api/v1/me/notifications/").json() == {"job_end_mail": False}
    assert client.put("/api/v1/me/notifications/", {"job_end_mail": True}).json() == {"job_end_mail": True}
    assert_problem(client.put("/api/v1/me/notifications/", {"job_end_mail": "yes"}), 400, "invalid")
    services.events_scan()
    mine, theirs = make_job(member), make_job(owner)
    for job in (mine, theirs):
        moved(job, JobState.SUBMITTING)
        moved(job, JobState.PENDING)
        moved(job, JobState.RUNNING)
        moved(job, JobState.FAILED)
    with django_capture_on_commit_callbacks(execute=True):
        services.events_scan()
    (mail,) = mailoutbox
    assert mail.to == ["member@example.org"] and f"#{mine.pk}" in mail.subject and "FAILED" in mail.subject
    assert f"/t/protein-lab/jobs/{mine.pk}/" in mail.body


def test_a_grant_ending_soon_is_delivered(client_for, owner, grant, loopback_allowed, received):
    from tenants.services import grants_remind_ending

    made = make_endpoint(client_for(owner), received["address"], events=("grant.ending", "grant.ended"))
    services.events_scan()
    assert grants_remind_ending(today=grant.ends_on - timedelta(days=3)) == 1
    scan_and_deliver()
    (body,) = [verify(r, made["secret"]) for r in received["requests"]]
    assert body["type"] == "grant.ending"
    assert body["data"]["grant"] | {"id": None} == {
        "id": None, "ends_on": grant.ends_on.isoformat(), "days_left": 3,
        "scenario": grant.scenario.slug, "gpu_model": grant.gpu_model.slug,
    }  # fmt: skip


def test_a_budget_threshold_is_delivered(client_for, owner, member, tenant, catalog, make_job, loopback_allowed,
                                         received):  # fmt: skip
    from billing.models import Budget
    from billing.pricing import month_start
    from jobs.budgets import budgets_notify
    from tests.budgets_support import priced

    made = make_endpoint(client_for(owner), received["address"], events=("budget.threshold",))
    services.events_scan()
    priced(catalog[1])
    budget = Budget.objects.create(tenant=tenant, period="month", amount=Decimal(100), hard=True)
    make_job(member, reserved_gpu_hours=Decimal(8))  # 80.00 of 100.00
    assert budgets_notify() == 1
    scan_and_deliver()
    (body,) = [verify(r, made["secret"]) for r in received["requests"]]
    assert body["type"] == "budget.threshold" and body["tenant"] == "protein-lab"
    assert body["data"]["budget"] == {
        "id": str(budget.pk), "threshold": 80, "period": "month", "grant": None, "amount": "100.00",
        "spent": "80.00", "currency": "CNY", "period_start": month_start(timezone.localdate()).isoformat(),
    }  # fmt: skip


def test_a_urls_query_is_never_shown_back(client_for, owner, web, loopback_allowed, received):
    made = (
        client_for(owner)
        .post(
            "/api/v1/tenants/protein-lab/webhooks/",
            {"url": f"http://{received['address']}/hook?key=SUPERSECRET", "events": ["grant.ended"]},
        )
        .json()
    )
    assert made["url"] == f"http://{received['address']}/hook"
    assert (
        "SUPERSECRET" not in client_for(owner).get("/api/v1/tenants/protein-lab/webhooks/").content.decode()
    )
    page = web(owner).get("/t/protein-lab/webhooks/").content.decode()
    assert (
        f"http://{received['address']}/hook" in page
        and "SUPERSECRET" not in page
        and made["secret"] not in page
    )


def test_two_failures_at_once_disable_once_and_mail_once(
    client_for, owner, loopback_allowed, received, mailoutbox, django_capture_on_commit_callbacks
):
    """Each failing delivery read the endpoint before the other disabled it."""
    made = make_endpoint(client_for(owner), received["address"])
    long_ago = timezone.now() - timedelta(days=2)
    Endpoint.objects.filter(pk=made["id"]).update(failing_since=long_ago)
    first, second = Endpoint.objects.get(pk=made["id"]), Endpoint.objects.get(pk=made["id"])
    with django_capture_on_commit_callbacks(execute=True):
        assert services.endpoint_failed(first, timezone.now()) is False
        assert services.endpoint_failed(second, timezone.now()) is False
    assert len(mailoutbox) == 1
    from portal.core.models import AuditEvent

    assert AuditEvent.objects.filter(action="webhook.disable").count() == 1
    # re-enabled meanwhile: a failure read before that does not disable it again
    Endpoint.objects.filter(pk=made["id"]).update(enabled=True, failing_since=None, disabled_reason="")
    assert services.endpoint_failed(second, timezone.now()) is True
    assert Endpoint.objects.get(pk=made["id"]).enabled
