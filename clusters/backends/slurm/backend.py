"""SlurmBackend: jobs on a Slurm cluster through its login node (docs/architecture.md, Backends)."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

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
from clusters.backends.slurm import accounts, scratch, ssh
from clusters.backends.slurm.parse import (
    BATCH_EXIT_MKTEMP,
    NO_VALUE,
    SBATCH_BATCH_SH,
    SLURM_END_STATES,
    TOKEN_RE,
    batch_answers,
    batch_job_lines,
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
    sbatch_job_id,
    slurm_time,
    wait_status_exit_code,
)
from clusters.shares import ShareKind, slurm_gres

# Ids per squeue and per sacct: 10,000 ids of 8 digits make a command line of 90 kB, below the
# 128 kB that Linux allows the one argument (`$SHELL -c <command>`) through which sshd runs it.
POLL_CHUNK = 10_000
# Accounts per squeue of list_jobs: 500 names of at most 64 characters keep it near 32 kB.
ACCOUNT_CHUNK = 500
# squeue and sacct print times in the login node's local zone, without an offset: run them in UTC.
UTC_ENV = ["env", "TZ=UTC"]
SQUEUE_FIELDS = "JobID:|,State:|,Reason:|,NodeList:|,StartTime:|,EndTime:|,exit_code:|"
SACCT_FIELDS = "JobID,State,ExitCode,Start,End,NodeList,Reason"
LOG_ACCOUNTS_PER_CALL = 100  # tenant directories per find of old job logs
# A path that the batch's shell script keeps in a "|"-separated list and compares as text.
SCRATCH_ROOT_RE = re.compile(r"/[A-Za-z0-9_./-]*")
USABLE_NODE_STATES = {"idle", "mixed", "allocated", "completing", "planned"}


@dataclass(frozen=True)
class _Record:
    raw_state: str
    reason: str
    node_list: str
    start: str
    end: str
    exit_code: int | None


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

    def _legacy_user(self, user: str) -> str:
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
        """Submit several jobs in one SSH exec: a fixed remote script (parse.SBATCH_BATCH_SH)
        creates the jobs' directories and calls sbatch once per job, each job's options and
        script arriving on stdin as data. Answers per spec, in order: the Slurm job id; a
        BackendError for a job refused for good (a spec that fails its checks, or sbatch's no);
        BackendUnavailable for a transient refusal (sbatch exited: the job is not submitted, or
        find(token) will know); or None when the batch was cut off before that job's answer
        came (timeout, connection lost): it may or may not have been submitted. Raises
        BackendUnavailable (or BackendError) when nothing could run: no connection, no
        temporary file on the login node."""
        results: list[str | BackendError | None] = [None] * len(specs)
        parts: dict[str, tuple[int, str]] = {}  # token → (index in specs, its stdin lines)
        for index, spec in enumerate(specs):
            try:
                if spec.token in parts:
                    raise BackendError(f"job token {spec.token} twice in one batch")
                argv, script, directory = self._sbatch_request(spec)
                parts[spec.token] = (index, batch_job_lines(spec.token, spec.user, directory, argv, script))
            except BackendError as exc:
                results[index] = exc
        if not parts:
            return results
        stdin = "".join(lines for _index, lines in parts.values())
        result = self.run(
            ["sh", "-c", SBATCH_BATCH_SH],
            stdin=stdin,
            timeout_s=min(2 * self.command_timeout_s, self.command_timeout_s + len(parts)),
            partial=True,
        )
        if result.rc == BATCH_EXIT_MKTEMP:  # before any sbatch
            raise ssh.failure(replace(result, argv=["mktemp"]))
        answers = batch_answers(result.stdout)
        for token, (index, _lines) in parts.items():
            if token not in answers:
                continue  # never reached (rc 0 or 64: not submitted) or cut off (rc None): unknown
            rc, text = answers[token]
            job_id = sbatch_job_id(text) if rc == 0 else None
            if job_id:
                results[index] = job_id
            elif rc == 0:
                results[index] = BackendError(f"sbatch answered {text[:200]!r}, not a job id")
            else:
                results[index] = ssh.failure(ssh.CommandResult(["sbatch"], rc, "", text))
        if result.rc is not None and result.rc >= 0:
            # The script exited (not killed: the shell waits for each sbatch), so a job it did not
            # answer was never reached. Cut off or killed, an sbatch may still be on its way: unknown.
            for index in (index for index, _lines in parts.values() if results[index] is None):
                results[index] = BackendUnavailable(f"sbatch batch ended with {result.rc}: {result.message}")
        return results

    def _sbatch_request(self, spec: JobSpec) -> tuple[list[str], str, str]:
        """sbatch's arguments, the rendered script and the job's directory, every value checked."""
        check_token(spec.token)
        check_job_name(spec.name)
        for value, what in ((spec.account, "account"), (spec.qos, "QOS"), (spec.partition, "partition")):
            check_name(value, what)
        check_name(spec.gpu_type, "GPU type")  # typed always: an untyped request slips past typed limits
        if spec.share not in (ShareKind.WHOLE, ShareKind.MIG, ShareKind.SHARD):
            raise BackendError(f"Slurm gives whole GPUs, MIG instances and shards, not a {spec.share}")
        if spec.share == ShareKind.MIG:
            check_name(spec.mig_profile, "MIG profile")  # a typed GRES, as AutoDetect=nvml names it
        for value, what in (
            (spec.gpus_per_node, "GPUs per node"),
            (spec.nodes, "node count"),
            (spec.walltime_minutes, "walltime"),
            (spec.cpus_per_gpu, "CPUs per GPU"),
            (spec.mem_per_gpu_mb, "memory per GPU"),
        ):
            check_count(value, what)
        directory = self.job_dir(spec.account, spec.user)
        restart_env = _restart_env(spec, directory)
        script = render_script(
            spec.script,
            {**spec.env, **restart_env},
            then='mkdir -p -m 0700 -- "$PORTAL_CHECKPOINT_DIR"\n' if restart_env else "",
        )
        output = f"{directory}/{spec.token}.out"
        argv = [
            "--parsable",
            f"--job-name={spec.name}",
            f"--account={spec.account}",
            f"--qos={spec.qos}",
            f"--partition={spec.partition}",
            "--gres=" + _gres(spec),
            f"--nodes={spec.nodes}",
            f"--time={spec.walltime_minutes}",
            *_cpus_and_memory(spec),
            f"--comment={spec.token}",
            f"--output={output}",
            f"--error={output}",
            f"--chdir={directory}",
            *_preemption(spec),
        ]
        return argv, script, directory

    def find(self, token: str, *, account: str = "", user: str = "") -> str | None:
        """The job submitted with --comment=<token> under the account by the identity: None
        only when squeue and sacct both answered and neither knows such a job."""
        return self.find_many([JobRef(backend_id="", token=token, account=account, user=user)]).get(token)

    def find_many(self, jobs: list[JobRef]) -> dict[str, str]:
        """The jobs submitted with these tokens, token → job id (the oldest, should a token be
        there twice: the portal's own submission came first, a copy after it), in one squeue and,
        for the tokens squeue does not know, one sacct, over the jobs' accounts and identities.
        A scheduler job counts only when its token, account and user are all the portal job's:
        another identity's job that copied a token (or a job submitted by hand under the
        tenant's account) is never adopted. A token left out is unknown to both."""
        owners = {
            check_token(job.token): (
                check_name(job.account, "account").lower(),
                check_name(self._legacy_user(job.user), "cluster identity"),
            )
            for job in jobs
        }
        found = self._queued_ids(owners) if owners else {}
        if missing := {token: owner for token, owner in owners.items() if token not in found}:
            found |= self._accounted_ids(missing)
        return {token: min(ids, key=int) for token, ids in found.items()}

    def _queued_ids(self, owners: dict[str, tuple[str, str]]) -> dict[str, list[str]]:
        """slurmctld's jobs (pending, running, ended less than MinJobAge ago) of these accounts,
        comment included. The service user is an Operator: PrivateData does not hide them from it."""
        accounts = ",".join(sorted({account for account, _user in owners.values()}))
        argv = ["squeue", "-h", "-t", "all", "-A", accounts, "-o", "%i|%a|%u|%k"]
        found: dict[str, list[str]] = {}
        for job_id, account, user, comment in _split(self.check(argv), 4):
            if owners.get(comment) == (account.lower(), user) and job_id.isdigit():
                found.setdefault(comment, []).append(job_id)
        return found

    def _accounted_ids(self, owners: dict[str, tuple[str, str]]) -> dict[str, list[str]]:
        """slurmdbd's jobs of the last find_window_days under these accounts. Its Comment stays
        empty unless slurm.conf has AccountingStoreFlags=job_comment, but 22.05 stores the
        SubmitLine, which holds our --comment=<token> (the script came on stdin: a short line)."""
        window = f"now-{check_count(self.find_window_days, 'find window')}days"
        accounts = ",".join(sorted({account for account, _user in owners.values()}))
        argv = ["sacct", "-X", "-P", "-n", "-a", "-A", accounts, "-S", window]
        stdout = self.check([*argv, "-o", "JobID,Account,User,Comment,SubmitLine"])
        found: dict[str, list[str]] = {}
        for job_id, account, user, comment, submit_line in _split(stdout, 5):
            if not job_id.isdigit():
                continue
            words = submit_line.split()
            flags = {word.removeprefix("--comment=") for word in words if word.startswith("--comment=")}
            for token in ({comment} | flags) & owners.keys():
                if owners[token] == (account.lower(), user):
                    found.setdefault(token, []).append(job_id)
        return found

    def poll(self, backend_ids: list[str]) -> dict[str, JobStatus]:
        """One squeue and one sacct per POLL_CHUNK ids (two calls up to 10,000 jobs). squeue has
        the live state and the pending reason; sacct has jobs slurmctld forgot, exit codes and times."""
        ids = sorted({check_job_id(backend_id) for backend_id in backend_ids}, key=int)
        chunks = [",".join(ids[start : start + POLL_CHUNK]) for start in range(0, len(ids), POLL_CHUNK)]
        live: dict[str, _Record] = {}
        accounted: dict[str, _Record] = {}
        for chunk in chunks:
            live.update(self._squeue(chunk))
        for chunk in chunks:
            accounted.update(self._sacct(chunk))
        statuses: dict[str, JobStatus] = {}
        for job_id in ids:
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
        """The log's last bytes read as the job's identity (tail -c through the sudoers rule):
        the service user has no access to the identity's files of its own. One byte more than
        max_bytes tells whether anything came before."""
        if not job.user:
            return self._legacy_log_tail(job, lines=lines, max_bytes=max_bytes)
        path = f"{self.job_dir(job.account, job.user)}/{check_token(job.token)}.out"
        limit = check_count(max(max_bytes, 0) + 1, "log bytes")
        result = self.run(self.as_identity(job.user, ["tail", "-c", str(limit), "--", path]))
        if result.rc != 0:
            if "No such file or directory" in result.stderr:
                return LogTail(lines=[], truncated=False)
            raise ssh.failure(replace(result, argv=["tail"]))
        data = result.stdout
        cut = len(data.encode()) > max_bytes
        text = data.splitlines()
        if cut and text:
            text = text[1:]  # the first line was cut by the byte limit
        keep = text[-lines:] if lines > 0 else []
        return LogTail(lines=keep, truncated=cut or len(keep) < len(text))

    def _legacy_log_tail(self, job: JobRef, *, lines: int, max_bytes: int) -> LogTail:
        """The log of a job submitted before jobs ran as identities: the service user wrote it,
        under its own home (or the scratch root) in <account>/<token>.out; read over SFTP."""
        root = self.config.scratch_root.rstrip("/")
        if not root.startswith("/"):
            home = ssh.home_directory(self.config, self.connect_timeout_s, self.command_timeout_s).rstrip("/")
            root = f"{home}/{root or 'portal-jobs'}"
        path = f"{root}/{check_name(job.account, 'account')}/{check_token(job.token)}.out"
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
            stdout = self.check(["squeue", "-h", "-t", "all", "-A", chunk, "-o", "%i|%a|%T|%u|%k"])
            for job_id, account, raw_state, user, comment in _split(stdout, 5):
                state = portal_state(raw_state, started=False)
                if account.lower() not in by_name or state in base.END_STATES:
                    continue
                token = comment if TOKEN_RE.fullmatch(comment) else ""
                jobs.append(SchedulerJob(job_id, token, by_name[account.lower()], state, user=user))
        return jobs

    def purge_scratch(
        self, account: str, *, older_than_days: int, dry_run: bool, users: tuple[str, ...] = ()
    ) -> PurgeReport:
        """Per identity of the account, one find under <scratch root>/<identity>/<account>, run
        as that identity, that lists and deletes in the same walk (scratch.py says what it
        deletes and refuses, and why no second command touches a path): the purge can delete
        nothing the tenant's own jobs could not. A directory not made yet has nothing to purge."""
        days = check_count(older_than_days, "purge age in days")
        check_name(account, "account")
        reports: list[tuple[str, PurgeReport]] = []
        for user in sorted(set(users)):
            directory = self.job_dir(account, user)
            result = self.run(
                self.as_identity(user, scratch.purge_argv(directory, older_than_days=days, dry_run=dry_run)),
                timeout_s=max(self.command_timeout_s, base.PURGE_TIMEOUT_S),
            )
            report = scratch.parse_report(result.stdout, dry_run=dry_run)
            if result.rc != 0 and not (not result.stdout and "No such file or directory" in result.stderr):
                if result.rc != 1:  # 1: find went on past an entry it could not read or delete
                    raise ssh.failure(replace(result, argv=["find"]))
                report = scratch.with_errors(report, result.stderr)
            reports.append((user, report))
        return scratch.merged(reports, dry_run=dry_run)

    def delete_finished(
        self,
        accounts: list[str],
        *,
        older_than_s: int,
        dry_run: bool,
        users: dict[str, list[str]] | None = None,
    ) -> list[str]:
        """The job logs (<identity>/<account>/<token>.out) older than `older_than_s`, in one find
        per identity and 100 of its accounts, run as that identity; returned as
        "<account>/<token>.out". slurmctld forgets an ended job by itself (MinJobAge) and the
        accounting records are the site's to keep."""
        minutes = check_count(max(older_than_s // 60, 1), "log age in minutes")
        by_user: dict[str, list[str]] = {}
        for account in accounts:
            for user in (users or {}).get(account, []):
                by_user.setdefault(user, []).append(account)
        deleted: list[str] = []
        for user, chunk in (
            (user, owned[start : start + LOG_ACCOUNTS_PER_CALL])
            for user, owned in sorted(by_user.items())
            for start in range(0, len(owned), LOG_ACCOUNTS_PER_CALL)
        ):
            directories = [self.job_dir(account, user) for account in chunk]
            argv = scratch.old_logs_argv(directories, older_than_minutes=minutes, dry_run=dry_run)
            result = self.run(
                self.as_identity(user, argv), timeout_s=max(self.command_timeout_s, base.PURGE_TIMEOUT_S)
            )
            if result.rc not in (0, 1):  # 1: a tenant directory not made yet, or an unreadable entry
                raise ssh.failure(replace(result, argv=["find"]))
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

    def identities_check(self, users: list[str]) -> dict[str, str]:
        """Per identity, whether the service user may act as it: one harmless command through the
        sudoers rule (`tail -c 0 /dev/null`), which fails for a user that does not exist, is
        outside the job identities' group, or is root or the service user itself), and whether
        it owns its tree <scratch root>/<identity>, which the site makes with the identity."""
        problems = {}
        for user in sorted(set(users)):
            try:
                argv = self.as_identity(user, ["tail", "-c", "0", "/dev/null"])
                top = self.job_dir("x", user).rpartition("/")[0]
            except BackendError as exc:
                problems[user] = str(exc)
                continue
            result = self.run(argv)
            if result.rc != 0:
                if "unknown user" in result.message:
                    problems[user] = f"no user {user} on the login node"
                else:
                    problems[user] = f"the service user may not act as {user}: {result.message[:200]}"
                continue
            owner = self.run(["stat", "-c", "%U", "--", top])
            problems[user] = (
                "" if owner.stdout.strip() == user else f"{top} is missing or not owned by {user}"
            )
        return problems

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
    running = state not in (base.JobState.PENDING,)
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


def _restart_env(spec: JobSpec, directory: str) -> dict[str, str]:
    """The checkpoint contract's variables (README): the job's checkpoint directory in its
    identity's tree, the same for every attempt; the attempt; the signal it is warned with."""
    if not spec.checkpoint_key:
        return {}
    check_name(spec.checkpoint_key, "checkpoint key")
    return {
        "PORTAL_CHECKPOINT_DIR": f"{directory}/checkpoints/{spec.checkpoint_key}",
        "PORTAL_ATTEMPT": str(check_count(spec.attempt, "attempt")),
        "PORTAL_PREEMPT_SIGNAL": "USR1",
    }


def _preemption(spec: JobSpec) -> list[str]:
    """A preemptible job's batch shell gets USR1 grace_s before its end (its walltime's, or a
    preemption's: PreemptParameters=send_user_signal); one the portal restarts is not requeued by
    Slurm, whose node failure or preemption then ends it, and the portal submits the next attempt."""
    options = []
    if spec.preemptible and spec.grace_s:
        options.append(f"--signal=B:USR1@{check_count(spec.grace_s, 'grace')}")
    if spec.preemptible or spec.restarts:
        options.append("--no-requeue")
    return options


def _gres(spec: JobSpec) -> str:
    kind, per_node = spec.share, spec.gpus_per_node
    return slurm_gres(kind=kind, gpu_type=spec.gpu_type, mig_profile=spec.mig_profile, per_node=per_node)


def _cpus_and_memory(spec: JobSpec) -> list[str]:
    """CPUs and memory per unit: per GPU for whole GPUs and MIG instances (typed gres/gpu); for
    shards, which are no gres/gpu, per node (sbatch refuses --cpus-per-gpu without a GPU)."""
    if spec.share == ShareKind.SHARD:
        return [
            "--ntasks-per-node=1",
            f"--cpus-per-task={spec.cpus_per_gpu * spec.gpus_per_node}",
            f"--mem={spec.mem_per_gpu_mb * spec.gpus_per_node}M",
        ]
    return [f"--cpus-per-gpu={spec.cpus_per_gpu}", f"--mem-per-gpu={spec.mem_per_gpu_mb}M"]
