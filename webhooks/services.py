"""Webhooks and the job-end mail (docs/architecture.md, Webhooks): a tenant's endpoints, the scan
that turns new events into deliveries, one attempt at a delivery, redelivery, and disabling an
endpoint that has failed for a day.

Events come from the rows their owners write anyway, read by id like the event stream reads
them (jobs/stream.py): JobEvents (job.state_changed, and the job-end mail), audit events
(quota.decided, grant.ending, grant.ended, budget.threshold); alerts arrive by monitoring's
`alert_news` signal. So no lower app knows of webhooks. An id that a scan passes over because
its row was not committed yet (ids are taken at insert, rows appear at commit) is kept as a gap
and read again for EVENTS_GAP_WAIT_S."""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections import defaultdict
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Max
from django.utils import timezone

from jobs.models import Job, JobEvent
from jobs.services.common import send_after_commit
from jobs.states import END_STATES
from portal.core.errors import Invalid
from portal.core.models import AuditEvent
from portal.core.services import audit_record
from portal.core.tailing import IdTail
from tenants.mail import mail_on_commit
from tenants.models import Tenant
from tenants.selectors import tenant_manager_emails
from webhooks import outbound
from webhooks.models import (
    AllowedRange,
    Delivery,
    DeliveryStatus,
    Endpoint,
    EventType,
    JobEndMail,
    ScanCursor,
)

log = logging.getLogger(__name__)

DELIVER_TASK = "webhooks.tasks.deliver"
# How long an attempt may take before its row is due again: above the delivery task's hard limit.
CLAIM_S = 120
SCAN_LIMIT = 1000
QUOTA_DECISIONS = {"quota_request.approved", "quota_request.partially_approved", "quota_request.rejected"}
AUDITED = {
    **dict.fromkeys(QUOTA_DECISIONS, EventType.QUOTA_DECIDED),
    "grant.ending": EventType.GRANT_ENDING,
    "grant.ended": EventType.GRANT_ENDED,
    "budget.threshold": EventType.BUDGET_THRESHOLD,
}
SUBSCRIBABLE = [t for t in EventType.values if t != EventType.PING]


# --- Endpoints (a tenant's owners and managers keep them; each change is audited, without the
# URL or the secret)


def allowed_networks() -> list:
    """The networks a platform admin allowed: the console's rows and WEBHOOK_ALLOWED_RANGES."""
    cidrs = [*settings.WEBHOOK_ALLOWED_RANGES, *AllowedRange.objects.values_list("cidr", flat=True)]
    return outbound.allowed_networks(cidrs)


def url_problem(url: str) -> str | None:
    try:
        outbound.resolve(url, allowed_networks())
    except outbound.Refused as exc:
        return f"The URL {exc}."
    return None


def _checked(*, url: str | None = None, events: list[str] | None = None) -> None:
    if url is not None and (problem := url_problem(url)):
        raise Invalid({"url": [problem]})
    if events is not None and (not events or any(e not in SUBSCRIBABLE for e in events)):
        raise Invalid({"events": [f"One or more of: {', '.join(SUBSCRIBABLE)}."]})


def endpoint_create(
    *, actor, tenant: Tenant, url: str, events: list[str], description: str = ""
) -> tuple[Endpoint, str]:
    """A new endpoint and its signing secret, returned once here (the API shows it once)."""
    _checked(url=url, events=events)
    secret = "whsec_" + secrets.token_urlsafe(32)
    with transaction.atomic():
        endpoint = Endpoint.objects.create(
            tenant=tenant, url=url, secret=secret, events=sorted(set(events)), description=description,
            created_by=actor,
        )  # fmt: skip
        audit_record(actor=actor, action="webhook.create", target=endpoint, tenant=tenant,
                     data={"events": endpoint.events})  # fmt: skip
    return endpoint, secret


def endpoint_change(
    *, actor, endpoint: Endpoint, rotate_secret: bool = False, **fields
) -> tuple[Endpoint, str | None]:
    """Change what was given; `enabled: true` also forgets a failing day; a new secret if asked
    (returned once)."""
    _checked(url=fields.get("url"), events=fields.get("events"))
    if "events" in fields:
        fields["events"] = sorted(set(fields["events"]))
    secret = ("whsec_" + secrets.token_urlsafe(32)) if rotate_secret else None
    with transaction.atomic():
        for name, value in fields.items():
            setattr(endpoint, name, value)
        if fields.get("enabled"):
            endpoint.failing_since, endpoint.disabled_reason = None, ""
        if secret:
            endpoint.secret = secret
        endpoint.save()
        changed = (
            sorted(set(fields) - {"url"})
            + (["url"] if "url" in fields else [])
            + (["secret"] if secret else [])
        )
        audit_record(actor=actor, action="webhook.change", target=endpoint, tenant=endpoint.tenant,
                     data={"changed": changed})  # fmt: skip
    return endpoint, secret


