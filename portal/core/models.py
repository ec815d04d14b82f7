import hashlib

from django.conf import settings
from django.db import models


def token_digest(key: str) -> str:
    """SHA-256 of an API key. The key has 256 random bits, so a fast hash is enough: there is
    nothing to brute-force, and the database never holds a usable key."""
    return hashlib.sha256(key.encode()).hexdigest()


class TokenScope(models.TextChoices):
    """What a token may do, a ceiling over what its user may do (docs/api.md, Tokens)."""

    READ = "read", "read"  # GET, HEAD and OPTIONS only
    SUBMIT = "submit", "submit"  # also writes within the user's tenants: jobs, quota requests, members
    ADMIN = "admin", "admin"  # also the staff powers; only users who hold a staff role


class ApiToken(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100, blank=True)
    key_digest = models.CharField(max_length=64, unique=True, editable=False)
    scope = models.CharField(max_length=8, choices=TokenScope.choices, default=TokenScope.SUBMIT)
    created = models.DateTimeField(auto_now_add=True)
    expires = models.DateTimeField()
    last_used = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"{self.user} · {self.name or 'token'} #{self.pk}"


class AuditEvent(models.Model):
    """Who did what to which object. Append-only; tenant and actor are kept as snapshots so the
    record outlives a deleted user or tenant (and so core imports no app)."""

    at = models.DateTimeField(auto_now_add=True, db_index=True)
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    actor_username = models.CharField(max_length=150, blank=True)
    tenant_id = models.BigIntegerField(null=True, blank=True)
    tenant_slug = models.CharField(max_length=64, blank=True)
    action = models.CharField(max_length=64)
    target_type = models.CharField(max_length=64)
    target_id = models.CharField(max_length=64)
    data = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-id"]
        indexes = [
            models.Index(fields=["tenant_id", "-id"], name="audit_tenant_recent"),
            models.Index(fields=["action", "-id"], name="audit_action_recent"),
        ]

    def __str__(self) -> str:
        who = self.actor_username or "system"
        return f"{self.at:%Y-%m-%d %H:%M} {who} {self.action} {self.target_type}:{self.target_id}"
