import uuid
from decimal import Decimal

from django.conf import settings
from django.core.validators import MinValueValidator, RegexValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from clusters.backends.base import JobState
from clusters.models import Cluster, GpuModel, Partition, Scenario
from clusters.shares import Share, ShareKind
from tenants.models import Cohort, QuotaGrant, Tenant, Tier

job_name_validator = RegexValidator(
    r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$", _("1 to 64 letters, digits, dots, dashes and underscores.")
)


class Priority(models.TextChoices):
    LOW = "low", _("Low")
    NORMAL = "normal", _("Normal")
    HIGH = "high", _("High")


# The one order of priorities, the lowest first: a tier's cap, a default below it, admission.
PRIORITY_ORDER = (Priority.LOW, Priority.NORMAL, Priority.HIGH)
# A tenant's tier caps the priority its jobs may ask for within it.
MAX_PRIORITY = {
    Tier.LOW: Priority.LOW,
    Tier.NORMAL: Priority.NORMAL,
    Tier.HIGH: Priority.HIGH,
    Tier.CRITICAL: Priority.HIGH,
}


def priority_above_cap(priority: str, tier: str) -> bool:
    return PRIORITY_ORDER.index(priority) > PRIORITY_ORDER.index(MAX_PRIORITY[tier])


def default_priority(tier: str) -> str:
    """A job's priority when its submitter names none: normal, or the tier's cap when lower."""
    return min(Priority.NORMAL, MAX_PRIORITY[tier], key=PRIORITY_ORDER.index)


def new_token() -> str:
    return uuid.uuid4().hex


