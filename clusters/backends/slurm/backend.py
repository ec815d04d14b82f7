"""SlurmBackend: jobs on a Slurm cluster through its login node (docs/architecture.md, Backends).

The class runs commands and keeps each job identity's directory; the work is done by its
neighbours: sbatch.py (a job's options and script), submit.py (sbatch batches, jobs found by
token), status.py (poll), logs.py (log tails and their retention), scratch.py (the purge),
cluster.py (inventory, identities, health) and accounts.py (tenants' accounts and limits).
"""

from __future__ import annotations

import re

from clusters.backends import base
from clusters.backends.base import (
    BackendError,
    BackendUnavailable,
    ClusterConfig,
    GpuSample,
    Health,
    JobRef,
    JobSpec,
    JobStatus,
    LogTail,
    PartitionInfo,
    PurgeReport,
    SchedulerJob,
    TenantLimits,
)
from clusters.backends.slurm import accounts, cluster, logs, scratch, ssh, status, submit
from clusters.backends.slurm.parse import check_job_id, check_name

# A path that the batch's shell script keeps in a "|"-separated list and compares as text.
SCRATCH_ROOT_RE = re.compile(r"/[A-Za-z0-9_./-]*")


class SlurmBackend(base.Backend):
    """Slurm over SSH. `commands` lists the argv of every remote command this instance ran."""

    # One SSH exec of as many sbatch calls, about 5 ms each: a batch holds its dispatcher well
    # under a second, and its jobs' dispatch leases far less than JOB_DISPATCH_LEASE_S.
    SUBMIT_BATCH = 50

    def __init__(
        self,
        config: ClusterConfig,
        *,
        connect_timeout_s: float = 10,
        command_timeout_s: float = 30,
        find_window_days: int = 7,
    ):
        self.config = config
        self.connect_timeout_s = connect_timeout_s
        self.command_timeout_s = command_timeout_s
        self.find_window_days = find_window_days
        self.commands: list[list[str]] = []

    # ------------------------------------------------------------------ plumbing --
    def run(
        self,
        argv: list[str],
        *,
        stdin: str | None = None,
        timeout_s: float | None = None,
        partial: bool = False,
    ) -> ssh.CommandResult:
        """Run argv on the login node through the pooled connection; any exit status (and with
        `partial`, rc None for a command cut off: ssh.run)."""
        return ssh.run(
            self.config,
            argv,
            stdin=stdin,
            connect_timeout_s=self.connect_timeout_s,
            timeout_s=timeout_s or self.command_timeout_s,
            record=self.commands,
            partial=partial,
        )

    def check(self, argv: list[str], *, stdin: str | None = None) -> str:
        """Run argv; its stdout, or BackendError/BackendUnavailable with Slurm's message."""
        result = self.run(argv, stdin=stdin)
        if result.rc != 0:
            raise ssh.failure(result)
        return result.stdout

    def legacy_user(self, user: str) -> str:
        """Whom a job ran as: a job submitted before jobs ran as identities has none recorded
        and ran as the service user. Matching only: nothing ever runs as that user again."""
        return user or self.config.ssh_user

    def _identity(self, user: str) -> str:
        """A job identity: a valid name that is neither root nor the portal's service user, so
        that no job ever runs as either (the sudoers rule refuses them too)."""
        check_name(user, "cluster identity")
        if user.lower() in {"root", self.config.ssh_user.lower()}:
            raise BackendError(f"jobs never run as {user!r}: give the tenant a cluster identity of its own")
        return user

    def job_dir(self, account: str, user: str) -> str:
        """<scratch root>/<identity>/<account>: the identity's own tree (mode 0700), where its
        jobs of this tenant write their output. The root is the site's, shared by the login node
        and the compute nodes; never the service user's home, which no job may reach."""
        root = self.config.scratch_root.rstrip("/")
        if not SCRATCH_ROOT_RE.fullmatch(root) or "/../" in f"{root}/":
            raise BackendError(
                "the cluster's scratch root must be an absolute path of [A-Za-z0-9_.-/], without '..'"
            )
        return f"{root}/{self._identity(user)}/{check_name(account, 'account')}"

    def as_identity(self, user: str, argv: list[str]) -> list[str]:
        """argv run as a job identity through the service user's one sudoers rule; -n: a rule
        that does not allow it fails at once instead of asking for a password."""
        return ["sudo", "-n", "-u", self._identity(user), "--", *argv]

    # ------------------------------------------------------------------- jobs --
    def submit(self, spec: JobSpec) -> str:
        """One job, as a batch of one (submit_many): the dispatcher sends many at once."""
        (result,) = self.submit_many([spec])
        if isinstance(result, str):
            return result
        raise result or BackendUnavailable("sbatch was cut off: the job may or may not be submitted")

    def submit_many(self, specs: list[JobSpec]) -> list[str | BackendError | None]:
        return submit.submit_many(self, specs)

    def find(self, token: str, *, account: str = "", user: str = "") -> str | None:
        """The job submitted with --comment=<token> under the account by the identity: None
        only when squeue and sacct both answered and neither knows such a job."""
        return self.find_many([JobRef(backend_id="", token=token, account=account, user=user)]).get(token)

    def find_many(self, jobs: list[JobRef]) -> dict[str, str]:
        return submit.find_many(self, jobs)

    def poll(self, backend_ids: list[str]) -> dict[str, JobStatus]:
        return status.poll(self, backend_ids)

    def cancel(self, backend_id: str, *, user: str = "") -> None:
        """scancel as the job's identity; as the service user (an Operator) only for a job that
        no identity of the portal's owns (an orphan: user "")."""
        argv = ["scancel", check_job_id(backend_id)]
        result = self.run(self.as_identity(user, argv) if user else argv)
        finished = ("already completing or completed", "Invalid job id specified")
        if result.rc != 0 and not any(text in result.stderr for text in finished):
            raise ssh.failure(result)

    def warn(self, backend_id: str, *, user: str = "", grace_s: int = 0) -> None:
        """USR1 to the job's batch shell (scancel --batch --signal), as its identity: the job
        script's trap saves a checkpoint (the checkpoint contract). A job no longer running is
        left as it is; the portal stops it with cancel() after the grace."""
        argv = ["scancel", "--batch", "--signal=USR1", check_job_id(backend_id)]
        result = self.run(self.as_identity(user, argv) if user else argv)
        gone = ("already completing or completed", "Invalid job id specified", "pending")
        if result.rc != 0 and not any(text in result.stderr for text in gone):
            raise ssh.failure(result)

    def log_tail(self, job: JobRef, *, lines: int, max_bytes: int) -> LogTail:
        return logs.log_tail(self, job, lines=lines, max_bytes=max_bytes)

    # ---------------------------------------------------------------- cleanup --
    def list_jobs(self, accounts: list[str]) -> list[SchedulerJob]:
        return submit.list_jobs(self, accounts)

    def purge_scratch(
        self, account: str, *, older_than_days: int, dry_run: bool, users: tuple[str, ...] = ()
    ) -> PurgeReport:
        return scratch.purge_scratch(
            self, account, older_than_days=older_than_days, dry_run=dry_run, users=users
        )

    def delete_finished(
        self,
        accounts: list[str],
        *,
        older_than_s: int,
        dry_run: bool,
        users: dict[str, list[str]] | None = None,
    ) -> list[str]:
        return logs.delete_finished(self, accounts, older_than_s=older_than_s, dry_run=dry_run, users=users)

    def gpu_utilization(self, backend_ids: list[str]) -> dict[str, GpuSample]:
        """Not read through Slurm: {} (a cluster's Prometheus/DCGM URL may have it)."""
        return {}

    # ----------------------------------------------------------------- cluster --
    def inventory(self) -> list[PartitionInfo]:
        return cluster.inventory(self)

    def apply_tenant(self, limits: TenantLimits) -> None:
        accounts.apply_tenant(self, limits)

    def identities_check(self, users: list[str]) -> dict[str, str]:
        return cluster.identities_check(self, users)

    def health(self) -> Health:
        return cluster.health(self)
