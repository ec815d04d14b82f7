"""The local cluster: jobs run as processes on the portal's own machine (docs/architecture.md).

For a single shared GPU server and for the demo. Everything lives under config.state_dir
(statedir.py: the allocation file and its lock, a directory per job); the tenant's jobs share
scratch/<account>/, PORTAL_SCRATCH (or <scratch_root>/<account>).

A job is started through a small Python wrapper (launch.py) in its own session and process
group (processes.py). The wrapper runs `/bin/bash <token>.sh` in a bubblewrap sandbox (sandbox.py:
the job sees its directory as /job, .portal/ hidden), reaps the job's orphans as a subreaper and
writes the exit code to .portal/status itself, so the code survives the death of the worker that
started it. Where no sandbox can be made the job runs as the portal's user, and the cluster serves
one tenant. Its end is read from its records (ends.py); cancel, warn and the walltime signal its
process group (stopping.py). A preemptible job's checkpoints live in
<tenant scratch>/checkpoints/<checkpoint key>, the same directory for every attempt (launch.py).
"""

from __future__ import annotations

import tempfile
import time
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from clusters.backends import base
from clusters.backends.base import BackendError, ClusterConfig, Health, JobRef, JobSpec, JobStatus, LogTail
from clusters.backends.local import cleanup, ends, launch, logs, processes, sandbox, statedir, stopping
from clusters.backends.local.allocation import devices_free
from clusters.backends.local.devices import Device, Machine, discover
from clusters.backends.local.processes import reap
from clusters.backends.local.records import read_json
from clusters.backends.local.sandbox import Probe
from clusters.backends.local.submission import check_spec, enqueue


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
        ask = check_spec(spec, self.machine)
        reap()
        self.sandbox  # noqa: B018 - probed (once per process) before the lock, not while holding it
        with self._locked() as state:
            if (found := self.find(spec.token)) is not None:
                return found
            self._check_tenant(state, spec.account)
            backend_id = enqueue(state, spec, ask, root=self._root)
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
        if not statedir.TOKEN.match(token):
            return None
        record = read_json(self._job_dir(token) / ".portal" / "job.json")
        return record["id"] if record else None

    def poll(self, backend_ids: list[str]) -> dict[str, JobStatus]:
        """Status of each known job, read from the job directories (no process started per job).
        Also kills jobs past their walltime (TIMEOUT), releases ended jobs' GPUs and starts waiting
        jobs that now fit. Unknown ids are left out."""
        reap()
        tokens = {backend_id: token for backend_id in backend_ids if (token := self._token_of(backend_id))}
        with self._locked() as state:
            self._settle(state)
            overdue = stopping.mark_overdue(state, root=self._root, minute_s=self.minute_s)
        if overdue:
            self._terminate(overdue)
            with self._locked() as state:
                self._settle(state)
        statuses = {
            backend_id: ends.status(backend_id, self._job_dir(token) / ".portal", state)
            for backend_id, token in tokens.items()
        }
        return {backend_id: status for backend_id, status in statuses.items() if status is not None}

    def cancel(self, backend_id: str, *, user: str = "") -> None:
        """End the job: a waiting one leaves the queue; a running one's process group gets SIGTERM,
        then SIGKILL after grace_s (bounded). A finished or unknown job is left as it is; a job warned
        before (warn) ends PREEMPTED, not CANCELLED."""
        token = self._token_of(backend_id)
        if token is None:
            return
        reap()
        meta = self._job_dir(token) / ".portal"
        with self._locked() as state:
            self._settle(state)  # a job that has just ended by itself is not reported as cancelled
            waiting = [job for job in state["queue"] if job["id"] == backend_id]
            if waiting:
                state["queue"].remove(waiting[0])
                ends.finish(meta, base.JobState.CANCELLED, "CANCELLED", "cancelled before it started")
                return
            if backend_id not in state["running"]:
                return
            proc = read_json(meta / "proc.json")
            stopping.mark(meta, "cancelled")
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
        reap()
        meta = self._job_dir(token) / ".portal"
        with self._locked() as state:
            self._settle(state)  # a job that has just ended by itself is not reported as preempted
            if backend_id not in state["running"]:
                return
            proc = read_json(meta / "proc.json")
            stopping.mark(meta, "preempted")
        stopping.warn_group(proc)  # SIGTERM, only while its leader is ours

    def log_tail(self, job: JobRef, *, lines: int, max_bytes: int) -> LogTail:
        """The last `lines` lines of the job's output, reading at most `max_bytes` from its end; a
        line cut by that bound is dropped. `truncated`: earlier output exists."""
        return logs.log_tail(self.config, job, lines=lines, max_bytes=max_bytes)

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
        root = statedir.scratch_dir(self.config, cleanup.check_account(account))
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

    # -- the state directory (statedir.py), starting (processes.py) and stopping (stopping.py) ----

    @property
    def _root(self) -> Path:
        return statedir.state_root(self.config)

    def _job_dir(self, token: str) -> Path:
        return statedir.job_dir(self._root, token)

    def _token_of(self, backend_id: str) -> str | None:
        return statedir.token_of(self._root, backend_id)

    def _locked(self) -> AbstractContextManager[dict[str, Any]]:
        return statedir.locked(self._root)

    def _settle(self, state: dict[str, Any]) -> None:
        processes.settle(state, config=self.config, machine=self.machine, sandbox_config=self.sandbox_config)

    def _terminate(self, procs: list[dict[str, Any]]) -> None:
        stopping.terminate(procs, grace_s=self.grace_s)