def endpoint_delete(*, actor, endpoint: Endpoint) -> None:
    with transaction.atomic():
        audit_record(actor=actor, action="webhook.delete", target=endpoint, tenant=endpoint.tenant)
        endpoint.delete()


# --- Deliveries


def _deliveries(endpoints: list[Endpoint], event_type: str, event_key: str, payload: dict) -> list[int]:
    """A pending delivery per endpoint that wants the event (once per event and endpoint)."""
    made = []
    for endpoint in endpoints:
        if not endpoint.enabled or event_type not in endpoint.events:
            continue
        try:
            with transaction.atomic():
                delivery = Delivery.objects.create(
                    endpoint=endpoint, event_type=event_type, event_key=event_key, payload=payload,
                    next_attempt_at=timezone.now(),
                )  # fmt: skip
        except IntegrityError:
            continue  # made by an earlier read of the same event
        made.append(delivery.pk)
        send_after_commit(DELIVER_TASK, delivery_id=delivery.pk)
    return made


def _iso(moment) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def _envelope(event_type: str, event_id: str, tenant_slug: str, data: dict) -> dict:
    """`event_id` names the event, the same in every delivery of it (a retry, a redelivery, to
    each endpoint): what a receiver deduplicates by. The delivery's own `id` is added at send."""
    return {"type": event_type, "event_id": event_id, "created": _iso(timezone.now()), "tenant": tenant_slug,
            "data": data}  # fmt: skip


def redeliver(*, actor, delivery: Delivery) -> Delivery:
    """The same event again, as a new delivery (its log keeps the first)."""
    with transaction.atomic():
        again = Delivery.objects.create(
            endpoint=delivery.endpoint, event_type=delivery.event_type, event_key=delivery.event_key,
            payload=delivery.payload, redelivery_of=delivery, next_attempt_at=timezone.now(),
        )  # fmt: skip
        audit_record(actor=actor, action="webhook.redeliver", target=again, tenant=delivery.endpoint.tenant,
                     data={"of": delivery.pk})  # fmt: skip
        send_after_commit(DELIVER_TASK, delivery_id=again.pk)
    return again


def ping(*, actor, endpoint: Endpoint) -> Delivery:
    """A `ping` delivery to the endpoint, whatever events it takes, to try a receiver."""
    with transaction.atomic():
        key = f"ping:{secrets.token_hex(8)}"
        delivery = Delivery.objects.create(
            endpoint=endpoint, event_type=EventType.PING, event_key=key,
            payload=_envelope(EventType.PING, key, endpoint.tenant.slug, {"endpoint": str(endpoint.pk)}),
            next_attempt_at=timezone.now(),
        )  # fmt: skip
        send_after_commit(DELIVER_TASK, delivery_id=delivery.pk)
    return delivery


def body_of(delivery: Delivery) -> bytes:
    return json.dumps({"id": str(delivery.pk), **delivery.payload}, separators=(",", ":")).encode()


def retry_delay_s(attempts: int) -> int:
    """After the n-th failed attempt: 30 s, 1, 2, 4 … minutes, at most an hour."""
    return min(30 * 2 ** min(attempts - 1, 12), 3600)


def delivery_attempt(*, delivery_id: int) -> float | None:
    """One attempt at a due delivery, logged in its row. Returns seconds until the next attempt
    when it failed and may be tried again, else None (sent, given up, or not due).

    Three steps, so that no row or connection is held while a receiver takes its time: the
    attempt is claimed and counted (committed: a task that dies in the post, at its time limit
    say, has still spent it, and the scan sends the delivery again once the claim passes), then
    the post, then its outcome."""
    claimed = _claim(delivery_id)
    if claimed is None:
        return None
    delivery, url, secret = claimed
    error, status = "", None
    body, timestamp = body_of(delivery), str(int(time.time()))
    headers = {
        outbound.TIMESTAMP_HEADER: timestamp,
        outbound.SIGNATURE_HEADER: outbound.signature(secret, timestamp, body),
        "X-Portal-Event": delivery.event_type,
        "X-Portal-Delivery": str(delivery.pk),
    }
    try:
        status = outbound.post(url, body, headers, allowed_networks())
        if not 200 <= status < 300:
            error = f"answered HTTP {status}"
    except outbound.Refused as exc:
        error = f"the URL {exc}"
    except Exception as exc:  # NoAnswer, the task's soft time limit, anything the post raised
        error = str(exc) if isinstance(exc, outbound.NoAnswer) else f"no answer: {type(exc).__name__}"
    return _outcome(delivery.pk, status, error)


