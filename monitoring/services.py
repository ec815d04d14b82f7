"""Alerts from Alertmanager: kept, mapped to the tenant they concern, and notified
(docs/architecture.md, Monitoring; deploy/prometheus/README.md).

One webhook message holds a group of alerts. Each is one row per firing (fingerprint and
start): a repeat of one that fires already only counts (grouped, no new notification); its
resolution closes it and is notified. What is new in the message is notified per tenant (or the
platform) and event, in one notification per destination: one mail to the tenant's owners and
managers and the jobs' submitters (platform admins for the platform), one post to each of the
tenant's chat robots and webhooks whose minimum severity the alerts reach. Deliveries are sent
by a task after the commit, each with its retries (monitoring.tasks.deliver_alerts)."""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime

from django.conf import settings
from django.db import IntegrityError, transaction
from django.dispatch import Signal
from django.utils import timezone

from clusters.gpu_metrics import backend_ids_named
from clusters.models import Cluster
from jobs.models import Job
from monitoring.models import (
    SEVERITY_RANK,
    Alert,
    AlertChannel,
    AlertScope,
    AlertStatus,
    Delivery,
    DeliveryKind,
    DeliveryStatus,
    Severity,
)
from monitoring.notify import DeliveryError, deliver
from portal.core.errors import Invalid
from portal.core.services import audit_record
from tenants.models import Tenant
from tenants.selectors import platform_admin_emails, tenant_manager_emails

log = logging.getLogger(__name__)


# Sent for each tenant's (or the platform's: tenant_id None) new firing or resolution, with the
# alerts, inside the receiver's transaction: the webhooks app delivers them to its endpoints.
alert_news = Signal()


@dataclass(frozen=True)
class IncomingAlert:
    """One alert of an Alertmanager message, as its webhook sends it (validated)."""

    fingerprint: str
    status: str
    labels: dict[str, str]
    annotations: dict[str, str]
    starts_at: datetime
    ends_at: datetime | None


@dataclass
class ReceiveReport:
    new: list[int] = field(default_factory=list)
    repeated: list[int] = field(default_factory=list)
    resolved: list[int] = field(default_factory=list)
    deliveries: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class Target:
    scope: str
    tenant: Tenant | None
    job: Job | None
    cluster: Cluster | None


def alert_target(labels: dict[str, str]) -> Target:
    """Whom an alert concerns. `scope` job: the job the labels name (hpc_job, or namespace and
    pod) on the labelled cluster, and so its tenant; `scope` tenant: the tenant the `tenant`
    label names. Anything not found (an unknown job, a tenant that is gone, no scope) is the
    platform's: its admins hear of it rather than nobody."""
    cluster = (
        Cluster.objects.filter(slug=labels.get("cluster", "")).first() if labels.get("cluster") else None
    )
    scope = labels.get("scope", "")
    if scope == AlertScope.JOB:
        candidates = backend_ids_named(labels)
        jobs = Job.objects.filter(backend_id__in=candidates).select_related("tenant")
        if cluster is not None:
            jobs = jobs.filter(cluster=cluster)
        # A scheduler's job ids come round again: the latest job that held the id.
        job = jobs.order_by("-submitted_at", "-id").first() if candidates else None
        if job is not None:
            return Target(AlertScope.JOB, job.tenant, job, cluster or job.cluster)
    elif scope == AlertScope.TENANT:
        tenant = Tenant.objects.filter(slug=labels.get("tenant", "")).first()
        if tenant is not None:
            return Target(AlertScope.TENANT, tenant, None, cluster)
    return Target(AlertScope.PLATFORM, None, None, cluster)


def _severity(labels: dict[str, str]) -> str:
    return labels.get("severity") if labels.get("severity") in Severity.values else Severity.WARNING


def alerts_receive(incoming: list[IncomingAlert]) -> ReceiveReport:
    """Keep the alerts of one message and send what is new to whom it concerns."""
    report = ReceiveReport()
    news: dict[tuple[int | None, str], list[Alert]] = defaultdict(list)  # (tenant, event) → alerts
    now = timezone.now()
    with transaction.atomic():
        for item in incoming:
            alert = (
                Alert.objects.select_for_update()
                .filter(fingerprint=item.fingerprint, starts_at=item.starts_at)
                .first()
            )
            if alert is None:
                alert = _create(item, now=now)
                report.new.append(alert.pk)
                if item.status == AlertStatus.FIRING:
                    news[(alert.tenant_id, AlertStatus.FIRING)].append(alert)
                continue
            if item.status == AlertStatus.RESOLVED and alert.status == AlertStatus.FIRING:
                alert.status, alert.ends_at = AlertStatus.RESOLVED, item.ends_at or now
                report.resolved.append(alert.pk)
                news[(alert.tenant_id, AlertStatus.RESOLVED)].append(alert)
            elif item.status == AlertStatus.FIRING and alert.status == AlertStatus.RESOLVED:
                alert.status, alert.ends_at = AlertStatus.FIRING, None  # fires again
                news[(alert.tenant_id, AlertStatus.FIRING)].append(alert)
            else:
                report.repeated.append(alert.pk)
            alert.times_received += 1
            alert.received_last = now
            alert.save(update_fields=["status", "ends_at", "times_received", "received_last"])
        for (tenant_id, event), alerts in news.items():
            report.deliveries += _deliveries(tenant_id, event, alerts)
            # Apps above this one hear of it too (webhooks): in this transaction, after the rows.
            alert_news.send(sender=Alert, tenant_id=tenant_id, event=event, alerts=alerts)
        if report.deliveries:
            from monitoring.tasks import deliver_alerts

            ids = list(report.deliveries)
            transaction.on_commit(lambda: [deliver_alerts.delay(delivery_id=pk) for pk in ids])
    return report


