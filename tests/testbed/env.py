"""Connection details of the local Slurm testbed (tests/testbed/testbed.sh).

``testbed_env()`` runs ``testbed.sh up`` (idempotent, fast when the testbed is
already up) once per process and returns the KEY=value pairs of the env file it
writes, e.g. ``SLURM_TESTBED_HOST``, ``SLURM_TESTBED_KEY_FILE``, ``SLURM_TESTBED_NODES`` (2:
every partition spans both of the testbed's nodes).
"""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path

TESTBED_SCRIPT = Path(__file__).resolve().parent / "testbed.sh"
REPO_ROOT = TESTBED_SCRIPT.parent.parent.parent
UP_TIMEOUT_S = 900  # a first run may apt-get install the Slurm packages

REQUIRED_KEYS = (
    "SLURM_TESTBED_HOST",
    "SLURM_TESTBED_PORT",
    "SLURM_TESTBED_USER",
    "SLURM_TESTBED_KEY_FILE",
    "SLURM_TESTBED_KNOWN_HOSTS",
    "SLURM_TESTBED_CLUSTER",
    "SLURM_TESTBED_ACCOUNT",
    "SLURM_TESTBED_PARTITIONS",  # name:GPU type:GPUs per node,…
    "SLURM_TESTBED_NODES",  # nodes of every partition
    "SLURM_TESTBED_IDENTITY",  # the job identity of SLURM_TESTBED_ACCOUNT (pt-alpha of alpha)
    "SLURM_TESTBED_OTHER_ACCOUNT",  # a second tenant's account and identity (beta, pt-beta)
    "SLURM_TESTBED_OTHER_IDENTITY",
    "SLURM_TESTBED_SCRATCH",  # the scratch root: <scratch>/<identity>/<account>
)


class TestbedError(RuntimeError):
    pass


def state_dir() -> Path:
    """Same rule as testbed.sh: $TESTBED_DIR (relative to the cwd) or <repo>/var/testbed."""
    configured = os.environ.get("TESTBED_DIR")
    return Path(configured).absolute() if configured else REPO_ROOT / "var" / "testbed"


def env_file() -> Path:
    return state_dir() / "testbed.env"


def parse_env_file(path: Path) -> dict[str, str]:
    values: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise TestbedError(f"malformed line in {path}: {line!r}")
        values[key.strip()] = value.strip()
    missing = [key for key in REQUIRED_KEYS if key not in values]
    if missing:
        raise TestbedError(f"{path} lacks {', '.join(missing)}")
    return values


@functools.lru_cache(maxsize=1)
def _up() -> tuple[tuple[str, str], ...]:
    try:
        proc = subprocess.run(
            ["bash", str(TESTBED_SCRIPT), "up"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=UP_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise TestbedError(f"{TESTBED_SCRIPT} up took more than {UP_TIMEOUT_S}s") from exc
    if proc.returncode != 0:
        output = (proc.stdout + proc.stderr)[-4000:]
        raise TestbedError(f"{TESTBED_SCRIPT} up failed (rc={proc.returncode}):\n{output}")
    return tuple(parse_env_file(env_file()).items())


def testbed_env() -> dict[str, str]:
    """Bring the testbed up if needed (once per process) and return its connection details."""
    return dict(_up())


testbed_env.__test__ = False  # type: ignore[attr-defined]  # not a test, despite its name


def testbed_config(env: dict[str, str] | None = None, **overrides):
    """The ClusterConfig that reaches the testbed over SSH as the portal's user, from its env
    file (testbed_env() unless given): the fields manage.py register_testbed stores."""
    from dataclasses import replace

    from clusters.backends.base import ClusterConfig

    env = env or testbed_env()
    config = ClusterConfig(
        slug="slurm-testbed",
        kind="slurm",
        ssh_host=env["SLURM_TESTBED_HOST"],
        ssh_port=int(env["SLURM_TESTBED_PORT"]),
        ssh_user=env["SLURM_TESTBED_USER"],
        ssh_known_hosts=Path(env["SLURM_TESTBED_KNOWN_HOSTS"]).read_text(),
        ssh_private_key=Path(env["SLURM_TESTBED_KEY_FILE"]).read_text(),
        slurm_cluster_name=env["SLURM_TESTBED_CLUSTER"],
        scratch_root=env["SLURM_TESTBED_SCRATCH"],
    )
    return replace(config, **overrides)


def testbed_identity(name: str) -> str:
    """Make `name` a job identity on the testbed (a Unix user in its job identities' group, which
    the portal's user may act as through its sudoers rule); idempotent. The name back."""
    testbed_env()
    subprocess.run(
        ["bash", str(TESTBED_SCRIPT), "identity", name],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return name


def registered_testbed():
    """The testbed as the portal's Cluster "testbed" (manage.py register_testbed), with its partitions."""
    import io

    from django.core.management import call_command

    from clusters.models import Cluster
    from tenants.models import Tenant

    testbed_env()
    # the job identities of the suite's two persona tenants (tests/conftest.py), and of any
    # tenant there is already (the cluster's template: pt-<slug>)
    for slug in {"protein-lab", "other-team", *Tenant.objects.values_list("slug", flat=True)}:
        testbed_identity(f"pt-{slug}")
    call_command("register_testbed", stdout=io.StringIO())
    return Cluster.objects.get(slug="testbed")
