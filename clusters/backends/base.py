"""The one interface every scheduler backend implements (docs/architecture.md, Backends).

Plain dataclasses in and out: a backend imports no model of tenants or jobs, and knows a
cluster only through ClusterConfig. States are the portal's (JobState, defined here once), with
the scheduler's own state and reason kept beside them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from django.db import models
from django.utils.translation import gettext_lazy as _


class JobState(models.TextChoices):
    """The portal's job states: the one list (jobs.models.Job.state's choices, and what backends
    report). jobs/states.py holds the moves allowed between them."""

    QUEUED = "QUEUED", _("Queued")
    SUBMITTING = "SUBMITTING", _("Submitting")
    PENDING = "PENDING", _("Pending")
    RUNNING = "RUNNING", _("Running")
    CANCELLING = "CANCELLING", _("Cancelling")
    COMPLETED = "COMPLETED", _("Completed")
    FAILED = "FAILED", _("Failed")
    CANCELLED = "CANCELLED", _("Cancelled")
    TIMEOUT = "TIMEOUT", _("Timed out")
    NODE_FAIL = "NODE_FAIL", _("Node failure")
    OUT_OF_MEMORY = "OUT_OF_MEMORY", _("Out of memory")
    PREEMPTED = "PREEMPTED", _("Preempted")
    REJECTED = "REJECTED", _("Rejected")
    LOST = "LOST", _("Lost")


END_STATES = frozenset(
    {
        *(JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT, JobState.NODE_FAIL),
        *(JobState.OUT_OF_MEMORY, JobState.PREEMPTED, JobState.REJECTED, JobState.LOST),
    }
)


class BackendError(Exception):
    """The scheduler refused the request for good (bad account, invalid partition…): retrying
    the same request cannot help."""


class BackendUnavailable(BackendError):
    """The scheduler could not be reached or did not answer in time: transient, retry later.
    Jobs wait; they do not fail."""


@dataclass(frozen=True)
class ClusterConfig:
    """What a backend needs to reach one cluster; secrets included, so never log it whole."""

    slug: str
    kind: str
    ssh_host: str = ""
    ssh_port: int = 22
    ssh_user: str = ""
    ssh_known_hosts: str = field(default="", repr=False)
    ssh_private_key: str = field(default="", repr=False)
    ssh_key_passphrase: str = field(default="", repr=False)  # of an encrypted private key
    slurm_cluster_name: str = ""
    scratch_root: str = ""
    k8s_api_url: str = ""
    k8s_ca_cert: str = field(default="", repr=False)
    k8s_token: str = field(default="", repr=False)
    kubeconfig: str = field(default="", repr=False)
    uses_kueue: bool = False
    local_gpus: int = 0
    state_dir: str = ""  # local backend: where it keeps job files and pid records
    nvidia_smi: str = "nvidia-smi"  # local backend: the program (a name on PATH, or a path)
    # local backend: the job sandbox (local/sandbox.py; settings LOCAL_SANDBOX_*), and the one
    # tenant it serves when set (LOCAL_CLUSTER_TENANT; "" serves every tenant where a sandbox exists)
    local_sandbox_bwrap: str = "/usr/bin/bwrap"
    local_sandbox_network: bool = False
    local_sandbox_uid_base: int = 1_900_000_000
    local_sandbox_uid_count: int = 100_000
    local_sandbox_ro_paths: tuple[str, ...] = ()
    local_sandbox_hidden: tuple[str, ...] = ()  # the portal's tree and VAR_DIR, masked if mounted
    local_tenant: str = ""
    # kubernetes backend: the default container image of a job; the ClusterQueue that tenants'
    # LocalQueues feed (Kueue clusters); ttlSecondsAfterFinished of Jobs; count/jobs.batch per tenant
    k8s_image: str = "docker.io/library/python:3.11-slim"
    k8s_kueue_cluster_queue: str = "portal"
    k8s_job_ttl_s: int = 86_400
    k8s_max_jobs_per_tenant: int = 500
    # kubernetes backend: each tenant's scratch PersistentVolumeClaim (ReadWriteMany), where its
    # jobs keep their checkpoints: size in GiB (0: none, and jobs with a checkpoint key are
    # refused) and StorageClass ("": the cluster's default class, which must offer ReadWriteMany)
    k8s_scratch_gib: int = 100
    k8s_scratch_storage_class: str = ""
    # Slurm: the borrowing QOS's GraceTime, the warning a job preempted by Slurm itself gets
    preempt_grace_s: int = 300


@dataclass(frozen=True)
class JobSpec:
    """One job to submit. `token` is unique per portal job and stored by the scheduler, so that
    find(token) tells whether an earlier attempt already submitted it."""

    token: str
    name: str
    account: str  # the tenant's slug: a Slurm account, a Kubernetes namespace
    qos: str  # the tenant tier's QOS, e.g. portal-high
    priority: str  # low | normal | high, within the tenant
    partition: str
    gpu_type: str  # Slurm GRES type, e.g. h100
    k8s_resource: str  # e.g. nvidia.com/gpu
    k8s_product: str  # node label value of the GPU product
    gpus_per_node: int
    nodes: int
    walltime_minutes: int
    script: str  # the batch script, rendered; never passed through a shell string
    env: dict[str, str]  # names validated upstream; values are data, quoted by the backend
    cpus_per_gpu: int = 4
    mem_per_gpu_mb: int = 16_000
    labels: dict[str, str] = field(default_factory=dict)  # tenant, job id, scenario
    image: str = ""  # kubernetes: the container image; "" takes the cluster's k8s_image
    # The POSIX identity the job runs as (Slurm: a cluster account of the tenant's, or the
    # submitter's own cluster username); never the portal's service user. "" where the cluster
    # kind has none of its own (Kubernetes: the namespace is the identity; local: the sandbox).
    user: str = ""
    # What part of a device each of gpus_per_node is (clusters/shares.py): a whole device, a MIG
    # instance of mig_profile, a slice capped at gpu_memory_mib and gpu_cores_pct, or a Slurm
    # shard; and the accelerator's vendor, whose variables and resources pin it.
    vendor: str = "nvidia"
    share: str = "whole"
    mig_profile: str = ""
    gpu_memory_mib: int = 0
    gpu_cores_pct: int = 0
    # Preemption and restarts (docs/architecture/lending.md). A preemptible job is warned before
    # it is stopped: Slurm sends USR1 to its batch shell grace_s before (--signal=B:USR1@grace_s),
    # Kubernetes and the local cluster SIGTERM with grace_s to finish. `borrowing`: it runs on
    # GPUs lent by another tenant (Slurm: the borrowing QOS, which the tiers' QOS preempt).
    # checkpoint_key names the job's checkpoint directory in its tenant's scratch, the same for
    # every attempt (PORTAL_CHECKPOINT_DIR); attempt counts from 1 (PORTAL_ATTEMPT).
    preemptible: bool = False
    borrowing: bool = False
    grace_s: int = 0
    attempt: int = 1
    checkpoint_key: str = ""
    restarts: bool = False  # the portal restarts it after a node failure: the scheduler must not requeue it

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * self.nodes


@dataclass(frozen=True)
class JobStatus:
    backend_id: str
    state: str  # one of the portal states above
    raw_state: str  # the scheduler's own word for it (PENDING, OUT_OF_MEMORY, BackoffLimitExceeded…)
    reason: str = ""  # why it waits or ended (AssocGrpGRES, Resources, OOMKilled…)
    exit_code: int | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    node_list: str = ""


@dataclass(frozen=True)
class JobRef:
    """Enough to find a submitted job's files and objects again."""

    backend_id: str
    token: str
    account: str
    user: str = ""  # the identity it runs as (JobSpec.user): its files and its scancel are that identity's


