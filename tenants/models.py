from decimal import Decimal

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import F, Q
from django.utils import timezone
from django.utils.translation import gettext_lazy as _
from guardian.models import GroupObjectPermissionBase, UserObjectPermissionBase

from clusters.models import Cluster, GpuModel, Partition, Scenario
from clusters.shares import ShareKind
from portal.core.validators import cluster_username_validator, reserved_slug_validator, slug_validator


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

    slug = models.CharField(max_length=63, unique=True, validators=[slug_validator, reserved_slug_validator])
    name = models.CharField(max_length=200)
    tier = models.CharField(max_length=16, choices=Tier.choices, default=Tier.NORMAL)
    state = models.CharField(max_length=16, choices=TenantState.choices, default=TenantState.ACTIVE)
    contact_email = models.EmailField(blank=True)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["slug"]
        # Object permissions that roles grant (tenants/roles.py holds the table).
        permissions = [
            ("manage_members", "Add, remove and change members"),
            ("request_quota", "Request and withdraw quota"),
            ("submit_job", "Submit jobs and cancel one's own"),
            ("cancel_any_job", "Cancel any job of the tenant"),
            ("view_audit", "Read the tenant's audit log"),
            # Held globally by staff, never per tenant: portal/core/staff.py reads them.
            ("platform_admin", "Platform admin: every power in every tenant"),
            ("decide_quota", "Decide any tenant's quota requests"),
            ("view_all", "Read every tenant (not job scripts or environments)"),
        ]

    def __str__(self) -> str:
        return self.slug

    @property
    def is_active(self) -> bool:
        return self.state == TenantState.ACTIVE


class TenantUserPermission(UserObjectPermissionBase):
    """Guardian's per-object user permissions with a real foreign key to Tenant: an indexed
    join instead of guardian's generic text object_pk, which is slow to filter on at scale."""

    content_object = models.ForeignKey(Tenant, on_delete=models.CASCADE)

    class Meta(UserObjectPermissionBase.Meta):
        pass  # unique (user, permission, content_object) is also the index the visibility query uses


class TenantGroupPermission(GroupObjectPermissionBase):
    content_object = models.ForeignKey(Tenant, on_delete=models.CASCADE)


class Membership(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices)
    joined = models.DateTimeField(auto_now_add=True)
    # Made by a directory group's mapping (identity.services.groups_follow), which changes and
    # removes it as the user's groups change; a membership made by hand is never touched by it.
    managed = models.BooleanField(default=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "tenant"], name="membership_one_per_user_tenant")
        ]
        ordering = ["tenant_id", "user_id"]

    def __str__(self) -> str:
        return f"{self.user} in {self.tenant} as {self.role}"


class ClusterAccount(models.Model):
    """The tenant's own cluster account on one cluster whose jobs run per tenant: the POSIX
    identity its jobs run as there, instead of the cluster's name template. Two tenants never
    share one."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="cluster_accounts")
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="+")
    username = models.CharField(max_length=32, validators=[cluster_username_validator])

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "cluster"], name="cluster_account_one_per_tenant"),
            models.UniqueConstraint(fields=["cluster", "username"], name="cluster_account_not_shared"),
        ]

    def __str__(self) -> str:
        return f"{self.username} on {self.cluster_id}"


class Profile(models.Model):
    """What the portal knows of a user beyond django.contrib.auth: the researcher's own
    username on the clusters whose jobs run per user."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="profile")
    cluster_username = models.CharField(
        max_length=32,
        blank=True,
        validators=[cluster_username_validator],
        help_text=_("The researcher's POSIX user name on the clusters whose jobs run as their submitter"),
    )

    class Meta:
        constraints = [
            # two researchers never share one identity: their jobs and files would be one
            models.UniqueConstraint(
                fields=["cluster_username"],
                condition=~Q(cluster_username=""),
                name="profile_cluster_username_once",
            )
        ]

    def __str__(self) -> str:
        return f"profile of {self.user_id}"


