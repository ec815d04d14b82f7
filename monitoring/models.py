"""Alerts as Alertmanager reported them, the tenants' chat robots and webhooks, and the log of
every notification sent (docs/architecture.md, Monitoring)."""

from django.conf import settings
from django.db import models
from django.utils.translation import gettext_lazy as _

from clusters.models import Cluster
from jobs.models import Job
from portal.core.fields import EncryptedTextField
from tenants.models import Tenant


class AlertStatus(models.TextChoices):
    FIRING = "firing", _("Firing")
    RESOLVED = "resolved", _("Resolved")


class AlertScope(models.TextChoices):
    JOB = "job", _("Job")  # a GPU a job holds: its tenant and its submitter hear of it
    TENANT = "tenant", _("Tenant")  # about the tenant itself (its grant)
    PLATFORM = "platform", _("Platform")  # the site's admins


class Severity(models.TextChoices):
    WARNING = "warning", _("Warning")
    CRITICAL = "critical", _("Critical")


SEVERITY_RANK = {Severity.WARNING: 1, Severity.CRITICAL: 2}


class Alert(models.Model):
    """One firing of one alert: Alertmanager's fingerprint (its label set) and when it started.
    The repeats Alertmanager sends while it fires update this row (times_received); its
    resolution closes it (ends_at). tenant is None for a platform alert."""

    fingerprint = models.CharField(max_length=64)
    starts_at = models.DateTimeField()
    ends_at = models.DateTimeField(null=True, blank=True)
    name = models.CharField(max_length=200)
    status = models.CharField(max_length=16, choices=AlertStatus.choices)
    severity = models.CharField(max_length=16, choices=Severity.choices)
    scope = models.CharField(max_length=16, choices=AlertScope.choices)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, null=True, blank=True, related_name="alerts")
    job = models.ForeignKey(Job, on_delete=models.SET_NULL, null=True, blank=True, related_name="alerts")
    cluster = models.ForeignKey(Cluster, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    summary = models.TextField(blank=True)
    runbook = models.TextField(blank=True)
    labels = models.JSONField(default=dict)
    received_first = models.DateTimeField(auto_now_add=True)
    received_last = models.DateTimeField()
    times_received = models.PositiveIntegerField(default=1)

    class Meta:
        ordering = ["-starts_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["fingerprint", "starts_at"], name="alert_one_per_firing")
        ]
        indexes = [
            models.Index(fields=["tenant", "status", "-starts_at"], name="alert_tenant_status"),
            models.Index(fields=["status", "-starts_at"], name="alert_status"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.status})"


class ChannelKind(models.TextChoices):
    WECOM = "wecom", _("WeCom group robot")
    DINGTALK = "dingtalk", _("DingTalk group robot")
    FEISHU = "feishu", _("Feishu group robot")
    WEBHOOK = "webhook", _("Signed JSON webhook")


class AlertChannel(models.Model):
    """A tenant's chat robot or webhook that its alerts are posted to. The URL (a robot's URL
    holds its key) and the signing secret are encrypted at rest and never shown back."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="alert_channels")
    name = models.CharField(max_length=100)
    kind = models.CharField(max_length=16, choices=ChannelKind.choices)
    url = EncryptedTextField()
    secret = EncryptedTextField(blank=True)
    min_severity = models.CharField(max_length=16, choices=Severity.choices, default=Severity.WARNING)
    enabled = models.BooleanField(default=True)
    created = models.DateTimeField(auto_now_add=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )

    class Meta:
        ordering = ["tenant_id", "name"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="alert_channel_name_per_tenant")
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.get_kind_display()})"


class DeliveryKind(models.TextChoices):
    MAIL = "mail", _("Mail")
    WECOM = ChannelKind.WECOM.value, ChannelKind.WECOM.label
    DINGTALK = ChannelKind.DINGTALK.value, ChannelKind.DINGTALK.label
    FEISHU = ChannelKind.FEISHU.value, ChannelKind.FEISHU.label
    WEBHOOK = ChannelKind.WEBHOOK.value, ChannelKind.WEBHOOK.label


class DeliveryStatus(models.TextChoices):
    PENDING = "pending", _("Pending")  # not yet tried, or to be tried again
    SENT = "sent", _("Sent")
    FAILED = "failed", _("Failed")  # every attempt failed


class Delivery(models.Model):
    """One notification of a group of alerts (those of one Alertmanager message, one tenant or
    the platform, one event) to one destination: a mail to its recipients, or one channel. Each
    attempt is counted; the last error is kept, without the URL."""

    alerts = models.ManyToManyField(Alert, related_name="deliveries")
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, null=True, blank=True, related_name="+")
    channel = models.ForeignKey(
        AlertChannel, on_delete=models.SET_NULL, null=True, blank=True, related_name="deliveries"
    )
    kind = models.CharField(max_length=16, choices=DeliveryKind.choices)
    event = models.CharField(max_length=16, choices=AlertStatus.choices)
    recipients = models.JSONField(default=list, blank=True)  # mail addresses
    title = models.CharField(max_length=300)
    status = models.CharField(max_length=16, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING)
    attempts = models.PositiveSmallIntegerField(default=0)
    last_error = models.TextField(blank=True)
    created = models.DateTimeField(auto_now_add=True)
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created", "-id"]
        indexes = [models.Index(fields=["status", "created"], name="delivery_status")]

    def __str__(self) -> str:
        return f"{self.kind} {self.event}: {self.title}"
