"""A tenant's webhook endpoints and their deliveries, the places allowed beside public addresses,
the cursors of the event scan, and who wants mail when their job ends (docs/architecture.md,
Webhooks)."""

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _

from portal.core.fields import EncryptedTextField
from tenants.models import Tenant


class EventType(models.TextChoices):
    JOB_STATE = "job.state_changed", _("A job changed state")
    QUOTA_DECIDED = "quota.decided", _("A quota request was decided")
    GRANT_ENDING = "grant.ending", _("A grant ends soon (7 days and 1 day before)")
    GRANT_ENDED = "grant.ended", _("A grant ended")
    BUDGET_THRESHOLD = "budget.threshold", _("A budget passed 50, 80 or 100 %")
    ALERT_FIRING = "alert.firing", _("An alert fires")
    ALERT_RESOLVED = "alert.resolved", _("An alert was resolved")
    PING = "ping", _("A test delivery")


class Endpoint(models.Model):
    """Where a tenant's events are posted. The URL and the signing secret are encrypted at rest;
    the secret is shown once, when it is made."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="webhook_endpoints")
    url = EncryptedTextField()
    secret = EncryptedTextField()
    description = models.CharField(max_length=200, blank=True)
    events = models.JSONField(default=list)  # EventType values, at least one
    enabled = models.BooleanField(default=True)
    disabled_reason = models.CharField(max_length=200, blank=True)
    # Since when every delivery has failed (None: the last one went); a day of it disables it.
    failing_since = models.DateTimeField(null=True, blank=True)
    created = models.DateTimeField(auto_now_add=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )

    class Meta:
        ordering = ["tenant_id", "id"]

    def __str__(self) -> str:
        return f"{self.tenant_id}: webhook {self.pk}"

    @property
    def shown_url(self) -> str:
        """The URL as pages and the API show it: without its query, where a receiver's key may be."""
        return self.url.split("?", 1)[0].split("#", 1)[0]


class DeliveryStatus(models.TextChoices):
    PENDING = "pending", _("Pending")
    SENT = "sent", _("Sent")
    FAILED = "failed", _("Failed")


class Delivery(models.Model):
    """One event for one endpoint: its body as it is signed and sent, and every attempt's outcome."""

    endpoint = models.ForeignKey(Endpoint, on_delete=models.CASCADE, related_name="deliveries")
    event_type = models.CharField(max_length=32, choices=EventType.choices)
    event_key = models.CharField(
        max_length=64
    )  # the source row: "job_event:4711", "audit:12", "alert:3:firing"
    payload = models.JSONField()
    status = models.CharField(max_length=8, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    response_status = models.PositiveIntegerField(null=True, blank=True)
    last_error = models.CharField(max_length=300, blank=True)
    created = models.DateTimeField(auto_now_add=True)
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    # CASCADE: set to null, a redelivery would become a second "first" delivery of its event
    # (the constraint below); they go together, with their endpoint.
    redelivery_of = models.ForeignKey(
        "self", on_delete=models.CASCADE, null=True, blank=True, related_name="+"
    )

    class Meta:
        ordering = ["-id"]
        constraints = [
            # The scan may read an event twice (a gap filled late, a retried task): one delivery each.
            models.UniqueConstraint(
                fields=["endpoint", "event_key"],
                condition=Q(redelivery_of=None),
                name="webhook_delivery_once",
            )
        ]
        indexes = [
            models.Index(fields=["endpoint", "-id"], name="webhook_delivery_recent"),
            models.Index(
                fields=["next_attempt_at"], condition=Q(status="pending"), name="webhook_delivery_due"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.event_type} → {self.endpoint_id} ({self.status})"


class AllowedRange(models.Model):
    """A network that deliveries may reach although it is not public (a site's own receivers on
    its private network): platform admins add them in the console. Loopback included, if named."""

    cidr = models.CharField(max_length=64, unique=True, help_text=_("A network, e.g. 10.20.0.0/16"))
    note = models.CharField(max_length=200, blank=True)
    created = models.DateTimeField(auto_now_add=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )

    class Meta:
        ordering = ["cidr"]
        verbose_name = _("allowed webhook network")

    def __str__(self) -> str:
        return self.cidr


class ScanCursor(models.Model):
    """How far the event scan has read a source (its rows' ids), and the ids below that it skipped
    because they were not committed yet when it read (id → when first missed), re-read until
    they appear or EVENTS_GAP_WAIT_S passes."""

    source = models.CharField(max_length=32, unique=True)
    position = models.BigIntegerField(default=0)
    gaps = models.JSONField(default=dict)

    def __str__(self) -> str:
        return f"{self.source} at {self.position}"


class JobEndMail(models.Model):
    """A user who asked for a mail when each of their jobs ends."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="job_end_mail"
    )
    enabled = models.BooleanField(default=False)

    def __str__(self) -> str:
        return f"{self.user_id}: {'on' if self.enabled else 'off'}"