class RequestState(models.TextChoices):
    PENDING = "pending", _("Pending")
    APPROVED = "approved", _("Approved")
    PARTIALLY_APPROVED = "partially_approved", _("Partially approved")
    REJECTED = "rejected", _("Rejected")
    WITHDRAWN = "withdrawn", _("Withdrawn")
    EXPIRED = "expired", _("Expired")


def unit_of(share: str, mig_profile: str) -> str:
    """What a grant's or a request's `gpus` count, in words: whole devices, MIG <profile>
    instances, slices, shards (no isolation)."""
    return f"MIG {mig_profile}" if share == ShareKind.MIG else str(ShareKind(share).label)


class QuotaGrantQuerySet(models.QuerySet):
    def active_on(self, day) -> "QuotaGrantQuerySet":
        """Grants whose window holds the day (QuotaGrant.is_active_on, in SQL)."""
        return self.filter(starts_on__lte=day, ends_on__gte=day)

    def inactive_on(self, day) -> "QuotaGrantQuerySet":
        return self.exclude(starts_on__lte=day, ends_on__gte=day)


class QuotaGrant(models.Model):
    """Limits a tenant may use for one scenario on one GPU model, and the ledger against them.

    gpu_hours_reserved holds what waiting and running jobs may still use (GPUs × walltime);
    gpu_hours_used what finished jobs did use. The check constraints make an overshoot
    impossible even for a writer that forgets the row lock."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="grants")
    scenario = models.ForeignKey(Scenario, on_delete=models.PROTECT, related_name="+")
    gpu_model = models.ForeignKey(GpuModel, on_delete=models.PROTECT, related_name="+")
    # The unit of `gpus` (clusters/shares.py): whole devices, MIG instances of mig_profile,
    # slices or shards; gpu_hours are device-equivalent GPU-hours whatever the unit.
    share = models.CharField(
        max_length=8, choices=ShareKind.choices, default=ShareKind.WHOLE, db_default=ShareKind.WHOLE.value
    )
    mig_profile = models.CharField(max_length=32, blank=True, db_default="")
    gpus = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    gpu_hours = models.DecimalField(max_digits=12, decimal_places=2)
    starts_on = models.DateField()
    ends_on = models.DateField()
    gpus_in_use = models.PositiveIntegerField(default=0)
    # Four decimals: a one-minute job on one GPU is 0.0167 GPU-hours, and many of them add up.
    gpu_hours_reserved = models.DecimalField(max_digits=14, decimal_places=4, default=Decimal(0))
    gpu_hours_used = models.DecimalField(max_digits=14, decimal_places=4, default=Decimal(0))
    created = models.DateTimeField(auto_now_add=True)
    # The last reminder mailed before the end (7 or 1 days), so that each goes out once.
    reminded_days_before = models.PositiveSmallIntegerField(null=True, blank=True)

    objects = QuotaGrantQuerySet.as_manager()

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index(fields=["tenant", "scenario", "gpu_model", "ends_on"], name="grant_match")]
        constraints = [
            models.CheckConstraint(condition=Q(gpus_in_use__lte=F("gpus")), name="grant_gpus_within_limit"),
            models.CheckConstraint(
                condition=Q(gpu_hours_reserved__gte=0, gpu_hours_used__gte=0),
                name="grant_ledger_not_negative",
            ),
            models.CheckConstraint(
                condition=Q(gpu_hours_reserved__lte=F("gpu_hours") - F("gpu_hours_used")),
                name="grant_reservations_within_hours",
            ),
            models.CheckConstraint(condition=Q(ends_on__gte=F("starts_on")), name="grant_window_ordered"),
        ]

    def __str__(self) -> str:
        unit = "" if self.share == ShareKind.WHOLE else f" ({self.unit})"
        return f"{self.tenant.slug}: {self.gpus}× {self.gpu_model.slug}{unit} for {self.scenario.slug}"

    @property
    def unit(self) -> str:
        return unit_of(self.share, self.mig_profile)

    @property
    def gpu_hours_remaining(self) -> Decimal:
        return self.gpu_hours - self.gpu_hours_used - self.gpu_hours_reserved

    def is_active_on(self, day) -> bool:
        return self.starts_on <= day <= self.ends_on

    def has_room_for(self, gpus: int) -> bool:
        """Would `gpus` more GPUs at once stay within the grant's concurrent limit?"""
        return self.gpus_in_use + gpus <= self.gpus

    @property
    def active(self) -> bool:
        return self.is_active_on(timezone.localdate())