class Job(models.Model):
    """One job of a tenant: what was asked, where it runs, and the ledger of its quota.

    reserved_gpu_hours is what the job holds on its grant until it ends (GPUs × walltime);
    holds_gpus says whether it has taken its GPUs of the grant's concurrent limit."""

    token = models.CharField(max_length=32, unique=True, default=new_token, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="jobs")
    submitted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    name = models.CharField(max_length=64, validators=[job_name_validator])
    scenario = models.ForeignKey(Scenario, on_delete=models.PROTECT, related_name="+")
    gpu_model = models.ForeignKey(GpuModel, on_delete=models.PROTECT, related_name="+")
    grant = models.ForeignKey(QuotaGrant, on_delete=models.PROTECT, related_name="jobs")
    cluster = models.ForeignKey(Cluster, on_delete=models.PROTECT, related_name="jobs")
    partition = models.ForeignKey(Partition, on_delete=models.PROTECT, related_name="jobs")
    gpus = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    nodes = models.PositiveIntegerField(default=1, validators=[MinValueValidator(1)])
    # What each of `gpus` is (clusters/shares.py), and what it counts of a device: GPU-hours are
    # gpus × device_fraction × hours, and admission fills a partition by the same figure.
    # db_default too: rows written by raw SQL or COPY (the bench's seed and floor) are whole GPUs.
    share = models.CharField(
        max_length=8, choices=ShareKind.choices, default=ShareKind.WHOLE, db_default=ShareKind.WHOLE.value
    )
    mig_profile = models.CharField(max_length=32, blank=True, db_default="")
    gpu_memory_mib = models.PositiveIntegerField(default=0, db_default=0)
    gpu_cores_pct = models.PositiveSmallIntegerField(default=0, db_default=0)
    device_fraction = models.DecimalField(
        max_digits=5, decimal_places=4, default=Decimal(1), db_default=Decimal(1)
    )
    walltime_minutes = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    priority = models.CharField(max_length=8, choices=Priority.choices, default=Priority.NORMAL)
    # The tenant's tier when the job was submitted: its prices' multiplier (billing/pricing.py)
    # and the reports' tier, whatever the tenant's tier becomes later.
    tier = models.CharField(max_length=16, choices=Tier.choices, default=Tier.NORMAL, db_default=Tier.NORMAL)
    cpus_per_gpu = models.PositiveSmallIntegerField()
    mem_per_gpu_mb = models.PositiveIntegerField()
    env = models.JSONField(default=dict, blank=True)
    script = models.TextField(
        help_text=_("The batch script as submitted (rendered from the template, if any)")
    )
    template = models.CharField(max_length=64, blank=True)
    parameters = models.JSONField(default=dict, blank=True)

    state = models.CharField(max_length=16, choices=JobState.choices, default=JobState.QUEUED)
    reason = models.CharField(max_length=200, blank=True)
    raw_state = models.CharField(max_length=64, blank=True)
    backend_id = models.CharField(max_length=128, blank=True)
    # The POSIX identity the job runs as on its cluster, fixed at submission ("" where the cluster
    # kind has none): its sbatch, scancel, log and files are that identity's.
    cluster_user = models.CharField(max_length=32, blank=True)
    node_list = models.CharField(max_length=500, blank=True)
    created = models.DateTimeField(auto_now_add=True)
    submitted_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    gpu_hours = models.DecimalField(max_digits=12, decimal_places=4, null=True, blank=True)

    # to the grant's precision: an attempt's charge and lost work move it by 0.0001 GPU-hours
    reserved_gpu_hours = models.DecimalField(max_digits=12, decimal_places=4)
    holds_gpus = models.BooleanField(default=False)
    dispatch_attempts = models.PositiveIntegerField(default=0)
    # Whoever holds an unexpired lease is submitting this job; a second dispatcher (a retry, the
    # sweep) waits until it ends, so that two never submit at once.
    dispatch_lease_until = models.DateTimeField(null=True, blank=True)
    idempotency_key = models.CharField(max_length=128, blank=True)
    request_digest = models.CharField(max_length=64, blank=True)
    # Preemption, loans and restarts (jobs/services/lending.py, docs/architecture/lending.md).
    # preemptible: its submitter lets it run on GPUs lent by other tenants of a cohort, and be
    # stopped (warned first) when they take them back. A job that ends PREEMPTED or NODE_FAIL
    # (or FAILED with one of restart_exit_codes, "1,42") is submitted again, up to
    # max_restarts times, as the next attempt of the same job: not before restart_after.
    # gpus_borrowed: how many of its gpus this attempt took on loan (reclaimed or not).
    # stop_at: it was warned, and is stopped then. gpu_hours_lost: what its stopped attempts
    # ran past their last checkpoint, which is not charged.
    preemptible = models.BooleanField(default=False, db_default=False)
    max_restarts = models.PositiveSmallIntegerField(default=0, db_default=0)
    restart_exit_codes = models.CharField(max_length=64, blank=True, db_default="")
    attempt = models.PositiveSmallIntegerField(default=1, db_default=1)
    gpus_borrowed = models.PositiveIntegerField(default=0, db_default=0)
    restart_after = models.DateTimeField(null=True, blank=True)
    stop_at = models.DateTimeField(null=True, blank=True)
    gpu_hours_lost = models.DecimalField(
        max_digits=12, decimal_places=4, default=Decimal(0), db_default=Decimal(0)
    )
    # Idle GPUs (jobs/services/idle.py): the first sample under the threshold in the current idle
    # stretch, null while busy or unknown; when this stretch was mailed to the submitter.
    gpu_idle_since = models.DateTimeField(null=True, blank=True)
    gpu_idle_flagged_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        indexes = [
            models.Index(fields=["tenant", "-id"], name="job_tenant_recent"),
            models.Index(fields=["state", "cluster"], name="job_state_cluster"),
            models.Index(fields=["tenant", "finished_at"], name="job_tenant_finished"),
            # Admission sums the GPUs held on a partition at every submit and every end: only the
            # few jobs that hold some, not every job the partition ever ran (a seeded site of
            # 100,000 jobs: 25 ms a sum without it, under 1 ms with it).
            models.Index(fields=["partition", "gpus"], condition=Q(holds_gpus=True), name="job_holds_gpus"),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["submitted_by", "idempotency_key"],
                condition=~Q(idempotency_key=""),
                name="job_idempotency_key_once_per_user",
            ),
        ]

    def __str__(self) -> str:
        return f"#{self.pk} {self.name} ({self.state})"

    @property
    def gpus_per_node(self) -> int:
        return self.gpus // self.nodes

    @property
    def share_of_device(self) -> Share:
        return Share(self.share, self.mig_profile, self.gpu_memory_mib, self.gpu_cores_pct)

    @property
    def device_gpus(self) -> Decimal:
        """The devices' worth the job holds: its units × what each counts of a device."""
        return self.gpus * self.device_fraction

    @property
    def exit_codes_to_restart(self) -> frozenset[int]:
        return frozenset(int(code) for code in self.restart_exit_codes.split(",") if code)

    @property
    def restarts_left(self) -> int:
        return max(0, self.max_restarts - (self.attempt - 1))


