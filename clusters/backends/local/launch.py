"""How the local backend starts a job: the wrapper that outlives the worker, and what it runs.

The wrapper (WRAPPER, run by the portal's own Python) starts the job in its session and process
group, reaps its orphans as a subreaper, and writes its exit code; launch() decides what it runs:
the job's script in a bubblewrap sandbox (sandbox.py), or, where none can be made, as the
portal's own user (the cluster then serves one tenant only). It also makes the job's checkpoint
directory, the same for each attempt of a portal job (docs/architecture/lending.md).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from clusters.backends.base import BackendError
from clusters.backends.local import cleanup, sandbox

# The worker's own environment holds the portal's secrets (SECRET_KEY, DATABASE_URL…), so a job
# inherits only these names from it.
_INHERITED_ENV = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TZ", "TMPDIR", "LD_LIBRARY_PATH")
_SANDBOX_INHERITED_ENV = ("LANG", "LC_ALL", "TZ", "LD_LIBRARY_PATH")  # the rest is the sandbox's own
_SANDBOX_TMP = "/tmp"  # noqa: S108 - the sandbox's own fresh tmpfs
# A checkpoint key names one directory under <scratch>/checkpoints: no "/", no "..", not ".".
CHECKPOINT_KEY = re.compile(r"(?!\.\Z)(?!.*\.\.)[A-Za-z0-9_.-]{1,128}")
CHECKPOINTS = "checkpoints"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
PREEMPT_SIGNAL = "TERM"  # what warn() sends the job's process group (PORTAL_PREEMPT_SIGNAL)

# Run as `python -I -S -c WRAPPER launch out status`: what to run, its environment and what to
# stage for bwrap come from launch.json (written by launch(), never from user text).
WRAPPER = r"""
import ctypes, json, os, signal, sys, time
launch_file, out, status = sys.argv[1:4]
libc = ctypes.CDLL(None, use_errno=True)
try:  # PR_SET_CHILD_SUBREAPER: the job's orphans come to us, so none is left a zombie elsewhere
    libc.prctl(36, 1, 0, 0, 0)
except Exception:
    pass
# Outlive the job to record it. Ignored, not handled, so that bwrap inherits it too: a cancel's
# SIGTERM to the group must reach the job, not end bwrap (and the job with SIGKILL through
# --die-with-parent); the job itself starts with SIGTERM at its default (env --default-signal).
signal.signal(signal.SIGTERM, signal.SIG_IGN)
with open(launch_file) as f:
    launch = json.load(f)

def check(rc, what):
    if rc != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")

def stage(stage_dir, entries):
    # As root, in a mount namespace of our own (children inherit it, nobody else sees it): a
    # tmpfs on stage_dir with what bwrap binds, each mounted through an O_PATH descriptor so
    # that no symlink is followed.
    check(libc.unshare(0x00020000), "unshare(CLONE_NEWNS)")
    check(libc.mount(b"none", b"/", None, 0x4000 | 0x40000, None), "mount --make-rprivate /")
    os.makedirs(stage_dir, mode=0o755, exist_ok=True)
    check(libc.mount(b"tmpfs", stage_dir.encode(), b"tmpfs", 0x2 | 0x4, b"mode=0755"), "tmpfs")
    for source, name, kind in entries:
        target = os.path.join(stage_dir, name)
        fd = os.open(source, os.O_PATH | os.O_NOFOLLOW | (os.O_DIRECTORY if kind == "dir" else 0))
        try:
            os.mkdir(target) if kind == "dir" else os.close(os.open(target, os.O_CREAT | os.O_WRONLY))
            check(libc.mount(f"/proc/self/fd/{fd}".encode(), target.encode(), None, 0x1000, None), "bind")
        finally:
            os.close(fd)

