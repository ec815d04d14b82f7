"""SlurmBackend: jobs on a Slurm cluster through its login node (DESIGN.md, Backends)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from clusters.backends import base
from clusters.backends.base import (
    BackendError,
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
from clusters.backends.slurm import accounts, scratch, ssh
from clusters.backends.slurm.parse import (
    NO_VALUE,
    SLURM_END_STATES,
    TOKEN_RE,
    check_count,
    check_job_id,
    check_job_name,
    check_name,
    check_token,
    gpu_gres,
    minutes,
    portal_state,
    render_script,
    sacct_exit_code,
    slurm_time,
    wait_status_exit_code,
)

# Ids per squeue/sacct pair: 1000 ids of 8 digits keep the command line near 9 kB, far below
# any sshd or ARG_MAX limit. More ids than that take one squeue and one sacct per 1000.
POLL_CHUNK = 1000
# Accounts per squeue of list_jobs: 500 names of at most 64 characters keep it near 32 kB.
ACCOUNT_CHUNK = 500
# squeue and sacct print times in the login node's local zone, without an offset: run them in UTC.
UTC_ENV = ["env", "TZ=UTC"]
SQUEUE_FIELDS = "JobID:|,State:|,Reason:|,NodeList:|,StartTime:|,EndTime:|,exit_code:|"
SACCT_FIELDS = "JobID,State,ExitCode,Start,End,NodeList,Reason"
# A purge walks a whole tenant tree on a shared filesystem: more time than a Slurm command.
PURGE_TIMEOUT_S = 300
LOG_ACCOUNTS_PER_CALL = 100  # tenant directories per find of old job logs
USABLE_NODE_STATES = {"idle", "mixed", "allocated", "completing", "planned"}


@dataclass(frozen=True)
class _Record:
    raw_state: str
    reason: str
    node_list: str
    start: str
    end: str
    exit_code: int | None


class SlurmBackend:
    """Slurm over SSH. `commands` lists the argv of every remote command this instance ran."""

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
        self, argv: list[str], *, stdin: str | None = None, timeout_s: float | None = None
    ) -> ssh.CommandResult:
        """Run argv on the login node through the pooled connection; any exit status."""
        return ssh.run(
            self.config,
            argv,
            stdin=stdin,
            connect_timeout_s=self.connect_timeout_s,
            timeout_s=timeout_s or self.command_timeout_s,
            record=self.commands,
        )

    def check(self, argv: list[str], *, stdin: str | None = None) -> str:
        """Run argv; its stdout, or BackendError/BackendUnavailable with Slurm's message."""
        result = self.run(argv, stdin=stdin)
        if result.rc != 0:
            raise ssh.failure(result)
        return result.stdout

    def _job_dir(self, account: str) -> str:
        root = self.config.scratch_root.rstrip("/")
        if not root.startswith("/"):
            home = ssh.home_directory(self.config, self.connect_timeout_s, self.command_timeout_s).rstrip("/")
            root = f"{home}/{root or 'portal-jobs'}"
        return f"{root}/{check_name(account, 'account')}"

    # ------------------------------------------------------------------- jobs --
    def submit(self, spec: JobSpec) -> str:
        check_token(spec.token)
        check_job_name(spec.name)
        for value, what in ((spec.account, "account"), (spec.qos, "QOS"), (spec.partition, "partition")):
            check_name(value, what)
        check_name(spec.gpu_type, "GPU type")  # typed always: an untyped request slips past typed limits
        for value, what in (
            (spec.gpus_per_node, "GPUs per node"),
            (spec.nodes, "node count"),
            (spec.walltime_minutes, "walltime"),
            (spec.cpus_per_gpu, "CPUs per GPU"),
            (spec.mem_per_gpu_mb, "memory per GPU"),
        ):
            check_count(value, what)
        script = render_script(spec.script, spec.env)
        directory = self._job_dir(spec.account)
        output = f"{directory}/{spec.token}.out"
        self.check(["mkdir", "-p", "--", directory])
        stdout = self.check(
            [
                "sbatch",
                "--parsable",
                f"--job-name={spec.name}",
                f"--account={spec.account}",
                f"--qos={spec.qos}",
                f"--partition={spec.partition}",
                f"--gres=gpu:{spec.gpu_type}:{spec.gpus_per_node}",
                f"--nodes={spec.nodes}",
                f"--time={spec.walltime_minutes}",
                f"--cpus-per-gpu={spec.cpus_per_gpu}",
                f"--mem-per-gpu={spec.mem_per_gpu_mb}M",
                f"--comment={spec.token}",
                f"--output={output}",
                f"--error={output}",
                f"--chdir={directory}",
            ],
            stdin=script,  # sbatch reads the script from stdin when given no file
        )
        job_id = stdout.strip().split(";")[0]  # "123" or "123;cluster"
        if not job_id.isdigit():
            raise BackendError(f"sbatch answered {stdout.strip()[:200]!r}, not a job id")
        return job_id

    def find(self, token: str) -> str | None:
        """The job submitted with --comment=<token>: None only when squeue and sacct both
        answered and neither knows it."""
        check_token(token)
        ids = self._find_queued(token) or self._find_accounted(token)
        return max(ids, key=int) if ids else None

    def _find_queued(self, token: str) -> list[str]:
        """slurmctld's jobs (pending, running, ended less than MinJobAge ago), comment included."""
        stdout = self.check(["squeue", "-h", "-t", "all", "-u", self.config.ssh_user, "-o", "%i|%k"])
        return [job_id for job_id, comment in _split(stdout, 2) if comment == token and job_id.isdigit()]

    def _find_accounted(self, token: str) -> list[str]:
        """slurmdbd's jobs of the last find_window_days. Its Comment stays empty unless slurm.conf
        has AccountingStoreFlags=job_comment, but 22.05 stores the SubmitLine, which holds our
        --comment=<token> (the script came on stdin, so the line is short)."""
        window = f"now-{check_count(self.find_window_days, 'find window')}days"
        argv = ["sacct", "-X", "-P", "-n", "-u", self.config.ssh_user, "-S", window]
        stdout = self.check([*argv, "-o", "JobID,Comment,SubmitLine"])
        flag = f"--comment={token}"
        return [
            job_id
            for job_id, comment, submit_line in _split(stdout, 3)
            if (comment == token or flag in submit_line.split()) and job_id.isdigit()
        ]

    def poll(self, backend_ids: list[str]) -> dict[str, JobStatus]:
        """One squeue and one sacct per POLL_CHUNK ids. squeue has the live state and the
        pending reason; sacct has jobs slurmctld forgot, exit codes and times."""
        ids = sorted({check_job_id(backend_id) for backend_id in backend_ids}, key=int)
        statuses: dict[str, JobStatus] = {}
        for start in range(0, len(ids), POLL_CHUNK):
            chunk = ",".join(ids[start : start + POLL_CHUNK])
            live = self._squeue(chunk)
            accounted = self._sacct(chunk)
            for job_id in ids[start : start + POLL_CHUNK]:
                status = _merge(job_id, live.get(job_id), accounted.get(job_id))
                if status is not None:
                    statuses[job_id] = status
        return statuses

    def _squeue(self, ids: str) -> dict[str, _Record]:
        result = self.run([*UTC_ENV, "squeue", "-h", "-t", "all", "-j", ids, "-O", SQUEUE_FIELDS])
        if result.rc != 0:
            if "Invalid job id specified" in result.stderr:
                return {}  # none of the ids is known to slurmctld any more
            raise ssh.failure(result)
        records = {}
        for job_id, state, reason, nodes, start, end, code, *_rest in _split(result.stdout, 8):
            records[job_id] = _Record(state, reason, nodes, start, end, wait_status_exit_code(code))
        return records

    def _sacct(self, ids: str) -> dict[str, _Record]:
        stdout = self.check([*UTC_ENV, "sacct", "-X", "-P", "-n", "-j", ids, "-o", SACCT_FIELDS])
        records = {}
        for job_id, state, code, start, end, nodes, reason in _split(stdout, 7):
            records[job_id] = _Record(state, reason, nodes, start, end, sacct_exit_code(code))
        return records

    def cancel(self, backend_id: str) -> None:
        result = self.run(["scancel", check_job_id(backend_id)])
        finished = ("already completing or completed", "Invalid job id specified")
        if result.rc != 0 and not any(text in result.stderr for text in finished):
            raise ssh.failure(result)

    def log_tail(self, job: JobRef, *, lines: int, max_bytes: int) -> LogTail:
        path = f"{self._job_dir(job.account)}/{check_token(job.token)}.out"
        with ssh.sftp_session(self.config, self.connect_timeout_s, self.command_timeout_s) as sftp:
            try:
                size = sftp.stat(path).st_size or 0
                start = max(0, size - max(max_bytes, 0))
                with sftp.open(path, "rb") as handle:
                    handle.seek(start)
                    data = handle.read(size - start) if size > start else b""
            except FileNotFoundError:
                return LogTail(lines=[], truncated=False)
        text = data.decode(errors="replace").splitlines()
        if start > 0 and len(text) > 1:
            text = text[1:]  # the first line was cut by the byte limit
        keep = text[-lines:] if lines > 0 else []
        return LogTail(lines=keep, truncated=start > 0 or len(keep) < len(text))

    # ---------------------------------------------------------------- cleanup --
    def list_jobs(self, accounts: list[str]) -> list[SchedulerJob]:
        """One squeue per ACCOUNT_CHUNK accounts, every user's jobs under them: the token is
        the job's --comment (what find() reads too; "" when the comment is not a token). squeue
        alone: sacct's jobs have ended, and an ended job is no orphan."""
        # sacctmgr keeps account names in lower case, and squeue prints them so
        by_name = {check_name(account, "account").lower(): account for account in accounts}
        names = sorted(by_name)
        jobs = []
        for start in range(0, len(names), ACCOUNT_CHUNK):
            chunk = ",".join(names[start : start + ACCOUNT_CHUNK])
            # -t all, filtered here: one table (parse.STATES) says what has ended, as for poll
            stdout = self.check(["squeue", "-h", "-t", "all", "-A", chunk, "-o", "%i|%a|%T|%k"])
            for job_id, account, raw_state, comment in _split(stdout, 4):
                state = portal_state(raw_state, started=False)
                if account.lower() not in by_name or state in base.END_STATES:
                    continue
                token = comment if TOKEN_RE.fullmatch(comment) else ""
                jobs.append(SchedulerJob(job_id, token, by_name[account.lower()], state))
        return jobs

    def purge_scratch(self, account: str, *, older_than_days: int, dry_run: bool) -> PurgeReport:
        """One find under <scratch root>/<account> that lists and deletes in the same walk
        (scratch.py says what it deletes and refuses, and why no second command touches a path).
        A tenant directory that does not exist yet has nothing to purge."""
        days = check_count(older_than_days, "purge age in days")
        directory = self._job_dir(account)
        result = self.run(
            scratch.purge_argv(directory, older_than_days=days, dry_run=dry_run),
            timeout_s=max(self.command_timeout_s, PURGE_TIMEOUT_S),
        )
        report = scratch.parse_report(result.stdout, dry_run=dry_run)
        if result.rc == 0:
            return report
        if not result.stdout and "No such file or directory" in result.stderr:
            return report  # the start point itself is missing: nothing was ever written there
        if result.rc != 1:  # 1: find went on past an entry it could not read or delete
            raise ssh.failure(result)
        return scratch.with_errors(report, result.stderr)

    def delete_finished(self, accounts: list[str], *, older_than_s: int, dry_run: bool) -> list[str]:
        """The job logs (<account>/<token>.out) older than `older_than_s`, in one find per 100
        accounts; returned as "<account>/<token>.out". slurmctld forgets an ended job by itself
        (MinJobAge) and the accounting records are the site's to keep."""
        minutes = check_count(max(older_than_s // 60, 1), "log age in minutes")
        deleted: list[str] = []
        for start in range(0, len(accounts), LOG_ACCOUNTS_PER_CALL):
            chunk = accounts[start : start + LOG_ACCOUNTS_PER_CALL]
            directories = [self._job_dir(account) for account in chunk]
            argv = scratch.old_logs_argv(directories, older_than_minutes=minutes, dry_run=dry_run)
            result = self.run(argv, timeout_s=max(self.command_timeout_s, PURGE_TIMEOUT_S))
            if result.rc not in (0, 1):  # 1: a tenant directory not made yet, or an unreadable entry
                raise ssh.failure(result)
            for path in filter(None, result.stdout.split("\0")):
                directory, _slash, name = path.rpartition("/")
                deleted.append(f"{directory.rpartition('/')[2]}/{name}")
        return deleted

    def gpu_utilization(self, backend_ids: list[str]) -> dict[str, GpuSample]:
        """Not read through Slurm: {} (a cluster's Prometheus/DCGM URL may have it)."""
        return {}

    # ----------------------------------------------------------------- cluster --
    def inventory(self) -> list[PartitionInfo]:
        """One line per (partition, node) from sinfo. A partition named after one of its
        nodes' GPU types offers that type; otherwise one entry per type its nodes have."""
        fields = "PartitionName:|,NodeList:|,Gres:|,GresUsed:|,Time:|,StateLong:|"
        stdout = self.check(["sinfo", "-h", "-N", "-O", fields])
        partitions: dict[str, dict[str, PartitionInfo]] = {}
        for partition, _node, gres, used, limit, state, *_rest in _split(stdout, 7):
            usable = state.rstrip("*~#!%$@^-+").lower() in USABLE_NODE_STATES
            used_counts = gpu_gres(used)
            by_type = partitions.setdefault(partition, {})
            for gpu_type, total in gpu_gres(gres).items():
                free = max(total - used_counts.get(gpu_type, 0), 0) if usable else 0
                info = by_type.get(gpu_type) or PartitionInfo(partition, gpu_type, 0, 0, 0, minutes(limit))
                by_type[gpu_type] = replace(
                    info,
                    gpus_per_node=max(info.gpus_per_node, total),
                    nodes=info.nodes + 1,
                    gpus_free=info.gpus_free + free,
                )
        result = []
        for partition, by_type in partitions.items():
            result += [by_type[partition]] if partition in by_type else list(by_type.values())
        return result

    def apply_tenant(self, limits: TenantLimits) -> None:
        accounts.apply_tenant(self, limits)

    def health(self) -> Health:
        try:
            result = self.run(["scontrol", "ping"], timeout_s=min(self.command_timeout_s, 10))
        except BackendError as exc:  # BackendUnavailable included
            return Health(False, str(exc))
        except Exception as exc:  # health() never raises: it is what tells admins what broke
            return Health(False, f"{type(exc).__name__}: {exc}")
        answer = " ".join(result.stdout.split()) or result.message
        return Health(result.rc == 0 and "is UP" in answer, answer[:200])


def _split(stdout: str, fields: int) -> list[list[str]]:
    """Lines of "|"-separated fields; the last field takes any further "|"."""
    rows = []
    for line in stdout.splitlines():
        if line.strip():
            row = line.split("|", fields - 1)
            rows.append(row + [""] * (fields - len(row)))
    return rows


def _merge(job_id: str, live: _Record | None, accounted: _Record | None) -> JobStatus | None:
    """slurmctld leads and slurmdbd follows: squeue's word wins while it knows the job, and
    sacct fills in what squeue lacks. sacct alone once slurmctld has forgotten the job."""
    if live is None and accounted is None:
        return None
    if live is None or (accounted is not None and _ended(live) and _ended(accounted)):
        record, reason = accounted, (live or accounted).reason  # type: ignore[union-attr]
    else:
        record, reason = live, live.reason
    assert record is not None
    raw_state = record.raw_state.strip()
    started = slurm_time(record.start)
    state = portal_state(raw_state, started is not None)
    running = state not in (base.PENDING,)
    ended = state in base.END_STATES
    return JobStatus(
        backend_id=job_id,
        state=state,
        raw_state=raw_state,
        reason="" if reason.strip() in NO_VALUE else reason.strip(),
        exit_code=record.exit_code if ended else None,
        started_at=started if running else None,  # squeue's start of a pending job is a guess
        finished_at=slurm_time(record.end) if ended else None,
        node_list="" if record.node_list.strip() in NO_VALUE else record.node_list.strip(),
    )


def _ended(record: _Record) -> bool:
    words = record.raw_state.split()
    return bool(words) and words[0].rstrip("+") in SLURM_END_STATES