class JobAttempt(models.Model):
    """One run of a job in its scheduler, from dispatch to its end: a restarted job has several
    (Job.attempt counts them). What the attempt used, and of that what it kept: the last
    checkpoint it reported (`PORTAL_CHECKPOINT <epoch>` in its log, read after it ended) and the
    GPU-hours it ran past it, lost and not charged."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="attempts")
    number = models.PositiveSmallIntegerField()
    backend_id = models.CharField(max_length=128, blank=True)
    token = models.CharField(max_length=32)
    node_list = models.CharField(max_length=500, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField()
    # a reclaimed attempt's end of grace: Kubernetes forgets a Job before its pods have saved
    stop_at = models.DateTimeField(null=True, blank=True)
    end_state = models.CharField(max_length=16, choices=JobState.choices)
    reason = models.CharField(max_length=200, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    gpu_hours = models.DecimalField(max_digits=12, decimal_places=4, default=Decimal(0))
    checkpoint_at = models.DateTimeField(null=True, blank=True)
    gpu_hours_lost = models.DecimalField(max_digits=12, decimal_places=4, null=True, blank=True)
    reviewed = models.BooleanField(default=False)  # its log was read for checkpoints

    class Meta:
        ordering = ["job_id", "number"]
        constraints = [models.UniqueConstraint(fields=["job", "number"], name="job_attempt_once")]

    def __str__(self) -> str:
        return f"{self.job_id} attempt {self.number}: {self.end_state}"

    @property
    def minutes_kept(self) -> int | None:
        if self.checkpoint_at is None or self.started_at is None:
            return None
        return max(0, int((self.checkpoint_at - self.started_at).total_seconds() // 60))


class LoanRole(models.TextChoices):
    """A loan as one of its tenants sees it: GPUs it lent, or GPUs its job borrowed."""

    LENT = "lent", "lent"
    BORROWED = "borrowed", "borrowed"


class Loan(models.Model):
    """GPUs of a lender's grant that a borrower's job holds (jobs/services/lending.py): taken at
    admission, given back when the job ends or its lender reclaims them (`reclaimed`)."""

    # kept as the lenders' and borrowers' record once its cohort is deleted (no open loan may be)
    cohort = models.ForeignKey(Cohort, null=True, on_delete=models.SET_NULL, related_name="loans")
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="loans")
    attempt = models.PositiveSmallIntegerField(default=1)
    borrower = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="loans_taken")
    lender = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="loans_given")
    lender_grant = models.ForeignKey(QuotaGrant, on_delete=models.PROTECT, related_name="loans")
    gpus = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    started_at = models.DateTimeField(default=timezone.now)
    ended_at = models.DateTimeField(null=True, blank=True)
    reclaimed = models.BooleanField(default=False)

    class Meta:
        ordering = ["-id"]
        indexes = [
            models.Index(
                fields=["lender_grant"], condition=Q(ended_at__isnull=True), name="loan_open_by_grant"
            ),
            models.Index(fields=["borrower", "-started_at"], name="loan_borrower_recent"),
            models.Index(fields=["lender", "-started_at"], name="loan_lender_recent"),
        ]

    def __str__(self) -> str:
        return f"{self.gpus} GPUs of {self.lender_id} to job {self.job_id}"

    def gpu_hours(self, until=None) -> Decimal:
        """GPU-hours lent so far (whole GPUs of the cohort's model)."""
        end = self.ended_at or until or timezone.now()
        return Decimal(max(0.0, (end - self.started_at).total_seconds()) * self.gpus / 3600).quantize(
            Decimal("0.0001")
        )


class JobEvent(models.Model):
    """A state change of a job, with why; in order of id. `at` is when it happened: the
    scheduler's time where it reports one (a start, an end), else when the portal learnt of it."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="events")
    at = models.DateTimeField(default=timezone.now)
    from_state = models.CharField(max_length=16, choices=JobState.choices, blank=True)
    to_state = models.CharField(max_length=16, choices=JobState.choices)
    reason = models.CharField(max_length=200, blank=True)
    raw_state = models.CharField(max_length=64, blank=True)
    attempt = models.PositiveSmallIntegerField(default=1, db_default=1)  # the job's attempt it belongs to

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.job_id}: {self.from_state or '∅'} → {self.to_state}"


class JobGpuSample(models.Model):
    """One reading of a RUNNING job's GPUs (jobs/services/telemetry.py), for the job page's charts,
    the dashboard's GPU efficiency and GET /jobs/{id}/gpu-samples/. Figures span or sum the job's
    GPUs as clusters/gpu_metrics.py says; null where the source does not report them."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="gpu_samples")
    at = models.DateTimeField()
    gpus = models.PositiveIntegerField()  # how many of the job's GPUs were read
    utilization_pct = models.FloatField()  # the mean over its GPUs
    utilization_min_pct = models.FloatField()
    utilization_max_pct = models.FloatField()
    memory_used_mib = models.FloatField(null=True)
    memory_total_mib = models.FloatField(null=True)
    temperature_c = models.FloatField(null=True)  # the hottest of its GPUs
    power_w = models.FloatField(null=True)
    xid = models.PositiveIntegerField(null=True)  # the highest XID error code reported; 0: none

    class Meta:
        ordering = ["job", "at"]
        constraints = [models.UniqueConstraint(fields=["job", "at"], name="job_gpu_sample_once")]
        indexes = [models.Index(fields=["at"], name="job_gpu_sample_at")]  # the pruning

    def __str__(self) -> str:
        return f"{self.job_id} at {self.at:%Y-%m-%d %H:%M}: {self.utilization_pct:.0f}%"

    @property
    def memory_used_pct(self) -> float | None:
        if self.memory_used_mib is None or not self.memory_total_mib:
            return None
        return round(100 * self.memory_used_mib / self.memory_total_mib, 1)