def _create(item: IncomingAlert, *, now: datetime) -> Alert:
    target = alert_target(item.labels)
    resolved = item.status == AlertStatus.RESOLVED
    return Alert.objects.create(
        fingerprint=item.fingerprint,
        starts_at=item.starts_at,
        ends_at=(item.ends_at or now) if resolved else None,
        name=item.labels.get("alertname", "")[:200],
        status=item.status,
        severity=_severity(item.labels),
        scope=target.scope,
        tenant=target.tenant,
        job=target.job,
        cluster=target.cluster,
        summary=item.annotations.get("summary", "")[:2000],
        runbook=item.annotations.get("runbook", "")[:2000],
        labels=item.labels,
        received_last=now,
    )


def _title(event: str, alerts: list[Alert], tenant: Tenant | None) -> str:
    names = ", ".join(sorted({alert.name for alert in alerts}))
    where = tenant.slug if tenant is not None else "platform"
    return f"[{event.upper()}:{len(alerts)}] {names} ({where})"[:300]


def _deliveries(tenant_id: int | None, event: str, alerts: list[Alert]) -> list[int]:
    """The notifications of one group: a mail where it has recipients, and a post to each of
    the tenant's enabled channels whose minimum severity the group reaches."""
    tenant = alerts[0].tenant
    if tenant is not None:
        submitters = {
            alert.job.submitted_by.email
            for alert in alerts
            if alert.job
            and alert.job.submitted_by
            and alert.job.submitted_by.is_active
            and alert.job.submitted_by.email
        }
        recipients = sorted(set(tenant_manager_emails(tenant=tenant)) | submitters)
        channels = [
            channel
            for channel in AlertChannel.objects.filter(tenant=tenant, enabled=True)
            if SEVERITY_RANK[channel.min_severity] <= max(SEVERITY_RANK[a.severity] for a in alerts)
        ]
    else:
        recipients, channels = platform_admin_emails(), []
    title = _title(event, alerts, tenant)
    made = []
    if recipients:
        made.append(
            Delivery.objects.create(
                tenant_id=tenant_id, kind=DeliveryKind.MAIL, event=event, recipients=recipients, title=title
            )
        )
    for channel in channels:
        made.append(
            Delivery.objects.create(
                tenant_id=tenant_id, channel=channel, kind=channel.kind, event=event, title=title
            )
        )
    for delivery in made:
        delivery.alerts.set(alerts)
    return [delivery.pk for delivery in made]


def delivery_attempt(*, delivery_id: int) -> bool | None:
    """One attempt at a delivery, counted and logged in its row: True sent, False to be tried
    again, None nothing to do (sent already, or every attempt spent: FAILED)."""
    with transaction.atomic():
        delivery = (
            Delivery.objects.select_for_update(of=("self",))
            .select_related("channel", "tenant")
            .filter(pk=delivery_id, status=DeliveryStatus.PENDING)
            .first()
        )
        if delivery is None:
            return None
        delivery.attempts += 1
        try:
            deliver(delivery)
        except DeliveryError as exc:
            delivery.last_error = str(exc)[:500]
            spent = delivery.attempts >= settings.ALERT_DELIVERY_ATTEMPTS
            delivery.status = DeliveryStatus.FAILED if spent else DeliveryStatus.PENDING
            log.warning(
                "alert delivery %s (%s), attempt %s: %s", delivery.pk, delivery.kind, delivery.attempts, exc
            )
            delivery.save(update_fields=["attempts", "last_error", "status"])
            return None if spent else False
        delivery.status, delivery.sent_at, delivery.last_error = DeliveryStatus.SENT, timezone.now(), ""
        delivery.save(update_fields=["attempts", "last_error", "status", "sent_at"])
    return True


# --- A tenant's channels (its owners and managers keep them; each change is audited, without
# the URL or the secret)


DUPLICATE_CHANNEL_NAME = "Another alert channel of this team has this name."


def alert_channel_create(*, actor, tenant: Tenant, **fields) -> AlertChannel:
    """A channel of the tenant; a name the tenant already uses is a 400 on `name`."""
    try:
        with transaction.atomic():
            channel = AlertChannel.objects.create(tenant=tenant, created_by=actor, **fields)
            audit_record(actor=actor, action="alert_channel.create", target=channel, tenant=tenant,
                         data={"name": channel.name, "kind": channel.kind})  # fmt: skip
    except IntegrityError:  # alert_channel_name_per_tenant: the one unique rule of a channel
        raise Invalid({"name": DUPLICATE_CHANNEL_NAME}) from None
    return channel


def alert_channel_change(*, actor, channel: AlertChannel, **fields) -> AlertChannel:
    try:
        with transaction.atomic():
            for name, value in fields.items():
                setattr(channel, name, value)
            channel.save()
            audit_record(actor=actor, action="alert_channel.change", target=channel, tenant=channel.tenant,
                         data={"fields": sorted(fields)})  # fmt: skip
    except IntegrityError:
        channel.refresh_from_db()
        raise Invalid({"name": DUPLICATE_CHANNEL_NAME}) from None
    return channel


def alert_channel_delete(*, actor, channel: AlertChannel) -> None:
    with transaction.atomic():
        audit_record(actor=actor, action="alert_channel.delete", target=channel, tenant=channel.tenant,
                     data={"name": channel.name, "kind": channel.kind})  # fmt: skip
        channel.delete()
