"""Resident memory of the stack's processes over a run (bench/load.py): gunicorn's master and
workers and the Celery worker with its pool children, found from the pid files that
scripts/stack writes (web.pid: gunicorn's master; worker.pid: Celery's main process)."""

from __future__ import annotations

import os
import threading
from collections import defaultdict
from pathlib import Path


def children_of(pid: int) -> list[int]:
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                stat = Path(f"/proc/{entry.name}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


class RssSampler(threading.Thread):
    """VmRSS of gunicorn's master and workers and of the Celery worker and its pool children,
    from the stack's pid files, every interval seconds."""

    def __init__(self, stack_dir: Path, interval_s: float) -> None:
        super().__init__(daemon=True)
        self.stack_dir, self.interval_s = stack_dir, interval_s
        self.series: dict[str, list[float]] = defaultdict(list)
        self.halt = threading.Event()

    def _processes(self) -> dict[str, int]:
        found = {}
        for name, kind in (("web", "web"), ("worker", "celery")):
            try:
                master = int((self.stack_dir / f"{name}.pid").read_text().strip())
            except (OSError, ValueError):
                continue
            found[f"{kind} master {master}"] = master
            for child in children_of(master):
                found[f"{kind} {'worker' if kind == 'web' else 'child'} {child}"] = child
        return found

    def sample(self) -> None:
        for label, pid in self._processes().items():
            mb = rss_mb(pid)
            if mb is not None:
                self.series[label].append(mb)

    def run(self) -> None:
        while not self.halt.is_set():
            self.sample()
            self.halt.wait(self.interval_s)

    def stop(self) -> None:
        self.halt.set()
        self.join(timeout=10)
        self.sample()

    def summary(self) -> dict[str, dict]:
        return {
            label: {"start_mb": v[0], "max_mb": max(v), "end_mb": v[-1], "samples": len(v)}
            for label, v in self.series.items()
        }


def cpu_pressure() -> str:
    """How starved of CPU the machine was lately (PSI "some": the share of time in which at least
    one runnable task waited for a CPU) and its load average: the noise the same-run ratios are
    meant to withstand, printed beside each phase's figures."""
    try:
        some = Path("/proc/pressure/cpu").read_text().splitlines()[0].split()
        psi = ", ".join(f"{part.replace('=', ' ')}%" for part in some[1:3])
    except (OSError, IndexError):
        psi = "n/a"
    return f"CPU pressure {psi}; load average {os.getloadavg()[0]:.1f}"


def cpu_some_avg10() -> float | None:
    """PSI's "some avg10" for the CPU, in %, or None where the kernel has no PSI."""
    try:
        return float(Path("/proc/pressure/cpu").read_text().split()[1].partition("=")[2])
    except (OSError, IndexError, ValueError):
        return None


# CPU time by part of the stack over a phase (bench/load.py): what each part costs per request,
# the per-core figures docs/scaling.md scales from. Processes are grouped by their command name.
CPU_GROUPS = {
    "web (gunicorn)": ("gunicorn",),
    "nginx": ("nginx",),
    "celery": ("celery",),
    "postgres": ("postgres",),
    "redis": ("redis-server",),
    "slurm": ("slurmctld", "slurmd", "slurmdbd", "slurmrestd", "munged", "mariadbd", "sshd", "sbatch"),
}
_TICK_S = 1 / os.sysconf("SC_CLK_TCK")


def _group_of(pid: str) -> str | None:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    words = " ".join(os.path.basename(part.decode(errors="replace")) for part in cmdline[:3])
    for group, names in CPU_GROUPS.items():
        if any(name in words for name in names):
            return group
    return None


def cpu_seconds_by_group() -> dict[str, float]:
    """user + system CPU seconds of every live process of each group (children it has reaped
    included), read from /proc; the load generator itself is in none."""
    totals: dict[str, float] = defaultdict(float)
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        group = _group_of(entry.name)
        if group is None:
            continue
        try:
            fields = Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # after the command: state is field 3, utime 14, stime 15, cutime 16, cstime 17 (1-based)
        totals[group] += sum(int(fields[i]) for i in (11, 12, 13, 14)) * _TICK_S
    return dict(totals)


def cpu_between(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """CPU seconds each group used between two readings (a process that ended meanwhile is lost:
    its own parent's cutime counts it only once reaped)."""
    return {group: max(0.0, after.get(group, 0.0) - before.get(group, 0.0)) for group in CPU_GROUPS}
