import re
from decimal import Decimal
from string import Formatter
from urllib.parse import urlsplit

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator, URLValidator
from django.db import models
from django.utils.translation import gettext_lazy as _

from clusters import shares
from clusters.shares import KINDS_BY_CLUSTER, ShareKind
from portal.core.fields import EncryptedTextField
from portal.core.validators import cluster_username_validator, slug_validator


def no_credentials_in_url(value: str) -> None:
    """A telemetry URL is shown to staff and in messages: it may not carry user:password@."""
    if "@" in urlsplit(value).netloc:
        raise ValidationError(
            _("Leave credentials out of the URL (no user:password@): the console and messages show it."),
            code="credentials",
        )


TELEMETRY_URL_VALIDATORS = [URLValidator(schemes=["http", "https"]), no_credentials_in_url]


class Vendor(models.TextChoices):
    NVIDIA = "nvidia", "NVIDIA"
    AMD = "amd", "AMD"
    CAMBRICON = "cambricon", "Cambricon"
    HYGON = "hygon", "Hygon"
    HUAWEI = "huawei", "Huawei Ascend"


def default_share_kinds() -> list[str]:
    return [ShareKind.WHOLE.value]


class GpuModel(models.Model):
    """An accelerator model, with the datasheet figures researchers choose by and the names
    each scheduler knows it by."""

    slug = models.CharField(max_length=63, unique=True, validators=[slug_validator])
    vendor = models.CharField(max_length=16, choices=Vendor.choices)
    name = models.CharField(max_length=64)
    memory_gb = models.PositiveIntegerField()
    fp64_tflops = models.FloatField(validators=[MinValueValidator(0)])
    fp32_tflops = models.FloatField(validators=[MinValueValidator(0)])
    fp16_tflops = models.FloatField(
        validators=[MinValueValidator(0)], help_text=_("Dense FP16 tensor throughput")
    )
    memory_bandwidth_gbs = models.PositiveIntegerField()
    interconnect = models.CharField(max_length=64, help_text=_("e.g. NVLink 4 (900 GB/s), PCIe 4.0"))
    interconnect_gbs = models.PositiveIntegerField(help_text=_("GPU-to-GPU bandwidth in GB/s"))
    ecc = models.BooleanField()
    cost_index = models.PositiveIntegerField(
        help_text=_("Relative cost of one GPU-hour, H100-80GB = 100; ranks models where cost matters")
    )
    slurm_gres = models.CharField(max_length=32, help_text=_("Slurm GRES type, as in --gres=gpu:TYPE:N"))
    k8s_resource = models.CharField(max_length=64, help_text=_("Kubernetes extended resource name"))
    k8s_product = models.CharField(max_length=128, help_text=_("Node label value of the GPU product"))
    # How the model may be shared (clusters/shares.py): the kinds it supports, its MIG profiles
    # ([] without MIG: {name, compute_slices, memory_slices, memory_gb, instances_max} each), and
    # where the figures come from.
    share_kinds = models.JSONField(default=default_share_kinds, blank=True)
    mig_profiles = models.JSONField(default=list, blank=True)
    sources = models.TextField(blank=True, help_text=_("Where the figures come from, one per line"))

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        super().clean()
        errors = {}
        if not isinstance(self.share_kinds, list) or not set(self.share_kinds) <= set(ShareKind.values):
            errors["share_kinds"] = _("A list of: %s.") % ", ".join(ShareKind.values)
        try:
            profiles = shares.mig_profiles(self.mig_profiles)
        except (KeyError, TypeError, ValueError):
            errors["mig_profiles"] = _(
                "A list of {name, compute_slices, memory_slices, memory_gb, instances_max}."
            )
        else:
            if any(
                p.compute_slices not in range(1, 8) or p.memory_slices not in range(1, 9) for p in profiles
            ):
                errors["mig_profiles"] = _("A MIG profile has 1 to 7 compute and 1 to 8 memory slices.")
        if errors:
            raise ValidationError(errors)

    def mig_profile(self, name: str) -> shares.MigProfile | None:
        return next((p for p in shares.mig_profiles(self.mig_profiles) if p.name == name), None)

    @property
    def memory_mib(self) -> int:
        return shares.device_memory_mib(self.memory_gb)


