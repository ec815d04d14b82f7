"""The local cluster: jobs run as processes on the portal's own machine (docs/architecture.md).

For a single shared GPU server and for the demo. Everything lives under config.state_dir:

    alloc.json, alloc.lock   devices in use and the FIFO queue; changed only under flock(alloc.lock)
    ids/<backend id>         the job's token, so that poll and cancel find its directory
    jobs/<token>/            the job's cwd: <token>.sh, <token>.out, and .portal/ with our records
    scratch/<account>/       the tenant's jobs' shared scratch, PORTAL_SCRATCH (or <scratch_root>/<account>)

A job is started through a small Python wrapper (launch.py) in its own session and process
group. The wrapper runs `/bin/bash <token>.sh` in a bubblewrap sandbox (sandbox.py: the job
sees its directory as /job, .portal/ hidden), reaps the job's orphans as a subreaper and writes the
exit code to .portal/status itself, so the code survives the death of the worker that started it.
Where no sandbox can be made the job runs as the portal's user, and the cluster serves one tenant.
.portal/proc.json holds the wrapper's pid (= pgid), start time and boot id, so that any process can
tell the job's group from a later one that reused the pid; .portal/ended_by says why we killed it
(or warned it: then it ends PREEMPTED, however it exits); .portal/end.json is the final record,
written once, under the lock, by whoever first sees the end. A preemptible job's checkpoints live
in <tenant scratch>/checkpoints/<checkpoint key>, the same directory for every attempt (launch.py).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from clusters.backends import base
from clusters.backends.base import BackendError, ClusterConfig, Health, JobRef, JobSpec, JobStatus, LogTail
from clusters.backends.local import cleanup, launch, sandbox
from clusters.backends.local.allocation import Ask, device_env, devices_free, place, refusal
from clusters.backends.local.devices import Device, Machine, discover
from clusters.backends.local.devices import detect_gpus as detect_gpus  # where callers import it from
from clusters.backends.local.devices import parse_nvidia_smi_list as parse_nvidia_smi_list
from clusters.backends.local.records import alive, boot_id, read_json, start_ticks, write_json
from clusters.backends.local.sandbox import Probe

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_TOKEN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")  # a directory and file name: no "/", no ".."
_BACKEND_ID = re.compile(r"^local-[0-9]{1,18}$")
_KILL_WAIT_S = 3.0
_LOCK_TIMEOUT_S = 30.0
_KILLED_BY = {
    "cancelled": (base.JobState.CANCELLED, "CANCELLED", "cancelled"),
    "timeout": (base.JobState.TIMEOUT, "TIMEOUT", "walltime reached"),
    "preempted": (base.JobState.PREEMPTED, "PREEMPTED", "warned of preemption"),
}

# Wrappers this process started, polled so that a long-lived worker keeps no zombies.
_children: dict[int, subprocess.Popen] = {}
_children_lock = threading.Lock()


def _reap() -> None:
    with _children_lock:
        for pid, child in list(_children.items()):
            if child.poll() is not None:
                del _children[pid]


def _finish(
    meta: Path, state: str, raw: str, reason: str, exit_code: int | None = None, **times: Any
) -> dict:
    end = {"state": state, "raw_state": raw, "reason": reason, "exit_code": exit_code}
    end |= {"started_at": None, "finished_at": time.time(), **times}
    write_json(meta / "end.json", end)
    return end


def _dt(timestamp: float | None) -> datetime | None:
    return None if timestamp is None else datetime.fromtimestamp(timestamp, tz=UTC)


class LocalBackend(base.Backend):
    """Runs jobs on this machine: a device is never shared by two jobs, except by slices whose caps
    fit in it together; waiting jobs start FIFO (allocation.py)."""

    def __init__(
        self,
        config: ClusterConfig,
        *,
        minute_s: float = 60.0,
        grace_s: float = 10.0,
        nvidia_smi: str | None = None,
    ) -> None:
        """`minute_s`: how long a minute of walltime lasts, 60 in service; a test/speed knob that
        tests set to about 1 so that a walltime passes quickly. `grace_s`: from SIGTERM to SIGKILL.
        The devices: `local_gpus` whole NVIDIA GPUs where the cluster is configured with a count,
        else what the vendors' tools list (devices.py; `nvidia_smi`, else the config's, for NVIDIA)."""
        self.config = config
        self.minute_s = minute_s
        self.grace_s = grace_s
        count = config.local_gpus
        self.machine: Machine = (
            Machine(tuple(Device("nvidia", index) for index in range(count)))
            if count > 0
            else discover(nvidia_smi or config.nvidia_smi)
        )
        self.gpus: list[int] = [device.index for device in self.machine.of("nvidia")]
        self.sandbox_config = sandbox.SandboxConfig(
            bwrap=config.local_sandbox_bwrap,
            network=config.local_sandbox_network,
            uid_base=config.local_sandbox_uid_base,
            uid_count=config.local_sandbox_uid_count,
            ro_paths=tuple(config.local_sandbox_ro_paths),
            # Masked wherever a mount would show them: the portal's tree and VAR_DIR (the config
            # names them), this cluster's state, and every tenant's scratch under a site root.
            hidden=(
                *config.local_sandbox_hidden,
                *[path for path in (config.state_dir, config.scratch_root) if path.startswith("/")],
            ),
        )

    @property
    def sandbox(self) -> Probe:
        """Whether jobs run sandboxed here: probed once per process (launch.probe)."""
        return launch.probe(self.sandbox_config)

    def submit(self, spec: JobSpec) -> str:
        """Accept the job and return "local-<n>": it starts at once if its share is free (whole
        devices, MIG devices of its profile, or room for its slice), else it waits (PENDING,
        Resources) for a later poll or submit, oldest first. A share this machine can never give is
        refused (BackendError, saying why). A repeat with the same token returns the first id."""
        if spec.nodes != 1:
            raise BackendError("the local cluster has one node")
        ask = Ask.of_spec(spec)
        if (why := refusal(ask, self.machine)) is not None:
            raise BackendError(why)
        if not _TOKEN.match(spec.token):
            raise BackendError(f"invalid job token {spec.token!r}")
        cleanup.check_account(spec.account)  # it names a directory and, sandboxed as root, a uid
        if spec.checkpoint_key and not launch.CHECKPOINT_KEY.fullmatch(spec.checkpoint_key):
            raise BackendError(
                f"invalid checkpoint key {spec.checkpoint_key[:140]!r}: letters, digits, '_', '.', '-' "
                "only, and no '..'"
            )
        if isinstance(spec.attempt, bool) or not isinstance(spec.attempt, int) or spec.attempt < 1:
            raise BackendError(f"invalid attempt {spec.attempt!r}: a count from 1")
        for name, value in [*spec.env.items(), ("PORTAL_JOB_NAME", spec.name)]:
            if not _ENV_NAME.match(name) or "\0" in value:
                raise BackendError(
                    f"invalid environment variable {name!r}: a bad name, or a NUL in its value"
                )
        _reap()
        self.sandbox  # noqa: B018 - probed (once per process) before the lock, not while holding it
        with self._locked() as state:
            if (found := self.find(spec.token)) is not None:
                return found
            self._check_tenant(state, spec.account)
            backend_id = f"local-{state['next_id']}"
            state["next_id"] += 1
            tmp = Path(tempfile.mkdtemp(prefix=".new-", dir=self._root / "jobs"))
            try:
                (tmp / f"{spec.token}.sh").write_text(spec.script)
                (tmp / ".portal").mkdir()
                record = {"id": backend_id, "token": spec.token, "name": spec.name, "env": dict(spec.env)}
                record |= {"account": spec.account, "attempt": spec.attempt}
                record["checkpoint_key"] = spec.checkpoint_key
                state["accounts"] = sorted({*state["accounts"], spec.account})
                write_json(tmp / ".portal" / "job.json", {**record, "submitted_at": time.time()})
                (self._root / "ids" / backend_id).write_text(spec.token)
                state["queue"].append(
                    dict(
                        id=backend_id,
                        token=spec.token,
                        **ask.record(),
                        walltime=spec.walltime_minutes,
                        account=spec.account,
                    )
                )
                # Saved before the directory appears: a crash in between leaves a queue entry with no
                # directory (dropped later; find() says None, so the portal submits again), never a
                # directory that find() reports but that no queue holds.
                self._save(state)
                os.rename(tmp, self._job_dir(spec.token))
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            self._settle(state)
            return backend_id

    def _check_tenant(self, state: dict[str, Any], account: str) -> None:
        """Under the lock: refuse a job of a tenant this cluster does not serve. With
        LOCAL_CLUSTER_TENANT set, only that tenant's; without a sandbox, one tenant's only, so
        that no second tenant's code ever runs beside the portal's files and the first's."""
        tenant = self.config.local_tenant
        if tenant and account != tenant:
            raise BackendError("the local cluster serves one tenant only, and not this one")
        if "accounts" not in state:  # a state from before accounts were kept: read the records
            state["accounts"] = cleanup.accounts_with_jobs(self._root / "jobs")
        if not tenant and not self.sandbox.ok and set(state["accounts"]) - {account}:
            # The reason (it names paths) is for the admin console; the tenant learns the rule only.
            raise BackendError(
                "the local cluster has no job sandbox, so it serves one tenant only, and another "
                "tenant's jobs are kept here (LOCAL_CLUSTER_TENANT names the one)"
            )

    def find(self, token: str, *, account: str = "", user: str = "") -> str | None:
        """The id of the job submitted with this token, if its directory exists."""
        if not _TOKEN.match(token):
            return None
        record = read_json(self._job_dir(token) / ".portal" / "job.json")
        return record["id"] if record else None

    def poll(self, backend_ids: list[str]) -> dict[str, JobStatus]:
        """Status of each known job, read from the job directories (no process started per job).
        Also kills jobs past their walltime (TIMEOUT), releases ended jobs' GPUs and starts waiting
        jobs that now fit. Unknown ids are left out."""
        _reap()
        tokens = {backend_id: token for backend_id in backend_ids if (token := self._token_of(backend_id))}
        with self._locked() as state:
            self._settle(state)
            overdue = self._mark_overdue(state)
        if overdue:
            self._terminate(overdue)
            with self._locked() as state:
                self._settle(state)
        statuses = {backend_id: self._status(backend_id, tokens[backend_id], state) for backend_id in tokens}
        return {backend_id: status for backend_id, status in statuses.items() if status is not None}

    def cancel(self, backend_id: str, *, user: str = "") -> None:
        """End the job: a waiting one leaves the queue; a running one's process group gets SIGTERM,
        then SIGKILL after grace_s (bounded). A finished or unknown job is left as it is; a job warned
        before (warn) ends PREEMPTED, not CANCELLED."""
        token = self._token_of(backend_id)
        if token is None:
            return
        _reap()
        meta = self._job_dir(token) / ".portal"
        with self._locked() as state:
            self._settle(state)  # a job that has just ended by itself is not reported as cancelled
            waiting = [job for job in state["queue"] if job["id"] == backend_id]
            if waiting:
                state["queue"].remove(waiting[0])
                _finish(meta, base.JobState.CANCELLED, "CANCELLED", "cancelled before it started")
                return
            if backend_id not in state["running"]:
                return
            proc = read_json(meta / "proc.json")
            self._mark(meta, "cancelled")
        if proc is not None:
            self._terminate([proc])
        with self._locked() as state:
            self._settle(state)

    def warn(self, backend_id: str, *, user: str = "", grace_s: int = 0) -> None:
        """SIGTERM to a running job's process group, now, so that it saves a checkpoint and exits
        (PORTAL_PREEMPT_SIGNAL). Nothing kills it after grace_s: the portal calls cancel() once the
        grace is out. Recorded in ended_by before the signal, so that the job ends PREEMPTED
        however it exits (its exit code kept), and a cancel() after its end changes nothing. A
        waiting, finished or unknown job is left as it is."""
        token = self._token_of(backend_id)
        if token is None:
            return
        _reap()
        meta = self._job_dir(token) / ".portal"
        with self._locked() as state:
            self._settle(state)  # a job that has just ended by itself is not reported as preempted
            if backend_id not in state["running"]:
                return
            proc = read_json(meta / "proc.json")
            self._mark(meta, "preempted")
        # Only while its leader is ours, so never a reused pgid. The wrapper and bwrap ignore
        # SIGTERM (launch.py): it reaches the job's own processes alone.
        if proc is not None and alive(proc):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc["pgid"], signal.SIGTERM)

    def log_tail(self, job: JobRef, *, lines: int, max_bytes: int) -> LogTail:
        """The last `lines` lines of the job's output, reading at most `max_bytes` from its end; a
        line cut by that bound is dropped. `truncated`: earlier output exists."""
        if not _TOKEN.match(job.token) or lines <= 0 or max_bytes <= 0:
            return LogTail(lines=[], truncated=False)
        try:  # O_NOFOLLOW: a link there, however it came, is never followed by the portal
            fd = os.open(self._job_dir(job.token) / f"{job.token}.out", os.O_RDONLY | os.O_NOFOLLOW)
            with open(fd, "rb") as f:
                size = f.seek(0, os.SEEK_END)
                start = max(0, size - max_bytes)
                f.seek(start)
                data = f.read(size - start)  # the job may still be writing: never read past the bound
        except FileNotFoundError:
            return LogTail(lines=[], truncated=False)
        except OSError as exc:  # a state directory gone bad (not a directory, unreadable, I/O error)
            raise base.BackendUnavailable(
                f"the output of {job.backend_id} cannot be read: {exc.strerror}"
            ) from None
        truncated = start > 0
        if truncated and b"\n" in data[:-1]:
            data = data[data.index(b"\n") + 1 :]
        text = data.decode(errors="replace").splitlines()
        if len(text) > lines:
            truncated, text = True, text[-lines:]
        return LogTail(lines=text, truncated=truncated)

    def inventory(self) -> list[base.PartitionInfo]:
        """One partition, "local": this machine's devices and how many hold nothing (no whole job,
        slice or MIG device in use), counted in devices."""
        with self._locked() as state:
            self._settle(state)
        free = devices_free(self.machine, state["running"].values())
        devices = len(self.machine.devices)
        return [base.PartitionInfo("local", "local", devices, 1, free, max_walltime_minutes=None)]

    def apply_tenant(self, limits: base.TenantLimits) -> None:
        """Nothing to apply: on the local cluster the portal's own quota checks are the limits."""

    def identities_check(self, users: list[str]) -> dict[str, str]:
        """No cluster identities here: every job runs in a sandbox of its own."""
        return {}

    def health(self) -> Health:
        """Healthy when the state directory is writable; never raises. The detail says whether
        jobs run sandboxed, or that the cluster serves one tenant only for want of a sandbox."""
        try:
            root = self._root
            root.mkdir(parents=True, exist_ok=True)
            tempfile.TemporaryFile(dir=root).close()
        except Exception as exc:
            return Health(healthy=False, detail=f"state directory not writable: {exc}")
        return Health(
            healthy=True, detail=f"{self.machine.summary()}; state in {root}; {self.sandbox_summary()}"
        )

    def sandbox_summary(self) -> str:
        """One line on how jobs are isolated here, for the health detail and the admin console."""
        return sandbox.summary(self.sandbox, self.config.local_tenant)

    # -- cleanup (cleanup.py) -------------------------------------------------------------------

    def list_jobs(self, accounts: list[str]) -> list[base.SchedulerJob]:
        """The running and waiting jobs of these accounts, from the allocation state alone (no
        process is asked). A job submitted before the state recorded accounts is in no account."""
        wanted = set(accounts)
        with self._locked() as state:
            self._settle(state)  # a job that has ended is not listed as running
        listed = [(job, base.JobState.RUNNING) for job in state["running"].values()]
        listed += [(job, base.JobState.PENDING) for job in state["queue"]]
        return [
            base.SchedulerJob(job["id"], job["token"], job["account"], job_state)
            for job, job_state in listed
            if job.get("account") in wanted
        ]

    def purge_scratch(
        self, account: str, *, older_than_days: int, dry_run: bool, users: tuple[str, ...] = ()
    ) -> base.PurgeReport:
        """The tenant's scratch directory (PORTAL_SCRATCH of its jobs), walked without following
        any symlink; cleanup.py says what is deleted and what is refused."""
        root = self._scratch_dir(cleanup.check_account(account))
        return cleanup.purge_tree(root, older_than_days=older_than_days, dry_run=dry_run)

    def delete_finished(
        self,
        accounts: list[str],
        *,
        older_than_s: int,
        dry_run: bool,
        users: dict[str, list[str]] | None = None,
    ) -> list[str]:
        """The portal's log retention on this cluster: the directories (script, output, records) of
        these accounts' jobs that ended more than older_than_s ago, and their ids; poll and find
        know such a job no more. Moved aside under the lock, deleted after it."""
        if isinstance(older_than_s, bool) or not isinstance(older_than_s, int) or older_than_s < 0:
            raise BackendError(f"invalid age in seconds {older_than_s!r}")
        cutoff = time.time() - older_than_s
        with self._locked() as state:
            self._settle(state)
            live = {job["token"] for job in [*state["running"].values(), *state["queue"]]}
            ended = cleanup.ended_before(self._root / "jobs", set(accounts), cutoff, live)
            for backend_id, token in [] if dry_run else ended:
                cleanup.retire(self._root, backend_id, token)
            if not dry_run:  # a tenant whose last job directory went no longer holds the cluster
                state["accounts"] = cleanup.accounts_with_jobs(self._root / "jobs")
        if not dry_run:
            cleanup.remove_retired(self._root / "jobs")
        return [backend_id for backend_id, _token in ended]

    def _scratch_dir(self, account: str) -> Path:
        """<scratch root>/<account>: the cluster's scratch_root if absolute, else under state_dir."""
        configured = self.config.scratch_root
        base_dir = Path(configured) if configured.startswith("/") else self._root / (configured or "scratch")
        return base_dir / account

    # -- state and records ---------------------------------------------------------------------

    @property
    def _root(self) -> Path:
        if not self.config.state_dir:
            raise BackendError("the local cluster has no state_dir")
        return Path(self.config.state_dir)

    def _job_dir(self, token: str) -> Path:
        return self._root / "jobs" / token

    def _token_of(self, backend_id: str) -> str | None:
        if not _BACKEND_ID.match(backend_id):
            return None
        try:
            token = (self._root / "ids" / backend_id).read_text()
        except FileNotFoundError:
            return None
        return token if _TOKEN.match(token) and self._job_dir(token).is_dir() else None

    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, Any]]:
        """The allocation state, saved on a normal exit. flock, not a thread lock: two workers (or
        two threads) submitting at once must not both take the same free GPU."""
        root = self._root
        try:
            for sub in ("jobs", "ids"):
                (root / sub).mkdir(parents=True, exist_ok=True)
            fd = os.open(root / "alloc.lock", os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise base.BackendUnavailable(f"local cluster state directory: {exc}") from exc
        try:
            deadline = time.monotonic() + _LOCK_TIMEOUT_S
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise base.BackendUnavailable("the allocation file stayed locked") from None
                    time.sleep(0.01)
            state = read_json(root / "alloc.json") or {"next_id": 1, "running": {}, "queue": []}
            yield state
            self._save(state)
        finally:
            os.close(fd)  # also releases the flock

    def _save(self, state: dict[str, Any]) -> None:
        write_json(self._root / "alloc.json", state)

    def _settle(self, state: dict[str, Any]) -> None:
        """Under the lock: release the devices of ended jobs, then start waiting jobs that fit, in
        order within each pool (Ask.pool: a vendor's devices, or one MIG profile's devices), so that
        a big job is not starved by small ones behind it, nor held up by one that waits for other
        devices."""
        for backend_id, job in list(state["running"].items()):
            if self._end_record(self._job_dir(job["token"]) / ".portal") is not None:
                del state["running"][backend_id]
        # A waiting job that has a process record was started just before a crash that lost the
        # saved state: it holds its devices before any other job is placed.
        for job in list(state["queue"]):
            meta = self._job_dir(job["token"]) / ".portal"
            started = meta.is_dir() and not (meta / "end.json").exists() and read_json(meta / "proc.json")
            if started:
                state["queue"].remove(job)
                self._running(state, job, started)
        waiting: set[tuple[str, str]] = set()  # the pools whose first job waits
        running = state["running"].values()  # a view: it sees each job started below
        for job in list(state["queue"]):
            ask = Ask.of_record(job)
            meta = self._job_dir(job["token"]) / ".portal"
            proc = None
            if not meta.is_dir() or (meta / "end.json").exists():
                pass
            elif (why := refusal(ask, self.machine)) is not None:  # the machine changed since submit
                _finish(meta, base.JobState.REJECTED, "REJECTED", why)
            elif ask.pool in waiting or (grant := place(ask, self.machine, running)) is None:
                waiting.add(ask.pool)
                continue
            else:
                proc = self._start(job["id"], job["token"], ask, grant, state.setdefault("uids", {}))
            state["queue"].remove(job)
            if proc is not None:
                self._running(state, job, proc)

    @staticmethod
    def _running(state: dict[str, Any], job: dict[str, Any], proc: dict[str, Any]) -> None:
        held = {key: proc[key] for key in ("gpus", "mig") if key in proc}  # what allocation.place gave
        state["running"][job["id"]] = {**job, **held, "started_at": proc["started_at"]}

    def _start(
        self, backend_id: str, token: str, ask: Ask, grant: dict[str, list], uids: dict[str, int]
    ) -> dict[str, Any] | None:
        """Under the lock: start the job's wrapper on its devices (`grant`: allocation.place), in
        the sandbox where one can be made."""
        job_dir = self._job_dir(token)
        meta = job_dir / ".portal"
        record = read_json(meta / "job.json")
        try:
            plan = launch.launch(
                backend_id=backend_id,
                token=token,
                record=record,
                devices_env=device_env(ask, grant),
                job_dir=job_dir,
                scratch_dir=self._scratch_dir(record["account"]) if record.get("account") else None,
                sandbox_config=self.sandbox_config if self.sandbox.ok else None,
                uids=uids,
            )
        except (OSError, BackendError) as exc:
            _finish(meta, base.JobState.FAILED, "LAUNCH_FAILED", f"could not prepare the job: {exc}")
            return None
        write_json(meta / "env.json", plan["env"])  # the job's environment, as it got it
        write_json(meta / "launch.json", plan)
        paths = [meta / "launch.json", job_dir / f"{token}.out", meta / "status"]
        try:
            with open(meta / "wrapper.log", "ab") as log:
                child = subprocess.Popen(  # noqa: S603 - a constant program, paths as arguments
                    [sys.executable, "-I", "-S", "-c", launch.WRAPPER, *map(str, paths)],
                    cwd=job_dir,
                    env={"PATH": os.defpath},
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    start_new_session=True,
                )
        except OSError as exc:
            _finish(meta, base.JobState.FAILED, "LAUNCH_FAILED", f"could not start the job: {exc}")
            return None
        with _children_lock:
            _children[child.pid] = child
        proc = {"pid": child.pid, "pgid": child.pid, "start_ticks": start_ticks(child.pid)}
        proc |= {"boot_id": boot_id(), "started_at": time.time(), **grant}
        write_json(meta / "proc.json", proc)
        return proc

    def _mark_overdue(self, state: dict[str, Any]) -> list[dict[str, Any]]:
        overdue = []
        for job in state["running"].values():
            if job["walltime"] > 0 and time.time() - job["started_at"] > job["walltime"] * self.minute_s:
                meta = self._job_dir(job["token"]) / ".portal"
                self._mark(meta, "timeout")
                overdue.append(read_json(meta / "proc.json"))
        return [proc for proc in overdue if proc is not None]

    def _mark(self, meta: Path, cause: str) -> None:
        # Written before any signal, so that a worker dying mid-kill still leaves the reason behind.
        if not (meta / "ended_by").exists():
            (meta / "ended_by").write_text(cause)

    def _terminate(self, procs: list[dict[str, Any]]) -> None:
        """SIGTERM each job's process group, SIGKILL those still there after grace_s; bounded."""
        for sig, wait_s in ((signal.SIGTERM, self.grace_s), (signal.SIGKILL, _KILL_WAIT_S)):
            live = [proc for proc in procs if alive(proc)]
            for proc in live:
                # Only while its leader is ours (checked just above), so never a reused pgid.
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc["pgid"], sig)
            deadline = time.monotonic() + wait_s
            while live and time.monotonic() < deadline:
                time.sleep(0.05)
                _reap()
                live = [proc for proc in live if alive(proc)]
            if not live:
                return

    def _end_record(self, meta: Path) -> dict[str, Any] | None:
        """The final record of a started job, written the first time it is seen ended; None while
        its wrapper runs."""
        if (end := read_json(meta / "end.json")) is not None:
            return end
        proc = read_json(meta / "proc.json")
        if proc is None:
            return _finish(
                meta, base.JobState.FAILED, "LOST", "no process record: the worker died starting it"
            )
        if alive(proc):
            return None
        try:  # read after the liveness check: the wrapper writes it before it exits
            exit_code = int((meta / "status").read_text())
            finished_at = (meta / "status").stat().st_mtime
        except (FileNotFoundError, ValueError):
            exit_code, finished_at = None, time.time()
        try:
            cause = (meta / "ended_by").read_text()
        except FileNotFoundError:
            cause = ""
        if cause in _KILLED_BY:
            state, raw, reason = _KILLED_BY[cause]
        elif exit_code == 0:
            state, raw, reason = base.JobState.COMPLETED, "COMPLETED", ""
        elif exit_code is not None:
            state, raw, reason = base.JobState.FAILED, "FAILED", f"exit code {exit_code}"
        else:
            state, raw, reason = (
                base.JobState.FAILED,
                "KILLED",
                "no exit status: killed, or the machine restarted",
            )
        times = {"started_at": proc["started_at"], "finished_at": finished_at}
        return _finish(meta, state, raw, reason, exit_code, **times)

    def _status(self, backend_id: str, token: str, state: dict[str, Any]) -> JobStatus | None:
        node = socket.gethostname()
        if (end := read_json(self._job_dir(token) / ".portal" / "end.json")) is not None:
            started, finished = _dt(end.pop("started_at")), _dt(end.pop("finished_at"))
            node = node if started else ""
            return JobStatus(backend_id, **end, started_at=started, finished_at=finished, node_list=node)
        if (job := state["running"].get(backend_id)) is not None:
            started = _dt(job["started_at"])
            return JobStatus(backend_id, base.JobState.RUNNING, "RUNNING", started_at=started, node_list=node)
        if any(job["id"] == backend_id for job in state["queue"]):
            return JobStatus(backend_id, base.JobState.PENDING, "PENDING", reason="Resources")
        return None

    def gpu_utilization(self, backend_ids: list[str]) -> dict[str, base.GpuSample]:
        """The GPUs of each running job, from one reading of this machine's GPUs (NVML, else
        nvidia-smi: gpus.py): a job holds the GPU indexes it was started with (its
        CUDA_VISIBLE_DEVICES, in PCI bus order); a slice's reading is its whole GPU's. {} when
        none of these jobs runs or there is neither; a job with a GPU that was not reported is left
        out, and so are MIG jobs (a GPU in MIG mode reports no utilization of its own) and other
        vendors' jobs; BackendUnavailable when nvidia-smi hangs or NVML fails."""
        from clusters.backends.local.gpus import job_samples  # the telemetry helper, kept apart

        # Read without the lock: write_json replaces alloc.json whole, and nothing here changes it.
        running = (read_json(self._root / "alloc.json") or {}).get("running", {})
        held = {
            bid: running[bid]["gpus"]
            for bid in backend_ids
            if bid in running
            and running[bid].get("vendor", "nvidia") == "nvidia"
            and running[bid].get("share") != "mig"
        }
        return job_samples(held, self.config.nvidia_smi)
