from decimal import Decimal

from django.contrib.auth import get_user_model
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from clusters.models import GpuModel, Partition, Scenario
from clusters.shares import ShareKind
from portal.core.models import AuditEvent
from portal.core.serializers import (
    SLUG_PATTERN,
    USERNAME_PATTERN,
    SlugRef,
    StrictCharField,
    StrictDecimalField,
    StrictEmailField,
    StrictIntegerField,
    UsernameRef,
    is_username,
    object_by_slug,
)
from portal.core.validators import reserved_slug_validator, slug_validator
from tenants.models import (
    Cohort,
    CohortMember,
    Membership,
    QuotaGrant,
    QuotaRequest,
    Role,
    Tenant,
    TenantState,
    Tier,
)
from tenants.selectors import tenant_id_list_visible_to, tenants_visible_to

MAX_GPUS = 100_000
MAX_GPU_HOURS = Decimal("100000000")


class MeTenantOut(serializers.Serializer):  # rows of tenants.selectors.membership_rows_of
    slug = serializers.CharField()
    name = serializers.CharField()
    role = serializers.CharField()


class MeOut(serializers.Serializer):
    username = serializers.CharField()
    email = serializers.EmailField(allow_blank=True)  # Django's users may have none
    is_staff = serializers.BooleanField(help_text="May enter the admin console; grants nothing else.")
    platform_admin = serializers.BooleanField(help_text="Holds every power in every tenant.")
    staff_roles = serializers.ListField(
        child=serializers.CharField(),
        help_text='The documented staff roles held: "Platform admin", "Quota approver", "Read-only support".',
    )
    tenants = MeTenantOut(many=True)


class TenantOut(serializers.ModelSerializer):
    class Meta:
        model = Tenant
        fields = ["slug", "name", "tier", "state", "contact_email", "created"]


# The slug rule with the names the schedulers keep for themselves left out (validators.py).
TENANT_SLUG_PATTERN = r"^(?!(?:default|root)$|kube-)" + SLUG_PATTERN.removeprefix("^")


@extend_schema_field({"type": "string", "pattern": TENANT_SLUG_PATTERN, "maxLength": 63})
class TenantSlugField(StrictCharField):
    pass


class TenantIn(serializers.Serializer):
    slug = TenantSlugField(max_length=63, validators=[slug_validator, reserved_slug_validator])
    name = StrictCharField(max_length=200)
    tier = serializers.ChoiceField(choices=Tier.choices, default=Tier.NORMAL)
    contact_email = StrictEmailField(max_length=254, required=False, allow_blank=True, default="")
    owner = UsernameRef(queryset=get_user_model().objects.filter(is_active=True), required=False)


class TenantPatch(serializers.Serializer):
    name = StrictCharField(max_length=200, required=False)
    contact_email = StrictEmailField(max_length=254, required=False, allow_blank=True)
    tier = serializers.ChoiceField(choices=Tier.choices, required=False)
    state = serializers.ChoiceField(choices=TenantState.choices, required=False)


class MemberOut(serializers.ModelSerializer):
    username = serializers.CharField(source="user.username")

    class Meta:
        model = Membership
        fields = ["username", "role", "joined"]


@extend_schema_field({"type": "string", "pattern": USERNAME_PATTERN, "maxLength": 150})
class UsernameField(StrictCharField):
    """A username by its form only; whether it names a user is the view's question, asked after
    the caller is known to manage the tenant (tenants.permissions.member_candidate)."""

    def to_internal_value(self, data):
        value = super().to_internal_value(data)
        if not is_username(value):
            self.fail("invalid")
        return value


class MemberIn(serializers.Serializer):
    username = UsernameField(max_length=150, error_messages={"invalid": "Not a valid username."})
    role = serializers.ChoiceField(choices=Role.choices)


class MemberPatch(serializers.Serializer):
    role = serializers.ChoiceField(choices=Role.choices)


_TENANTS = Tenant.objects.all()  # declared once: object_by_slug compiles per queryset