class Advisor(models.TextChoices):
    """The sizing arithmetic a scenario offers (clusters/advisor/); a scenario added as data
    picks the one whose workload it resembles, or none."""

    AI = "ai", _("AI training (parameters, tokens)")
    MD = "md", _("Molecular dynamics (atoms, ns/day)")
    CFD = "cfd", _("CFD / FEA (cells, iterations)")


class Scenario(models.Model):
    """A workload profile: it ranks the GPU models that suit it and carries job defaults."""

    slug = models.CharField(max_length=63, unique=True, validators=[slug_validator])
    name = models.CharField(max_length=100)
    description = models.TextField()
    default_walltime_minutes = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    env = models.JSONField(default=dict, blank=True, help_text=_("Environment defaults for jobs"))
    gpu_models = models.ManyToManyField(GpuModel, through="ScenarioGpu", related_name="scenarios")
    advisor = models.CharField(
        max_length=8, choices=Advisor.choices, blank=True, help_text=_("Sizing advisor; blank: none")
    )
    cpus_per_gpu = models.PositiveSmallIntegerField(default=8, validators=[MinValueValidator(1)])
    mem_per_gpu_mb = models.PositiveIntegerField(default=65536, validators=[MinValueValidator(256)])

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.name


class ScenarioGpu(models.Model):
    scenario = models.ForeignKey(Scenario, on_delete=models.CASCADE, related_name="ranking")
    gpu_model = models.ForeignKey(GpuModel, on_delete=models.PROTECT, related_name="+")
    rank = models.PositiveSmallIntegerField(help_text=_("1 suits the scenario best"))
    reason = models.CharField(max_length=300)

    class Meta:
        ordering = ["scenario_id", "rank"]
        constraints = [
            models.UniqueConstraint(fields=["scenario", "gpu_model"], name="scenario_gpu_once"),
            models.UniqueConstraint(fields=["scenario", "rank"], name="scenario_rank_once"),
        ]

    def __str__(self) -> str:
        return f"{self.scenario.slug} #{self.rank}: {self.gpu_model.slug}"


class ClusterKind(models.TextChoices):
    SLURM = "slurm", "Slurm"
    KUBERNETES = "kubernetes", "Kubernetes"
    LOCAL = "local", _("Local")


class JobIdentity(models.TextChoices):
    """Whom a tenant's jobs run as on a Slurm cluster (docs/architecture.md, Identities)."""

    TENANT = "tenant", _("A cluster account of the tenant's")
    USER = "user", _("The researcher's own cluster username")


def validate_identity_template(value: str) -> None:
    """Plain text around exactly one bare {tenant}: two tenants never map to one name (a template
    without {tenant}, or with {tenant:.3}, would give several tenants the same account)."""
    try:
        fields = [
            (name, spec, conversion)
            for _text, name, spec, conversion in Formatter().parse(value)
            if name is not None
        ]
    except ValueError as exc:
        raise ValidationError(_("Use {tenant} and plain text only.")) from exc
    if fields != [("tenant", "", None)]:
        raise ValidationError(_("Use {tenant} exactly once, with plain text around it."))
    cluster_username_validator(value.format(tenant="a"))