def _claim(delivery_id: int) -> tuple[Delivery, str, str] | None:
    with transaction.atomic():
        delivery = (
            Delivery.objects.select_for_update(of=("self",))
            .select_related("endpoint")
            .filter(pk=delivery_id, status=DeliveryStatus.PENDING)
            .first()
        )
        now = timezone.now()
        if delivery is None or (
            delivery.next_attempt_at and delivery.next_attempt_at > now + timedelta(seconds=1)
        ):
            return None
        if not delivery.endpoint.enabled:
            delivery.status, delivery.next_attempt_at = DeliveryStatus.FAILED, None
            delivery.last_error = "the endpoint is disabled"
            delivery.save(update_fields=["status", "next_attempt_at", "last_error"])
            return None
        delivery.attempts += 1
        delivery.last_attempt_at = now
        delivery.next_attempt_at = now + timedelta(seconds=CLAIM_S)  # a lost attempt's row comes back then
        delivery.save(update_fields=["attempts", "last_attempt_at", "next_attempt_at"])
    return delivery, delivery.endpoint.url, delivery.endpoint.secret


def _outcome(delivery_id: int, status: int | None, error: str) -> float | None:
    with transaction.atomic():
        delivery = (
            Delivery.objects.select_for_update(of=("self",))
            .select_related("endpoint__tenant")
            .get(pk=delivery_id)
        )
        endpoint, now = delivery.endpoint, timezone.now()
        delivery.response_status, delivery.last_error = status, error[:300]
        if not error:
            delivery.status, delivery.delivered_at, delivery.next_attempt_at = DeliveryStatus.SENT, now, None
            delivery.save()
            Endpoint.objects.filter(pk=endpoint.pk).exclude(failing_since=None).update(failing_since=None)
            return None
        log.warning("webhook delivery %s to endpoint %s, attempt %s: %s", delivery.pk, endpoint.pk,
                    delivery.attempts, error)  # fmt: skip
        enabled = endpoint_failed(endpoint, now)
        wait = retry_delay_s(delivery.attempts)
        if enabled and now + timedelta(seconds=wait) < delivery.created + timedelta(
            seconds=settings.WEBHOOK_RETRY_FOR_S
        ):
            delivery.next_attempt_at = now + timedelta(seconds=wait)
            delivery.save()
            return float(wait)
        delivery.status, delivery.next_attempt_at = DeliveryStatus.FAILED, None
        delivery.save()
        return None


def endpoint_failed(endpoint: Endpoint, now) -> bool:
    """The endpoint's deliveries have failed since failing_since: a day of it disables it, and its
    tenant's owners and managers are told by mail. Each change is made only on the row as it was
    read (a success or a re-enable meanwhile wins), so two failing deliveries at once disable it
    and mail once. Returns whether the endpoint is still enabled."""
    if endpoint.failing_since is None:
        Endpoint.objects.filter(pk=endpoint.pk, failing_since=None).update(failing_since=now)
        return endpoint.enabled
    if not endpoint.enabled or now - endpoint.failing_since < timedelta(
        seconds=settings.WEBHOOK_DISABLE_AFTER_S
    ):
        return endpoint.enabled
    reason = f"every delivery failed since {endpoint.failing_since:%Y-%m-%d %H:%M} UTC"
    disabled = Endpoint.objects.filter(
        pk=endpoint.pk, enabled=True, failing_since=endpoint.failing_since
    ).update(enabled=False, disabled_reason=reason)
    if disabled:
        endpoint.enabled = False
        audit_record(actor=None, action="webhook.disable", target=endpoint, tenant=endpoint.tenant,
                     data={"reason": reason})  # fmt: skip
        mail_on_commit(
            template="webhook_disabled",
            to=tenant_manager_emails(tenant=endpoint.tenant),
            context={"tenant": endpoint.tenant, "endpoint": endpoint, "reason": reason},
        )
    return Endpoint.objects.filter(pk=endpoint.pk, enabled=True).exists()


def resend_overdue() -> int:
    """Deliveries whose task was lost (a broker restart, a worker killed mid-post): sent again,
    each at most once every CLAIM_S. Returns how many."""
    now = timezone.now()
    with transaction.atomic():
        ids = list(
            Delivery.objects.select_for_update(skip_locked=True)
            .filter(status=DeliveryStatus.PENDING, next_attempt_at__lt=now - timedelta(seconds=CLAIM_S))
            .values_list("pk", flat=True)[:SCAN_LIMIT]
        )
        Delivery.objects.filter(pk__in=ids).update(next_attempt_at=now)  # due now, overdue again only later
        for pk in ids:
            send_after_commit(DELIVER_TASK, delivery_id=pk)
    return len(ids)


# --- The scan: new events into deliveries (and job-end mail)


