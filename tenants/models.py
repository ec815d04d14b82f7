from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models
from django.utils.translation import gettext_lazy as _

slug_validator = RegexValidator(
    r"^[a-z0-9](?:[a-z0-9-]{0,62}[a-z0-9])?$", _("Lowercase letters, digits and inner hyphens.")
)


class Tier(models.TextChoices):
    LOW = "low", _("Low")
    NORMAL = "normal", _("Normal")
    HIGH = "high", _("High")
    CRITICAL = "critical", _("Critical")


class TenantState(models.TextChoices):
    ACTIVE = "active", _("Active")
    SUSPENDED = "suspended", _("Suspended")


class Role(models.TextChoices):
    OWNER = "owner", _("Owner")
    MANAGER = "manager", _("Manager")
    MEMBER = "member", _("Member")
    VIEWER = "viewer", _("Viewer")


class Tenant(models.Model):
    """A research team. On each cluster it becomes a Slurm account or a Kubernetes namespace."""

    slug = models.CharField(max_length=63, unique=True, validators=[slug_validator])
    name = models.CharField(max_length=200)
    tier = models.CharField(max_length=16, choices=Tier.choices, default=Tier.NORMAL)
    state = models.CharField(max_length=16, choices=TenantState.choices, default=TenantState.ACTIVE)
    contact_email = models.EmailField(blank=True)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug


class Membership(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices)
    joined = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "tenant"], name="membership_one_per_user_tenant")
        ]
        ordering = ["tenant_id", "user_id"]

    def __str__(self) -> str:
        return f"{self.user} in {self.tenant} as {self.role}"