@dataclass(frozen=True)
class LogTail:
    lines: list[str]
    truncated: bool  # more came before these lines than were returned


@dataclass(frozen=True)
class PartitionInfo:
    name: str
    gpu_type: str
    gpus_per_node: int
    nodes: int
    gpus_free: int
    max_walltime_minutes: int | None


@dataclass(frozen=True)
class TenantLimits:
    """A tenant's limits on one cluster, from its active grants."""

    account: str
    qos: str
    users: list[str]  # cluster users that may submit under the account
    gpus_by_type: dict[str, int]  # GRES type → concurrent GPUs (GrpTRES); MIG profiles are types
    gpu_minutes: int  # GPU-minutes granted by the active grants (GrpTRESMins)
    k8s_resources: dict[str, int] = field(default_factory=dict)  # resource name → count (ResourceQuota)
    shards: int = 0  # concurrent Slurm shards (GrpTRES gres/shard)
    # Its place in a lending cohort (Kueue clusters: the ClusterQueue's cohort, lendingLimit and
    # borrowingLimit per resource, in the same units as k8s_resources): "" when in none.
    cohort: str = ""
    k8s_lending: dict[str, int] = field(default_factory=dict)
    k8s_borrowing: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Health:
    healthy: bool
    detail: str


@dataclass(frozen=True)
class SchedulerJob:
    """A job the scheduler holds now under one of the portal's accounts (namespaces), with the
    portal token it carries ("" when it carries none): what the orphan check compares."""

    backend_id: str
    token: str
    account: str
    state: str  # a portal state, as in JobStatus
    user: str = ""  # the identity it runs as ("" where the scheduler has no users: Kubernetes)


@dataclass(frozen=True)
class PurgeReport:
    """What a scratch purge deleted (or would delete, dry run) and what it refused, each path
    relative to the tenant's scratch directory; refused maps a path to the reason."""

    deleted: list[str]
    refused: dict[str, str]
    bytes_freed: int
    dry_run: bool


@dataclass(frozen=True)
class GpuSample:
    """One job's GPUs at one moment: utilization (lowest, highest, mean over its GPUs) and, where
    the source has them, framebuffer memory (summed), the hottest GPU's temperature, power
    (summed) and the last XID error any of them reported (0: none). None: not reported."""

    backend_id: str
    gpus: int
    min_pct: float
    max_pct: float
    mean_pct: float
    memory_used_mib: float | None = None
    memory_total_mib: float | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    xid: int | None = None