sigdef = [signal.SIGPIPE, signal.SIGXFSZ] + ([] if launch["sandboxed"] else [signal.SIGTERM])
actions = [(os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
           (os.POSIX_SPAWN_OPEN, 1, out, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o644),
           (os.POSIX_SPAWN_DUP2, 1, 2)]
try:
    if launch["stage"]:
        stage(launch["stage_dir"], launch["stage"])
    pid = os.posix_spawn(launch["argv"][0], launch["argv"], launch["env"], setsigmask=(),
        setsigdef=sigdef, file_actions=actions)
    while (reaped := os.wait())[0] != pid:
        pass
    rc = os.waitstatus_to_exitcode(reaped[1])
    rc = 128 - rc if rc < 0 else rc
except OSError as exc:
    print(exc, file=sys.stderr)
    rc = 127
with open(status + ".tmp", "w") as f:
    f.write(f"{rc}\n")
os.replace(status + ".tmp", status)
os.killpg(0, signal.SIGTERM)  # like Slurm: the job ends when its script does
deadline = time.monotonic() + 5
while time.monotonic() < deadline:
    try:
        if os.waitpid(-1, os.WNOHANG)[0] == 0:
            time.sleep(0.05)
    except ChildProcessError:
        sys.exit(0)
os.killpg(0, signal.SIGKILL)
"""


def launch(
    *,
    backend_id: str,
    token: str,
    record: dict[str, Any],
    devices_env: dict[str, str],
    job_dir: Path,
    scratch_dir: Path | None,
    sandbox_config: sandbox.SandboxConfig | None,
    uids: dict[str, int],
) -> dict[str, Any]:
    """What the wrapper runs (launch.json): argv, environment, and the descriptors it opens for
    bwrap. Sandboxed (`sandbox_config` given), the job sees its directory as /job and its tenant's
    scratch as /scratch and inherits of the worker's environment only its locale and library
    path; as root it runs as its tenant's uid (given once into `uids`, the allocation state).
    `devices_env` pins it to its devices (allocation.device_env) and wins over the job's own env.
    PORTAL_ATTEMPT and PORTAL_PREEMPT_SIGNAL are set in every job; PORTAL_CHECKPOINT_DIR where
    the job has a checkpoint key (none: a caller from before attempts, which resumes nothing). A
    checkpoint directory that cannot be made fails the launch (BackendError): an attempt that
    silently started again from nothing would be worse than one that says why."""
    meta = job_dir / ".portal"
    account = record.get("account", "")
    if sandbox_config is not None:
        env = {name: os.environ[name] for name in _SANDBOX_INHERITED_ENV if name in os.environ}
        user = account if cleanup.ACCOUNT_RE.fullmatch(account) else "job"
        env |= {"PATH": sandbox.PATH, "HOME": sandbox.JOB_DIR, "TMPDIR": _SANDBOX_TMP}
        env |= {"USER": user, "LOGNAME": user}
    else:
        env = {name: os.environ[name] for name in _INHERITED_ENV if name in os.environ}
    env |= record["env"]
    env |= {"PORTAL_JOB_ID": backend_id, "PORTAL_JOB_NAME": record["name"], "PORTAL_JOB_TOKEN": token}
    uid = None
    if sandbox_config is not None and sandbox.drops_privileges():
        uid = sandbox.tenant_uid(uids, account, sandbox_config)
        os.chown(job_dir, uid, uid, follow_symlinks=False)
        job_dir.chmod(0o700)
    if scratch_dir is not None and cleanup.ACCOUNT_RE.fullmatch(account):  # the tenant's scratch
        try:  # a job without scratch still runs
            scratch_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            if uid is not None and scratch_dir.lstat().st_uid != uid:
                os.chown(scratch_dir, uid, uid, follow_symlinks=False)
            env["PORTAL_SCRATCH"] = sandbox.SCRATCH_DIR if sandbox_config is not None else str(scratch_dir)
        except OSError:
            scratch_dir = None
    else:
        scratch_dir = None
    env |= {"PORTAL_ATTEMPT": str(record.get("attempt", 1)), "PORTAL_PREEMPT_SIGNAL": PREEMPT_SIGNAL}
    if key := record.get("checkpoint_key", ""):
        if scratch_dir is None:
            raise BackendError("the tenant's scratch cannot be made, so neither can its checkpoint directory")
        checkpoint_dir(scratch_dir, key, uid)
        seen = sandbox.SCRATCH_DIR if sandbox_config is not None else str(scratch_dir)
        env["PORTAL_CHECKPOINT_DIR"] = f"{seen}/{CHECKPOINTS}/{key}"
    env |= devices_env
    if sandbox_config is None:
        argv = ["/bin/bash", str(job_dir / f"{token}.sh")]
        return {"argv": argv, "env": env, "stage": [], "sandboxed": False, "uid": None}
    out = job_dir / f"{token}.out"
    os.close(os.open(out, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o644))  # the portal's, not the job's
    passwd, group = sandbox.passwd_lines(env["USER"], uid if uid is not None else os.geteuid())
    (meta / "passwd").write_text(passwd)
    (meta / "group").write_text(group)
    paths = {"job": job_dir, "out": out, "passwd": meta / "passwd", "group": meta / "group"}
    if scratch_dir is not None:
        paths["scratch"] = scratch_dir
    return sandboxed_launch(sandbox_config, uid, paths, f"{sandbox.JOB_DIR}/{token}.sh", env, out.name)


def checkpoint_dir(scratch_dir: Path, key: str, uid: int | None) -> None:
    """Make <scratch>/checkpoints/<key>, owned by the job's uid where it runs as one. Through
    descriptors opened with O_NOFOLLOW: the tenant's jobs write in their scratch and may have left
    a symlink at either name, which, followed as root, would make or chown a directory anywhere."""
    if not CHECKPOINT_KEY.fullmatch(key):
        raise BackendError(f"invalid checkpoint key {key[:140]!r}")
    try:
        fd = os.open(scratch_dir, _DIR_FLAGS)
        try:
            for name in (CHECKPOINTS, key):
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o700, dir_fd=fd)
                parent, fd = fd, os.open(name, _DIR_FLAGS, dir_fd=fd)  # ELOOP on a link
                os.close(parent)
                if uid is not None and os.fstat(fd).st_uid != uid:
                    os.fchown(fd, uid, uid)
        finally:
            os.close(fd)
    except OSError as exc:
        raise BackendError(
            f"the checkpoint directory {CHECKPOINTS}/{key} cannot be made in the tenant's scratch "
            f"({exc.strerror})"
        ) from None


def sandboxed_launch(
    config: sandbox.SandboxConfig,
    uid: int | None,
    paths: dict[str, Path],
    script: str,
    env: dict[str, str],
    out_name: str,
) -> dict[str, Any]:
    """launch.json of a sandboxed job. As root the wrapper stages `paths` (sandbox.STAGE)
    and bwrap binds the staged copies; otherwise bwrap, as the portal's user, binds them."""
    if uid is None:
        sources, stage = {name: str(path) for name, path in paths.items()}, []
    else:
        sources = {name: f"{sandbox.STAGE}/{name}" for name in paths}
        stage = [(str(path), name, "dir" if path.is_dir() else "file") for name, path in paths.items()]
    args = sandbox.bwrap_argv(config, sources=sources, out_name=out_name)
    argv = sandbox.command(config, uid, args, script)
    launch = {"argv": argv, "env": env, "stage": stage, "stage_dir": sandbox.STAGE}
    return launch | {"sandboxed": True, "uid": uid}


def probe(config: sandbox.SandboxConfig) -> sandbox.Probe:
    """Whether a sandbox can be made here, by running a job in one through the wrapper: as the
    range's first uid when the portal is root. Asked once per process for each config."""
    return _probe(config, sandbox.drops_privileges())


@functools.cache
def _probe(config: sandbox.SandboxConfig, as_tenant: bool) -> sandbox.Probe:
    if not os.access(config.bwrap, os.X_OK):
        return sandbox.Probe(False, f"bwrap is not an executable at {config.bwrap}")
    if as_tenant and not os.access(sandbox.SETPRIV, os.X_OK):
        return sandbox.Probe(False, f"setpriv (util-linux) is missing at {sandbox.SETPRIV}")
    uid = config.uid_base if as_tenant else None
    work = Path(tempfile.mkdtemp(prefix="portal-sandbox-probe-"))
    try:
        job, scratch, meta = work / "job", work / "scratch", work / "meta"
        for path in (job, scratch, meta):
            path.mkdir()
        (job / ".portal").mkdir()
        # The check writes where a job writes, as the job would, and finds no /etc/shadow.
        (job / "probe.sh").write_text(": > /job/written && : > /scratch/written && test ! -e /etc/shadow\n")
        (job / "probe.out").touch()
        if uid is not None:
            for path in (job, scratch):
                os.chown(path, uid, uid)
        passwd, group = sandbox.passwd_lines("probe", uid if uid is not None else os.geteuid())
        (meta / "passwd").write_text(passwd)
        (meta / "group").write_text(group)
        paths = {"job": job, "out": job / "probe.out", "scratch": scratch}
        paths |= {"passwd": meta / "passwd", "group": meta / "group"}
        env = {"PATH": sandbox.PATH}
        launch = sandboxed_launch(config, uid, paths, f"{sandbox.JOB_DIR}/probe.sh", env, "probe.out")
        (meta / "launch.json").write_text(json.dumps(launch))
        argv = [sys.executable, "-I", "-S", "-c", WRAPPER, str(meta / "launch.json")]
        argv += [str(job / "probe.out"), str(meta / "status")]
        try:
            subprocess.run(  # noqa: S603 - a constant program, paths as arguments
                argv, env={"PATH": os.defpath}, capture_output=True, timeout=30, start_new_session=True
            )
            rc = int((meta / "status").read_text())
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            return sandbox.Probe(False, f"the sandbox probe did not run: {exc}")
        written = job / "written"
        if rc != 0 or not written.exists():
            lines = (job / "probe.out").read_text(errors="replace").strip().splitlines()
            why = lines[-1][:200] if lines else f"exit code {rc}"
            return sandbox.Probe(False, f"bwrap cannot make a sandbox here: {why}")
        if uid is not None and written.stat().st_uid != uid:
            return sandbox.Probe(False, "the sandbox did not run as the tenant's uid")
        return sandbox.Probe(True, "bubblewrap sandbox" + (", a uid per tenant" if uid else ""))
    finally:
        shutil.rmtree(work, ignore_errors=True)