def _read(source: str, model) -> list:
    """A source's new rows (and the gaps' rows that appeared since: portal/core/tailing.py) under
    its cursor's lock; the cursor moves in the caller's transaction, with what the rows made."""
    cursor = ScanCursor.objects.select_for_update().filter(source=source).first()
    if cursor is None:  # the first scan starts from now: history is not replayed
        newest = model.objects.aggregate(newest=Max("id"))["newest"] or 0
        ScanCursor.objects.get_or_create(source=source, defaults={"position": newest})
        return []
    tail = IdTail(cursor.position, {int(k): v for k, v in cursor.gaps.items()})
    rows = list(model.objects.filter(tail.wanted()).order_by("id")[:SCAN_LIMIT])
    tail.took([row.pk for row in rows])
    cursor.position, cursor.gaps = tail.position, {str(k): v for k, v in tail.gaps.items()}
    cursor.save(update_fields=["position", "gaps"])
    return rows


def events_scan() -> int:
    """One scan of every source; returns how many deliveries it made."""
    endpoints: dict[int, list[Endpoint]] = defaultdict(list)
    for endpoint in Endpoint.objects.filter(enabled=True).select_related("tenant"):
        endpoints[endpoint.tenant_id].append(endpoint)
    made = 0
    with transaction.atomic():
        made += _job_events(_read("job_event", JobEvent), endpoints)
    with transaction.atomic():
        made += _audit_events(_read("audit", AuditEvent), endpoints)
    resend_overdue()
    return made


def _job_events(rows: list[JobEvent], endpoints: dict[int, list[Endpoint]]) -> int:
    if not rows:
        return 0
    jobs = {
        job.pk: job
        for job in Job.objects.filter(pk__in={r.job_id for r in rows}).select_related(
            "tenant", "submitted_by"
        )
    }
    mail_to = set(
        JobEndMail.objects.filter(
            enabled=True, user_id__in={j.submitted_by_id for j in jobs.values()}
        ).values_list("user_id", flat=True)
    )
    made = 0
    for event in rows:
        job = jobs[event.job_id]
        data = {
            "job": {
                "id": str(job.pk),
                "name": job.name,
                "from_state": event.from_state,
                "state": event.to_state,
                "reason": event.reason,
                "at": _iso(event.at),
                "exit_code": job.exit_code if event.to_state in END_STATES else None,
            }
        }
        key = f"job_event:{event.pk}"
        payload = _envelope(EventType.JOB_STATE, key, job.tenant.slug, data)
        made += len(_deliveries(endpoints.get(job.tenant_id, []), EventType.JOB_STATE, key, payload))
        if event.to_state in END_STATES and job.submitted_by_id in mail_to and job.submitted_by.email:
            mail_on_commit(template="job_ended", to=[job.submitted_by.email],
                           context={"job": job, "state": event.to_state, "reason": event.reason})  # fmt: skip
    return made


def _audit_events(rows: list[AuditEvent], endpoints: dict[int, list[Endpoint]]) -> int:
    made = 0
    for event in rows:
        event_type = AUDITED.get(event.action)
        if event_type is None or event.tenant_id is None:
            continue
        if event_type == EventType.QUOTA_DECIDED:
            data = {
                "quota_request": {
                    "id": event.target_id,
                    "decision": event.action.split(".", 1)[1],
                    **event.data,
                }
            }
        elif event_type == EventType.BUDGET_THRESHOLD:
            data = {"budget": {"id": event.target_id, **event.data}}
        else:
            data = {"grant": {"id": event.target_id, **event.data}}
        key = f"audit:{event.pk}"
        payload = _envelope(event_type, key, event.tenant_slug, data)
        made += len(_deliveries(endpoints.get(event.tenant_id, []), event_type, key, payload))
    return made


def alerts_announced(*, tenant_id: int | None, event: str, alerts: list, **_) -> None:
    """monitoring's alert_news: the tenant's endpoints that take alerts get one delivery each."""
    if tenant_id is None:
        return
    endpoints = list(Endpoint.objects.filter(tenant_id=tenant_id, enabled=True).select_related("tenant"))
    event_type = EventType.ALERT_FIRING if event == "firing" else EventType.ALERT_RESOLVED
    for alert in alerts:
        data = {
            "alert": {
                "id": str(alert.pk),
                "name": alert.name,
                "severity": alert.severity,
                "scope": alert.scope,
                "job": str(alert.job_id) if alert.job_id else None,
                "summary": alert.summary,
                "starts_at": _iso(alert.starts_at),
                "ends_at": _iso(alert.ends_at) if alert.ends_at else None,
            }
        }
        key = f"alert:{alert.pk}:{event}:{int(alert.received_last.timestamp())}"[:64]
        slug = endpoints[0].tenant.slug if endpoints else ""
        _deliveries(endpoints, event_type, key, _envelope(event_type, key, slug, data))


def job_end_mail_set(*, user, enabled: bool) -> JobEndMail:
    choice, _ = JobEndMail.objects.update_or_create(user=user, defaults={"enabled": enabled})
    return choice