# The longest a scratch purge of one tenant tree may take (a walk over a shared filesystem):
# purge_scratch's commands run under it, and the purge task's time limit is set from it.
PURGE_TIMEOUT_S = 300


class Backend(Protocol):
    """What dispatch, the poll and the cleanup ask of a scheduler. Backends subclass it: the
    batch methods below have a per-job default, which a scheduler that can do better overrides
    (Slurm: one SSH exec for a whole batch of sbatch calls)."""

    # The most jobs dispatch hands one submit_many call: 1 where submitting in batches gains
    # nothing (each job is its own API call), so that a batch holds no worker longer than a job.
    SUBMIT_BATCH = 1

    def submit(self, spec: JobSpec) -> str:
        """Submit; return the scheduler's id. Raises BackendUnavailable or BackendError."""

    def submit_many(self, specs: list[JobSpec]) -> list[str | BackendError | None]:
        """Submit each job; per job, in order: the scheduler's id, the BackendError that refused
        it (BackendUnavailable: try it again), or None when its outcome is unknown (the
        connection was cut while it was being submitted: find(token) tells later). Raises
        BackendUnavailable only when none of them reached the scheduler."""
        results: list[str | BackendError | None] = []
        for spec in specs:
            try:
                results.append(self.submit(spec))
            except BackendError as exc:  # BackendUnavailable included: this job is tried again
                results.append(exc)
        return results

    def find(self, token: str, *, account: str = "", user: str = "") -> str | None:
        """The scheduler's id of the job carrying this token, or None. Where the scheduler knows
        accounts and users (Slurm), a job counts only if its account and user are these too: a
        job that another identity submitted with a copied token is never adopted."""

    def find_many(self, jobs: list[JobRef]) -> dict[str, str]:
        """find() for many jobs: token → scheduler id of those the scheduler holds under their
        own account and identity; the others are left out."""
        found = ((ref.token, self.find(ref.token, account=ref.account, user=ref.user)) for ref in jobs)
        return {token: backend_id for token, backend_id in found if backend_id}

    def cancel(self, backend_id: str, *, user: str = "") -> None:
        """Cancel the job, as `user` where the scheduler has users (as the cluster's operator
        when user is "": an orphan that no identity of the portal's owns)."""

    def warn(self, backend_id: str, *, user: str = "", grace_s: int = 0) -> None:
        """Warn a running job that it will be stopped in grace_s seconds, so that it saves a
        checkpoint (Slurm: USR1 to its batch shell; Kubernetes: the pods deleted with that grace,
        SIGTERM first; local: SIGTERM). The portal stops it with cancel() once the grace is out.
        A job that is not running is left as it is."""

    def poll(self, backend_ids: list[str]) -> dict[str, JobStatus]:
        """Status of each job, in a bounded number of scheduler calls whatever the count. A job
        the scheduler no longer knows at all is left out of the answer."""

    def log_tail(self, job: JobRef, *, lines: int, max_bytes: int) -> LogTail:
        """The last `lines` lines of the job's output, reading at most `max_bytes`."""

    def inventory(self) -> list[PartitionInfo]: ...

    def apply_tenant(self, limits: TenantLimits) -> None:
        """Create or update the tenant's account/namespace and its limits. Idempotent."""

    def identities_check(self, users: list[str]) -> dict[str, str]:
        """Per job identity, "" when it can run jobs on the cluster, else what is wrong (no such
        user, not in the job identities' group). {} where the cluster has no identities."""

    def health(self) -> Health: ...

    def list_jobs(self, accounts: list[str]) -> list[SchedulerJob]:
        """Every job the scheduler holds now (not ended) under these accounts, with its token;
        a bounded number of scheduler calls whatever the count."""

    def purge_scratch(
        self, account: str, *, older_than_days: int, dry_run: bool, users: tuple[str, ...] = ()
    ) -> PurgeReport:
        """Delete files older than `older_than_days` under the account's scratch directory and
        nowhere else: a path outside it, or a symlink leading out, is refused and reported.
        Runs fixed argv lists; no path from a user reaches a shell. Where jobs run as
        identities (`users`, the account's), each identity's directory is purged as itself."""

    def delete_finished(
        self,
        accounts: list[str],
        *,
        older_than_s: int,
        dry_run: bool,
        users: dict[str, list[str]] | None = None,
    ) -> list[str]:
        """Delete scheduler objects of jobs that ended more than `older_than_s` ago and that the
        scheduler kept (Kubernetes Jobs past their TTL; Slurm: job logs, as each identity of
        `users`, account → identities); the ids deleted. Others keep nothing: []."""

    def gpu_utilization(self, backend_ids: list[str]) -> dict[str, GpuSample]:
        """Per-job GPU utilization where the backend can read it (the local backend through
        nvidia-smi); {} where it cannot (then a cluster's Prometheus/DCGM URL may)."""
