"""What goes to Slurm checked, what comes back parsed: names, states, times, exit codes, GRES."""

from __future__ import annotations

import re
import shlex
from datetime import UTC, datetime

from clusters.backends import base
from clusters.backends.base import BackendError

NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # accounts, users, QOS, partitions, GRES types
TOKEN_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")  # becomes a file name: no "/", no ".."
JOB_ID_RE = re.compile(r"[0-9]+")  # an id that started with "-" would be an option to scancel
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# Slurm's job states (squeue's long form, sacct's first word) → the portal's.
STATES = {
    "PENDING": base.PENDING,
    "CONFIGURING": base.PENDING,
    "REQUEUED": base.PENDING,
    "REQUEUE_FED": base.PENDING,
    "REQUEUE_HOLD": base.PENDING,
    "SPECIAL_EXIT": base.PENDING,  # requeued and held by the job's own exit code
    "RESV_DEL_HOLD": base.PENDING,
    "RUNNING": base.RUNNING,
    "COMPLETING": base.RUNNING,
    "SUSPENDED": base.RUNNING,
    "STOPPED": base.RUNNING,
    "SIGNALING": base.RUNNING,
    "STAGE_OUT": base.RUNNING,
    "RESIZING": base.RUNNING,
    "COMPLETED": base.COMPLETED,
    "FAILED": base.FAILED,
    "BOOT_FAIL": base.FAILED,
    "DEADLINE": base.FAILED,
    "CANCELLED": base.CANCELLED,
    "REVOKED": base.CANCELLED,  # federation: the sibling cluster runs it
    "TIMEOUT": base.TIMEOUT,
    "NODE_FAIL": base.NODE_FAIL,
    "OUT_OF_MEMORY": base.OUT_OF_MEMORY,
    "PREEMPTED": base.PREEMPTED,
}
# Slurm states after which the job record does not change any more.
SLURM_END_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "BOOT_FAIL",
        "DEADLINE",
        "CANCELLED",
        "REVOKED",
        "TIMEOUT",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
    }
)
NO_VALUE = frozenset({"", "None", "N/A", "Unknown", "(null)", "None assigned"})


def check_name(value: str, what: str) -> str:
    if not NAME_RE.fullmatch(value):
        raise BackendError(f"invalid {what} {value!r}: letters, digits, '_', '.', '-' only")
    return value


def check_token(token: str) -> str:
    if not TOKEN_RE.fullmatch(token):
        raise BackendError(f"invalid job token {token!r}")
    return token


def check_job_id(backend_id: str) -> str:
    if not JOB_ID_RE.fullmatch(backend_id):
        raise BackendError(f"invalid Slurm job id {backend_id!r}")
    return backend_id


def check_count(value: int, what: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise BackendError(f"invalid {what} {value!r}")
    return value


def check_job_name(name: str) -> str:
    # squeue and sacct print one job per line: a line break in a name would forge a record
    if not name or len(name) > 200 or any(ord(char) < 32 or ord(char) == 127 for char in name):
        raise BackendError("invalid job name: 1 to 200 characters, no control characters")
    return name


def render_script(script: str, env: dict[str, str]) -> str:
    """The script with `export NAME='value'` lines right after its shebang.

    The exports end sbatch's scan for #SBATCH lines too, so the script cannot add scheduler
    options the portal did not choose (a node list, an array, another output file).
    """
    if not script.startswith("#!"):
        raise BackendError("the batch script must start with a #! line")
    if "\0" in script:
        raise BackendError("the batch script contains a NUL byte")
    lines = []
    for name, value in env.items():
        if not isinstance(name, str) or not ENV_NAME_RE.fullmatch(name):
            raise BackendError(f"invalid environment variable name {name!r}")
        if not isinstance(value, str) or "\0" in value:
            raise BackendError(f"invalid value for environment variable {name}: a string without NUL bytes")
        lines.append(f"export {name}={shlex.quote(value)}\n")
    shebang, _newline, body = script.partition("\n")
    return f"{shebang}\n{''.join(lines)}{body}"


def slurm_time(text: str) -> datetime | None:
    """A time printed by squeue/sacct run with TZ=UTC ("2026-11-29T15:04:05"), aware, in UTC."""
    text = text.strip()
    if text in NO_VALUE:
        return None
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC)
    except ValueError:
        return None


def sacct_exit_code(text: str) -> int | None:
    """sacct's "N:M" (exit code N, or killed by signal M) as a shell would report it."""
    code, _colon, signal = text.strip().partition(":")
    if not code.isdigit():
        return None
    if int(code) == 0 and signal.isdigit() and int(signal) != 0:
        return 128 + int(signal)
    return int(code)


def wait_status_exit_code(text: str) -> int | None:
    """squeue's exit_code is the raw wait(2) status: exit code in the high byte, signal low."""
    if not text.strip().isdigit():
        return None
    status = int(text)
    return 128 + (status & 0x7F) if status & 0x7F else status >> 8


def portal_state(raw_state: str, started: bool) -> str:
    word = raw_state.split()[0] if raw_state.strip() else ""
    state = STATES.get(word.rstrip("+"))
    if state is None:  # a state this table does not know: never report an end for it
        return base.RUNNING if started else base.PENDING
    return state


def minutes(text: str) -> int | None:
    """sinfo's time limit ("infinite", "1-00:00:00", "2:00:00", "30:00") in minutes."""
    text = text.strip()
    if text.lower() in {"infinite", "unlimited", "n/a", ""}:
        return None
    days, _dash, clock = text.rpartition("-")
    parts = [int(part) for part in clock.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0)
    hours, mins, secs = parts[-3:]
    return (int(days or 0) * 24 + hours) * 60 + mins + (1 if secs else 0)


def gpu_gres(text: str) -> dict[str, int]:
    """GPU counts by type from a GRES string: "gpu:h100:4(S:0-1),gpu:a100:2(IDX:0,2)"."""
    counts: dict[str, int] = {}
    text = re.sub(r"\([^)]*\)", "", text)  # socket and index lists may contain commas
    for item in text.split(","):
        parts = item.strip().split(":")
        if parts[0] != "gpu" or len(parts) < 2 or not parts[-1].isdigit():
            continue
        gpu_type = parts[1] if len(parts) == 3 else ""
        counts[gpu_type] = counts.get(gpu_type, 0) + int(parts[-1])
    return counts


def tres(text: str) -> dict[str, str]:
    """sacctmgr's "gres/gpu:a100=2,gres/gpu=2" as a dict."""
    pairs = (item.partition("=") for item in text.split(",") if item)
    return {name: value for name, _eq, value in pairs}