class Cluster(models.Model):
    """Where jobs run. Secrets (SSH private key and its passphrase, Kubernetes token and
    kubeconfig) are write-only: forms and the admin accept them, nothing shows or returns them;
    the database holds them encrypted with FIELD_ENCRYPTION_KEY (portal/core/fields.py). The CA
    certificate and known_hosts are public keys, kept in clear."""

    slug = models.CharField(max_length=63, unique=True, validators=[slug_validator])
    name = models.CharField(max_length=100)
    kind = models.CharField(max_length=16, choices=ClusterKind.choices)
    enabled = models.BooleanField(default=True)
    # Slurm: the login node the portal reaches over SSH.
    ssh_host = models.CharField(max_length=255, blank=True)
    ssh_port = models.PositiveIntegerField(default=22)
    ssh_user = models.CharField(max_length=64, blank=True)
    ssh_known_hosts = models.TextField(blank=True, help_text=_("known_hosts lines for the login node"))
    ssh_private_key = EncryptedTextField(blank=True)
    ssh_key_passphrase = EncryptedTextField(blank=True, help_text=_("Only for a passphrase-protected key"))
    slurm_cluster_name = models.CharField(max_length=64, blank=True)
    scratch_root = models.CharField(
        max_length=255,
        blank=True,
        help_text=_(
            "Slurm: absolute path, shared by the login and compute nodes, where each job identity keeps "
            "<identity>/<tenant>/ for its jobs' output and scratch"
        ),
    )
    job_identity = models.CharField(
        max_length=8,
        choices=JobIdentity.choices,
        default=JobIdentity.TENANT,
        help_text=_("Slurm: whom jobs run as; never the portal's SSH user"),
    )
    tenant_identity_template = models.CharField(
        max_length=64,
        default="{tenant}",
        validators=[validate_identity_template],
        help_text=_(
            "Slurm, per-tenant identities: the cluster account of a tenant's jobs, {tenant} being its slug; "
            "a tenant's own setting for this cluster overrides it"
        ),
    )
    # Kubernetes: a kubeconfig, or an API URL with token and CA.
    k8s_api_url = models.URLField(blank=True)
    k8s_ca_cert = models.TextField(blank=True)
    k8s_token = EncryptedTextField(blank=True)
    kubeconfig = EncryptedTextField(blank=True)
    uses_kueue = models.BooleanField(default=False)
    k8s_image = models.CharField(
        max_length=255, default="docker.io/library/python:3.11-slim", help_text=_("Container image of jobs")
    )
    # Kubernetes: each tenant's scratch claim (portal-scratch), where checkpoints live across a
    # job's attempts; 0 GiB: none (a restarted job then starts over).
    k8s_scratch_gib = models.PositiveIntegerField(
        default=100,
        validators=[MaxValueValidator(100_000)],
        help_text=_("Size of each tenant's scratch volume for checkpoints (GiB); 0: no volume"),
    )
    k8s_scratch_storage_class = models.CharField(
        max_length=253,
        blank=True,
        validators=[RegexValidator(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")],
        help_text=_("Storage class of the scratch volume; empty: the cluster's default"),
    )
    # Local: GPUs on the portal's own machine; 0 means "as many as nvidia-smi finds".
    local_gpus = models.PositiveIntegerField(default=0)
    # GPU telemetry (clusters/gpu_metrics.py): a Prometheus server's query API that scrapes
    # NVIDIA's DCGM exporter with the job mapping, its series labelled cluster="<slug>"; read first.
    prometheus_url = models.URLField(
        max_length=500,
        blank=True,
        validators=TELEMETRY_URL_VALIDATORS,
        help_text=_(
            "Prometheus server (its query API, e.g. http://prometheus:9090) that scrapes the cluster's "
            "DCGM exporters with the job mapping and the label cluster=<this cluster's slug>; blank: none"
        ),
    )
    # Where the backend has none of its own and there is no Prometheus: a DCGM exporter's
    # /metrics, or a Prometheus's /federate?match[]=DCGM_FI_DEV_GPU_UTIL.
    metrics_url = models.URLField(
        max_length=500,
        blank=True,
        validators=TELEMETRY_URL_VALIDATORS,
        help_text=_("Prometheus or DCGM exporter URL with per-job GPU utilization; blank: none"),
    )
    # Health, as the last check saw it.
    healthy = models.BooleanField(default=False)
    health_detail = models.CharField(max_length=500, blank=True)
    health_checked_at = models.DateTimeField(null=True, blank=True)

    SECRET_FIELDS = ("ssh_private_key", "ssh_key_passphrase", "k8s_token", "kubeconfig")

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        """A Slurm cluster keeps its jobs' files under an absolute scratch root shared by the login
        and compute nodes: never the service user's home, which no job may reach."""
        super().clean()
        root = self.scratch_root.rstrip("/")
        shape = re.fullmatch(r"/[A-Za-z0-9_./-]*", root) and "/../" not in f"{root}/"
        if self.kind == ClusterKind.SLURM and not shape:
            message = _(
                "A Slurm cluster needs an absolute path of letters, digits, '_', '.', '-', '/', no '..'."
            )
            raise ValidationError({"scratch_root": message})


class IdentityCheck(models.Model):
    """What the last check on a cluster found of one job identity: "" when the portal's service
    user can act as it, else what is wrong. Tenant pages show the problems of theirs."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="identity_checks")
    username = models.CharField(max_length=32)
    problem = models.CharField(max_length=300, blank=True)
    checked_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["cluster", "username"], name="identity_check_once_per_cluster")
        ]

    def __str__(self) -> str:
        return f"{self.username} on {self.cluster}"


class Partition(models.Model):
    """A Slurm partition or a Kubernetes node pool: one GPU model."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="partitions")
    name = models.CharField(max_length=64)
    gpu_model = models.ForeignKey(GpuModel, on_delete=models.PROTECT, related_name="partitions")
    gpus_per_node = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    nodes = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    max_walltime_minutes = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    gpus_free = models.PositiveIntegerField(null=True, blank=True, help_text=_("From the last inventory"))
    # What one GPU's share of a node can be: a job's CPUs and memory per GPU (from its scenario)
    # are lowered to these, so that a scenario's defaults never ask more than the hardware has.
    max_cpus_per_gpu = models.PositiveSmallIntegerField(null=True, blank=True)
    max_mem_per_gpu_mb = models.PositiveIntegerField(null=True, blank=True)
    # Which shares of its devices it offers (clusters/shares.py): kinds, the MIG profiles its
    # nodes are split into, and how many shards a device is (Slurm's gres/shard Count per GPU).
    share_kinds = models.JSONField(default=default_share_kinds, blank=True)
    mig_profiles = models.JSONField(default=list, blank=True)
    shards_per_gpu = models.PositiveSmallIntegerField(default=0)

    class Meta:
        ordering = ["cluster_id", "name"]
        constraints = [models.UniqueConstraint(fields=["cluster", "name"], name="partition_name_per_cluster")]

    def __str__(self) -> str:
        return f"{self.cluster.slug}/{self.name}"

    def clean(self) -> None:
        """What a partition offers must be what its model and its scheduler can give."""
        super().clean()
        if self.gpu_model_id is None or self.cluster_id is None:
            return
        errors = {}
        kinds = self.share_kinds if isinstance(self.share_kinds, list) else None
        possible = set(self.gpu_model.share_kinds) & set(KINDS_BY_CLUSTER.get(self.cluster.kind, ()))
        if self.cluster.kind == ClusterKind.LOCAL and self.gpu_model.vendor not in shares.LOCAL_SLICE_VENDORS:
            possible.discard(ShareKind.SLICE)
        if not kinds or not set(kinds) <= possible:
            errors["share_kinds"] = _("%(model)s on a %(kind)s cluster offers: %(kinds)s.") % {
                "model": self.gpu_model.name,
                "kind": self.cluster.get_kind_display(),
                "kinds": ", ".join(sorted(possible)),
            }
        known = {p.name for p in shares.mig_profiles(self.gpu_model.mig_profiles)}
        profiles = self.mig_profiles if isinstance(self.mig_profiles, list) else None
        if profiles is None or not set(profiles) <= known:
            errors["mig_profiles"] = _("Profiles of %(model)s: %(profiles)s.") % {
                "model": self.gpu_model.name,
                "profiles": ", ".join(sorted(known)) or "-",
            }
        elif kinds and (ShareKind.MIG in kinds) != bool(profiles):
            errors["mig_profiles"] = _("Name the MIG profiles exactly when the partition offers MIG.")
        if kinds and (ShareKind.SHARD in kinds) != (self.shards_per_gpu > 0):
            errors["shards_per_gpu"] = _("Set the shards per GPU exactly when the partition offers shards.")
        if errors:
            raise ValidationError(errors)

    def offers(self, kind: str) -> bool:
        return kind in self.share_kinds

    @property
    def gpus_total(self) -> int:
        return self.gpus_per_node * self.nodes


def share_check(
    gpu_model: GpuModel, share: shares.Share, *, partition: Partition | None = None, unit_only: bool = False
) -> Decimal | None:
    """What one unit of the share counts of a device of the model (clusters/shares.py), once
    checked against what the model, and the partition when given, can give: a ValidationError
    naming the field (share, mig_profile, gpu_memory_mib, gpu_cores_pct) otherwise. None for a
    shard without a partition: its size is the partition's. `unit_only`: the unit of a quota
    request, whose slices have no caps yet (each job names its own); None for a slice then."""
    kind = share.kind
    offered = partition.share_kinds if partition is not None else gpu_model.share_kinds
    where = str(partition) if partition is not None else gpu_model.name
    if kind not in ShareKind.values or kind not in gpu_model.share_kinds or kind not in offered:
        raise ValidationError(
            {"share": _("%(where)s offers: %(kinds)s.") % {"where": where, "kinds": ", ".join(offered)}}
        )
    errors = {}
    if kind == ShareKind.MIG:
        profile = gpu_model.mig_profile(share.mig_profile)
        profiles = (
            partition.mig_profiles if partition is not None else [p["name"] for p in gpu_model.mig_profiles]
        )
        if profile is None or share.mig_profile not in profiles:
            errors["mig_profile"] = _("%(where)s has the MIG profiles: %(profiles)s.") % {
                "where": where,
                "profiles": ", ".join(profiles),
            }
    elif share.mig_profile:
        errors["mig_profile"] = _("Only a MIG share names a profile.")
    if kind == ShareKind.SLICE and unit_only:
        pass
    elif kind == ShareKind.SLICE:
        step = shares.slice_memory_unit_mib(gpu_model.vendor)
        if not 1 <= share.memory_mib <= gpu_model.memory_mib:
            errors["gpu_memory_mib"] = _("A slice of %(model)s holds 1 to %(max)s MiB.") % {
                "model": gpu_model.name,
                "max": gpu_model.memory_mib,
            }
        elif share.memory_mib % step:
            errors["gpu_memory_mib"] = _("A slice of %(model)s takes memory in steps of %(step)s MiB.") % {
                "model": gpu_model.name,
                "step": step,
            }
        if not 1 <= share.cores_pct <= 100:
            errors["gpu_cores_pct"] = _("A slice has 1 to 100 percent of the device's compute.")
    else:
        if share.memory_mib:
            errors["gpu_memory_mib"] = _("Only a slice has a memory cap.")
        if share.cores_pct:
            errors["gpu_cores_pct"] = _("Only a slice has a compute percentage.")
    if errors:
        raise ValidationError(errors)
    if kind == ShareKind.MIG:
        return profile.fraction
    if kind == ShareKind.SLICE and unit_only:
        return None
    if kind == ShareKind.SLICE:
        return shares.slice_fraction(
            memory_mib=share.memory_mib, cores_pct=share.cores_pct, memory_gb=gpu_model.memory_gb
        )
    if kind == ShareKind.SHARD:
        return shares.shard_fraction(partition.shards_per_gpu) if partition is not None else None
    return shares.ONE


def units_per_node(partition: Partition, share: shares.Share) -> int:
    """The most units of the share one node of the partition holds."""
    if share.kind == ShareKind.MIG:
        # One instance per node: CUDA shows a process one MIG instance only, and no two instances
        # talk peer to peer, so a node's ranks cannot share a job's several instances.
        return 1
    if share.kind == ShareKind.SHARD:
        return partition.gpus_per_node * partition.shards_per_gpu
    if share.kind == ShareKind.SLICE:
        return 1  # one shared device per node: HAMi's nvidia.com/gpu: 1 with its caps
    return partition.gpus_per_node