class QuotaRequest(models.Model):
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="quota_requests")
    scenario = models.ForeignKey(Scenario, on_delete=models.PROTECT, related_name="+")
    gpu_model = models.ForeignKey(GpuModel, on_delete=models.PROTECT, related_name="+")
    share = models.CharField(
        max_length=8, choices=ShareKind.choices, default=ShareKind.WHOLE, db_default=ShareKind.WHOLE.value
    )
    mig_profile = models.CharField(max_length=32, blank=True, db_default="")
    gpus = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    gpu_hours = models.DecimalField(max_digits=12, decimal_places=2)
    starts_on = models.DateField()
    ends_on = models.DateField()
    justification = models.TextField()
    state = models.CharField(max_length=24, choices=RequestState.choices, default=RequestState.PENDING)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created = models.DateTimeField(auto_now_add=True)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    decision_note = models.TextField(blank=True)
    grant = models.OneToOneField(
        QuotaGrant, null=True, blank=True, on_delete=models.SET_NULL, related_name="request"
    )

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index(fields=["tenant", "state", "-id"], name="quota_request_list")]
        constraints = [
            models.CheckConstraint(condition=Q(ends_on__gte=F("starts_on")), name="request_window_ordered"),
        ]

    def __str__(self) -> str:
        unit = "" if self.share == ShareKind.WHOLE else f" {self.unit}"
        return f"#{self.pk} {self.tenant.slug}: {self.gpus}× {self.gpu_model.slug}{unit} ({self.state})"

    @property
    def unit(self) -> str:
        return unit_of(self.share, self.mig_profile)


class Cohort(models.Model):
    """Tenants that lend each other the idle GPUs of their grants for one GPU model
    (docs/architecture/lending.md): on one partition, or on every partition of the model.
    Each member lends and borrows at most its limits (CohortMember); a lender takes its GPUs
    back from borrowed jobs, which are warned reclaim_grace_s before they are stopped."""

    slug = models.CharField(max_length=63, unique=True, validators=[slug_validator])
    name = models.CharField(max_length=200, blank=True)
    gpu_model = models.ForeignKey(GpuModel, on_delete=models.PROTECT, related_name="+")
    partition = models.ForeignKey(
        Partition,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text=_("Lend only on this partition; empty: on every partition of the GPU model"),
    )
    reclaim_grace_s = models.PositiveIntegerField(
        default=300,
        validators=[MinValueValidator(10), MaxValueValidator(3600)],
        help_text=_("Seconds a borrowed job has to save a checkpoint once its lender reclaims its GPUs"),
    )
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug

    def covers(self, partition_id: int) -> bool:
        return self.partition_id is None or self.partition_id == partition_id


class CohortMember(models.Model):
    """A tenant's place in a cohort: the most of its granted concurrent GPUs (whole devices of
    the cohort's model) it lends to the others at once, and the most it borrows. Both 0 by
    default: a member lends and borrows nothing until an admin says."""

    cohort = models.ForeignKey(Cohort, on_delete=models.CASCADE, related_name="members")
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="cohort_places")
    lending_limit = models.PositiveIntegerField(default=0)
    borrowing_limit = models.PositiveIntegerField(default=0)
    joined = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["cohort_id", "tenant_id"]
        constraints = [models.UniqueConstraint(fields=["cohort", "tenant"], name="cohort_member_once")]

    def __str__(self) -> str:
        return f"{self.tenant_id} in {self.cohort_id}"