class VisibleTenantField(SlugRef):
    """A tenant slug among those the caller may see: another tenant's slug reads as unknown,
    exactly like one that does not exist."""

    def get_queryset(self):
        return tenants_visible_to(user=self.context["request"].user)

    def to_internal_value(self, data):
        """The tenant by its compiled lookup, then the caller's tenants from the request's
        permission map (tenant_id_list_visible_to): what tenants_visible_to answers, in one
        query instead of a query with a subquery built anew."""
        if not isinstance(data, str) or self.regex.fullmatch(data) is None:
            self.fail("invalid")
        tenant = object_by_slug(_TENANTS, data)
        visible = tenant_id_list_visible_to(user=self.context["request"].user)
        # Not a list: staff who see every tenant (the subquery of them all).
        if tenant is None or (isinstance(visible, list) and tenant.pk not in visible):
            self.fail("does_not_exist", slug_name=self.slug_field, value=data)
        return tenant


class QuotaRequestIn(serializers.Serializer):
    tenant = VisibleTenantField()
    scenario = SlugRef(queryset=Scenario.objects.all())
    gpu_model = SlugRef(queryset=GpuModel.objects.all())
    share = serializers.ChoiceField(
        choices=ShareKind.choices,
        default=ShareKind.WHOLE,
        help_text="The unit of `gpus`: whole devices, MIG instances of `mig_profile`, slices, Slurm shards.",
    )
    mig_profile = StrictCharField(max_length=32, required=False, default="", allow_blank=True)
    gpus = StrictIntegerField(min_value=1, max_value=MAX_GPUS, help_text="Concurrent units of the share.")
    gpu_hours = StrictDecimalField(
        max_digits=12,
        decimal_places=2,
        min_value=Decimal("0.01"),
        max_value=MAX_GPU_HOURS,
        help_text="Device-equivalent GPU-hours: a unit counts its fraction of a device.",
    )
    starts_on = serializers.DateField()
    ends_on = serializers.DateField()
    justification = StrictCharField(max_length=5000)


class QuotaRequestOut(serializers.ModelSerializer):
    id = serializers.CharField(read_only=True)
    tenant = serializers.CharField(source="tenant.slug")
    scenario = serializers.CharField(source="scenario.slug")
    gpu_model = serializers.CharField(source="gpu_model.slug")
    gpu_hours = serializers.DecimalField(max_digits=12, decimal_places=2, coerce_to_string=False)
    # null once the user is deleted, or while undecided; grant: null unless approved.
    requested_by = serializers.CharField(source="requested_by.username", default=None, allow_null=True)
    decided_by = serializers.CharField(source="decided_by.username", default=None, allow_null=True)
    grant = serializers.CharField(source="grant_id", default=None, allow_null=True)

    class Meta:
        model = QuotaRequest
        fields = [
            "id", "tenant", "scenario", "gpu_model", "share", "mig_profile", "gpus", "gpu_hours", "starts_on",
            "ends_on", "justification", "state", "requested_by", "created", "decided_by", "decided_at",
            "decision_note", "grant",
        ]  # fmt: skip


class DecisionIn(serializers.Serializer):
    note = StrictCharField(max_length=5000)


class ApprovalIn(DecisionIn):
    gpus = StrictIntegerField(min_value=1, max_value=MAX_GPUS, required=False)
    gpu_hours = StrictDecimalField(
        max_digits=12, decimal_places=2, min_value=Decimal("0.01"), max_value=MAX_GPU_HOURS, required=False
    )
    ends_on = serializers.DateField(required=False)


class QuotaOut(serializers.ModelSerializer):
    id = serializers.CharField(read_only=True)
    tenant = serializers.CharField(source="tenant.slug")
    scenario = serializers.CharField(source="scenario.slug")
    gpu_model = serializers.CharField(source="gpu_model.slug")
    gpu_hours = serializers.DecimalField(max_digits=12, decimal_places=2, coerce_to_string=False)
    gpu_hours_used = serializers.DecimalField(max_digits=14, decimal_places=4, coerce_to_string=False)
    gpu_hours_reserved = serializers.DecimalField(max_digits=14, decimal_places=4, coerce_to_string=False)
    gpu_hours_remaining = serializers.DecimalField(max_digits=14, decimal_places=4, coerce_to_string=False)
    active = serializers.BooleanField()

    class Meta:
        model = QuotaGrant
        fields = [
            "id", "tenant", "scenario", "gpu_model", "share", "mig_profile", "gpus", "gpus_in_use",
            "gpu_hours", "gpu_hours_used", "gpu_hours_reserved", "gpu_hours_remaining", "starts_on",
            "ends_on", "active",
        ]  # fmt: skip


