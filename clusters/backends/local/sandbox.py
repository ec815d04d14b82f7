"""The local cluster's sandbox: every job in a bubblewrap (bwrap) sandbox of its own
(docs/architecture/local-sandbox.md).

What a job sees:

    /job            its job directory, the only writable place that outlives it (cwd, HOME);
                    /job/.portal (the portal's records) is hidden under an empty read-only tmpfs
                    and /job/<token>.out is a read-only mount, so neither can be swapped
    /scratch        its tenant's shared scratch directory (PORTAL_SCRATCH)
    /tmp, /dev/shm  fresh tmpfs; /usr, /sys and a few /etc files read-only; /etc/passwd and
                    /etc/group written for it; /dev minimal, plus /dev/nvidia* when present
    /proc           its own PID namespace: only its own processes

Nothing else is mounted: not the portal's tree, VAR_DIR, other jobs or other tenants. Its
network is a loopback of its own unless the site allows the host's network. When the portal
runs as root the job also runs as a uid of its own tenant (uid_base + the tenant's index, kept
in the allocation state), dropped to by setpriv before bwrap starts; bwrap then needs
unprivileged user namespaces, as it does when the portal is not root. bwrap, once it is the
tenant's uid, cannot reach paths under a state directory it has no right to traverse, so the
wrapper (as root) first bind-mounts what the job gets onto STAGE in a mount namespace of its own:
nothing of that is seen outside the wrapper and its children, and it vanishes with them.

The sandbox is probed once per process by running one for real (launch.probe); where it
cannot be made the backend serves one tenant only (backend.py).
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from pathlib import Path

from clusters.backends.base import BackendError

JOB_DIR = "/job"
SCRATCH_DIR = "/scratch"
PATH = "/usr/local/bin:/usr/bin:/bin"
SETPRIV = "/usr/bin/setpriv"
# The command runs under `env --default-signal=TERM`: the wrapper and bwrap ignore SIGTERM, so
# that a cancel's SIGTERM to the process group reaches the job alone, and the job must not
# inherit that.
_RESET_TERM = ["/usr/bin/env", "--default-signal=TERM"]
# What a Python or shell job needs of /etc, and nothing that sites keep secrets in.
_ETC = (
    "alternatives",
    "ca-certificates",
    "ca-certificates.conf",
    "debian_version",
    "gai.conf",
    "host.conf",
    "hosts",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "mime.types",
    "nsswitch.conf",
    "os-release",
    "pki",
    "protocols",
    "resolv.conf",
    "services",
    "ssl",
    "timezone",
    "OpenCL",
    "vulkan",
)
_SYS = ("block", "bus", "class", "dev", "devices")  # as Flatpak gives its apps, for GPU libraries
# Where the wrapper, as root, stages what bwrap binds (see above): a tmpfs in its own mount namespace.
STAGE = "/run/portal-sandbox"
STAGED = ("job", "out", "scratch", "passwd", "group")  # the names of what is staged, for bwrap_argv


@dataclass(frozen=True)
class SandboxConfig:
    """The site's choices (settings LOCAL_SANDBOX_*)."""

    bwrap: str = "/usr/bin/bwrap"
    network: bool = False  # share the host's network, loopback services included
    uid_base: int = 1_900_000_000
    uid_count: int = 100_000
    ro_paths: tuple[str, ...] = ()  # more read-only paths, e.g. /opt/conda or a datasets mount
    hidden: tuple[str, ...] = ()  # never visible, even below ro_paths: the portal's tree, VAR_DIR


@dataclass(frozen=True)
class Probe:
    ok: bool
    detail: str


def summary(probe: Probe, tenant: str) -> str:
    """How jobs are isolated, in one line; without a sandbox, that the cluster serves one tenant."""
    if probe.ok:
        return f"jobs run in a {probe.detail}" + (f"; serves tenant {tenant} only" if tenant else "")
    return f"NO SANDBOX, serves one tenant only: {probe.detail}"


