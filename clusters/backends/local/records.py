"""A local job's records: its wrapper process, known by boot, pid and start time (so that a pid
reused after the job's end is never taken for the job), and its JSON files, replaced whole."""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any


@functools.cache
def boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def start_ticks(pid: int, *, running: bool = False) -> int | None:
    """The process's start time in clock ticks since boot; None if it is gone (or, with running, a
    zombie)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()  # the name may hold ")"
    except OSError:
        return None
    return None if running and fields[0] in "ZX" else int(fields[19])


def alive(proc: dict[str, Any]) -> bool:
    """Whether the job's wrapper still runs: same boot, same pid and start time, not a zombie."""
    ticks = start_ticks(proc["pid"], running=True)
    return ticks is not None and ticks == proc["start_ticks"] and proc["boot_id"] == boot_id()


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None


def write_json(path: Path, data: Any) -> None:
    # Readers do not take the lock, so they must see the old file or the new one, never half of one.
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
