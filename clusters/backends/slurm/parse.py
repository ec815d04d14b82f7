"""What goes to Slurm checked, what comes back parsed: names, states, times, exit codes, GRES."""

from __future__ import annotations

import base64
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
    "PENDING": base.JobState.PENDING,
    "CONFIGURING": base.JobState.PENDING,
    "REQUEUED": base.JobState.PENDING,
    "REQUEUE_FED": base.JobState.PENDING,
    "REQUEUE_HOLD": base.JobState.PENDING,
    "SPECIAL_EXIT": base.JobState.PENDING,  # requeued and held by the job's own exit code
    "RESV_DEL_HOLD": base.JobState.PENDING,
    "RUNNING": base.JobState.RUNNING,
    "COMPLETING": base.JobState.RUNNING,
    "SUSPENDED": base.JobState.RUNNING,
    "STOPPED": base.JobState.RUNNING,
    "SIGNALING": base.JobState.RUNNING,
    "STAGE_OUT": base.JobState.RUNNING,
    "RESIZING": base.JobState.RUNNING,
    "COMPLETED": base.JobState.COMPLETED,
    "FAILED": base.JobState.FAILED,
    "BOOT_FAIL": base.JobState.FAILED,
    "DEADLINE": base.JobState.FAILED,
    "CANCELLED": base.JobState.CANCELLED,
    "REVOKED": base.JobState.CANCELLED,  # federation: the sibling cluster runs it
    "TIMEOUT": base.JobState.TIMEOUT,
    "NODE_FAIL": base.JobState.NODE_FAIL,
    "OUT_OF_MEMORY": base.JobState.OUT_OF_MEMORY,
    "PREEMPTED": base.JobState.PREEMPTED,
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


def render_script(script: str, env: dict[str, str], *, then: str = "") -> str:
    """The script with a `:` line and `export NAME='value'` lines right after its shebang.

    sbatch reads #SBATCH lines only up to the first command: the `:` (a no-op) ends its scan
    whatever the env, so the script cannot add scheduler options the portal did not choose (an
    account, a node list, an array, another output file). `then`: the portal's own lines after
    the exports (fixed text, never a user's).
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
    return f"{shebang}\n: portal options end here\n{''.join(lines)}{then}{body}"


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
        return base.JobState.RUNNING if started else base.JobState.PENDING
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


def split_rows(stdout: str, fields: int) -> list[list[str]]:
    """Lines of "|"-separated fields; the last field takes any further "|"."""
    rows = []
    for line in stdout.splitlines():
        if line.strip():
            row = line.split("|", fields - 1)
            rows.append(row + [""] * (fields - len(row)))
    return rows


# --- Batched submission: one SSH exec runs sbatch once per job (SlurmBackend.submit_many).
#
# The remote command is this fixed script (`sh -c SBATCH_BATCH_SH`), run by the portal's service
# user; every value reaches it as data on stdin, one per line, never as shell text: per job its
# token, the identity it runs as, its directory (<scratch root>/<identity>/<tenant>), a count,
# that many sbatch arguments, and its batch script in base64 on one line (sbatch reads the script
# from its stdin). All of a job's lines are read before any check, and no command but sbatch reads
# stdin, so a job refused half-way cannot shift the next job's lines. Per job it checks that the
# identity exists (`id`) and owns <scratch root>/<identity> (which the site's admin makes with the
# identity: a tree that another identity made, or none, is refused), makes the tenant's directory
# in it as the identity (`sudo -n -u`, the one sudoers rule) — these once per identity and
# directory of the batch — and runs sbatch as the identity. It answers one line per job, in order:
# "<token> <exit status> <job id, or the error message on one line>". A job with no line was not
# reached, or its answer was cut off with the connection: its outcome is unknown.
SBATCH_BATCH_SH = " ".join(  # one line: no argument of a remote command may hold a line break
    (
        r"set -u; LC_ALL=C; export LC_ALL;",
        r'err=$(mktemp) || exit 66; ready="";',
        r"""trap 'rm -f "$err"' EXIT; trap 'rm -f "$err"; exit 129' HUP INT TERM PIPE;""",
        r"""answer() { printf '%s %s %s\n' "$token" "$1" "$2"; };""",
        r"""failed() { answer "$1" "$(tr '\r\n' '  ' <"$err")"; };""",
        r"while IFS= read -r token; do",
        r"IFS= read -r user || exit 64; IFS= read -r dir || exit 64;",
        r"IFS= read -r count || exit 64; set --;",
        r'while [ "$count" -gt 0 ]; do',
        r'IFS= read -r arg || exit 64; set -- "$@" "$arg"; count=$((count - 1)); done;',
        r"IFS= read -r script || exit 64;",
        # the checks and the mkdir once per identity and directory in a batch: each is a sudo
        r'case "$ready" in *"|$user|$dir|"*) ;; *)',
        r'if ! id -u -- "$user" >/dev/null 2>&1 </dev/null; then',
        r'answer 67 "cluster identity $user does not exist on the login node"; continue; fi;',
        r"top=${dir%/*};",
        r"""if [ "$(stat -c %U -- "$top" 2>/dev/null </dev/null)" != "$user" ]; then""",
        r'answer 69 "$top is missing or not owned by $user: the site makes it with the identity";',
        r"continue; fi;",
        r'if ! sudo -n -u "$user" -- mkdir -p -m 0700 -- "$dir" 2>"$err" </dev/null;',
        r"then failed 68; continue; fi;",
        r'ready="$ready|$user|$dir|";; esac;',
        r"""out=$(printf '%s\n' "$script" | base64 -d |""",
        r"""sudo -n -u "$user" -- sbatch "$@" 2>"$err"); rc=$?;""",
        r"""[ "$rc" -eq 0 ] || out=$(tr '\r\n' '  ' <"$err");""",
        r'answer "$rc" "$out";',
        r"done",
    )
)
BATCH_EXIT_MKTEMP = 66
SBATCH_ID_RE = re.compile(r"([0-9]+)(;\S+)?")  # --parsable: "123" or "123;cluster"


def check_line(value: str, what: str) -> str:
    """A value sent as one line of the batch's stdin: a line break would shift every field after it."""
    if "\n" in value or "\r" in value or "\0" in value:
        raise BackendError(f"refusing a line break or NUL byte in {what}")
    return value


def batch_job_lines(token: str, user: str, directory: str, argv: list[str], script: str) -> str:
    """One job's part of the batch's stdin; argv are sbatch's arguments (without "sbatch")."""
    lines = [check_token(token), check_name(user, "cluster identity")]
    lines.append(check_line(directory, "a job directory"))
    lines += [str(len(argv)), *(check_line(arg, "an sbatch argument") for arg in argv)]
    lines.append(base64.b64encode(script.encode()).decode())
    return "".join(f"{line}\n" for line in lines)


def batch_answers(stdout: str) -> dict[str, tuple[int, str]]:
    """Per token, sbatch's exit status and its answer (the job id, or its error message)."""
    answers = {}
    for line in stdout.splitlines():
        token, _space, rest = line.partition(" ")
        rc, _space, text = rest.partition(" ")
        if TOKEN_RE.fullmatch(token) and rc.isdigit():
            answers[token] = (int(rc), text.strip())
    return answers


def sbatch_job_id(answer: str) -> str | None:
    """The job id in what sbatch --parsable printed on stdout, or None."""
    words = answer.split()
    found = SBATCH_ID_RE.fullmatch(words[-1]) if words else None
    return found[1] if found else None