class AuditOut(serializers.ModelSerializer):
    actor = serializers.CharField(source="actor_username")
    tenant = serializers.CharField(source="tenant_slug")

    class Meta:
        model = AuditEvent
        fields = ["at", "actor", "tenant", "action", "target_type", "target_id", "data"]


# --- Cohorts (tenants/cohorts.py)

MAX_LENDING_GPUS = 4096


class CohortPartitionOut(serializers.Serializer):
    """A partition as the catalog names it: its cluster's slug and its name there."""

    cluster = serializers.CharField(source="cluster.slug")
    name = serializers.CharField()


class CohortMemberOut(serializers.ModelSerializer):
    tenant = serializers.CharField(source="tenant.slug")

    class Meta:
        model = CohortMember
        fields = ["tenant", "lending_limit", "borrowing_limit", "joined"]
        read_only_fields = fields  # so that the schema says each is always there


class CohortOut(serializers.ModelSerializer):
    gpu_model = serializers.CharField(source="gpu_model.slug")
    partition = CohortPartitionOut(allow_null=True, help_text="null: every partition of the GPU model.")
    members = CohortMemberOut(
        many=True,
        help_text="Every member for staff who see every tenant; for anyone else only their own tenants.",
    )

    class Meta:
        model = Cohort
        fields = ["slug", "name", "gpu_model", "partition", "reclaim_grace_s", "members", "created"]
        read_only_fields = fields


@extend_schema_field({"type": "string", "pattern": SLUG_PATTERN, "maxLength": 63})
class CohortSlugField(StrictCharField):
    pass


class CohortPartitionIn(serializers.Serializer):
    cluster = CohortSlugField(max_length=63, validators=[slug_validator])
    name = StrictCharField(max_length=64)


class _CohortPartition:
    # `partition`: {cluster, name} of an existing partition, or null for every partition.

    def validate_partition(self, value):
        if value is None:
            return None
        partition = (
            Partition.objects.select_related("cluster")
            .filter(cluster__slug=value["cluster"], name=value["name"])
            .first()
        )
        if partition is None:
            raise serializers.ValidationError("No such partition.")
        return partition


class CohortIn(_CohortPartition, serializers.Serializer):
    slug = CohortSlugField(max_length=63, validators=[slug_validator])
    name = StrictCharField(max_length=200, required=False, default="", allow_blank=True)
    gpu_model = SlugRef(queryset=GpuModel.objects.all())
    partition = CohortPartitionIn(
        required=False, default=None, allow_null=True, help_text="Absent or null: every partition."
    )
    reclaim_grace_s = StrictIntegerField(
        min_value=10,
        max_value=3600,
        default=300,
        help_text="Seconds a borrowed job has to save a checkpoint once its lender reclaims its GPUs.",
    )


class CohortPatch(_CohortPartition, serializers.Serializer):
    name = StrictCharField(max_length=200, required=False, allow_blank=True)
    partition = CohortPartitionIn(required=False, allow_null=True)
    reclaim_grace_s = StrictIntegerField(min_value=10, max_value=3600, required=False)


class CohortMemberIn(serializers.Serializer):
    lending_limit = StrictIntegerField(
        min_value=0,
        max_value=MAX_LENDING_GPUS,
        help_text="The most of its granted GPUs of the cohort's model it lends to the others at once.",
    )
    borrowing_limit = StrictIntegerField(
        min_value=0, max_value=MAX_LENDING_GPUS, help_text="The most GPUs it borrows from the others at once."
    )