def drops_privileges() -> bool:
    """Whether jobs run as a uid of their tenant: only root can switch to one."""
    return os.geteuid() == 0


def tenant_uid(uids: dict[str, int], account: str, config: SandboxConfig) -> int:
    """The tenant's uid, given once from the range and kept in `uids` (the allocation state),
    so that it never changes while files of it exist."""
    if account in uids:
        return uids[account]
    taken = set(uids.values())
    for uid in range(config.uid_base, min(config.uid_base + config.uid_count, 2**32 - 1)):  # -1: no uid
        if uid not in taken:
            uids[account] = uid
            return uid
    raise BackendError("the local cluster's sandbox uid range is used up: raise LOCAL_SANDBOX_UID_COUNT")


def bwrap_argv(config: SandboxConfig, *, sources: dict[str, str], out_name: str) -> list[str]:
    """bwrap's arguments, up to the job's command. `sources`: the host paths (or staged paths)
    of the job directory, its output, the tenant's scratch (optional), passwd and group; no
    path from a user appears here, only the portal's own and the job's token."""
    args = [config.bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent"]
    if config.network:
        args.append("--share-net")
    args += ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = Path("/") / name
        if path.is_symlink():  # merged /usr: the same links inside
            args += ["--symlink", os.readlink(path), str(path)]
        elif path.is_dir():
            args += ["--ro-bind", str(path), str(path)]
    args += ["--dir", "/etc"]
    for name in _ETC:
        if os.path.exists(f"/etc/{name}"):
            args += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
    args += ["--ro-bind", sources["passwd"], "/etc/passwd", "--ro-bind", sources["group"], "/etc/group"]
    for name in _SYS:
        if os.path.isdir(f"/sys/{name}"):
            args += ["--ro-bind", f"/sys/{name}", f"/sys/{name}"]
    args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/dev/shm"]  # noqa: S108 - its own tmpfs
    for device in sorted(glob.glob("/dev/nvidia*")):  # GPUs keep working; CUDA_VISIBLE_DEVICES picks
        args += ["--dev-bind", device, device]
    args += ["--tmpfs", "/tmp", "--dir", "/var", "--symlink", "../tmp", "/var/tmp"]  # noqa: S108
    for path in config.ro_paths:
        if os.path.isabs(path) and os.path.exists(path):
            args += ["--ro-bind", path, path]
    mounted = ["/usr", "/etc", "/sys", *config.ro_paths]
    for path in config.hidden:  # only where a mount above would show it
        if any(Path(path).is_relative_to(top) for top in mounted) and os.path.isdir(path):
            args += ["--tmpfs", path, "--remount-ro", path]
    args += ["--bind", sources["job"], JOB_DIR]
    args += ["--tmpfs", f"{JOB_DIR}/.portal", "--remount-ro", f"{JOB_DIR}/.portal"]
    args += ["--ro-bind", sources["out"], f"{JOB_DIR}/{out_name}"]
    if "scratch" in sources:
        args += ["--bind", sources["scratch"], SCRATCH_DIR]
    args += ["--remount-ro", "/", "--chdir", JOB_DIR]
    return args


def command(config: SandboxConfig, uid: int | None, bwrap_args: list[str], script: str) -> list[str]:
    """The whole argv: setpriv down to the tenant's uid when there is one, bwrap, the script."""
    drop = [SETPRIV, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"] if uid is not None else []
    return [*drop, *bwrap_args, "--", *_RESET_TERM, "/bin/bash", script]


def passwd_lines(name: str, uid: int) -> tuple[str, str]:
    """/etc/passwd and /etc/group for the sandbox: root, the job's user, nobody."""
    passwd = f"root:x:0:0:root:/root:/usr/sbin/nologin\n{name}:x:{uid}:{uid}::{JOB_DIR}:/bin/bash\n"
    passwd += "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
    group = f"root:x:0:\n{name}:x:{uid}:\nnogroup:x:65534:\n"
    return passwd, group
