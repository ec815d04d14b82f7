"""Figures of a load run (bench/load.py): latency percentiles per endpoint, the tables it
prints, and each target of the issue judged against its figure (or its peer's, same run)."""

from __future__ import annotations

import math
import threading
from collections import defaultdict

LAG_WARN_S = 0.010
# list_p99, mixed_p99: issue 8's; the rest issue 18's (the P99 SLA of 200 ms with margin)
TARGETS_MS = {
    "list_p99": 25.0,
    "mixed_p99": 50.0,
    "mix_p99_100": 100.0,
    "sla_p99": 200.0,
    "submit_p99": 100.0,
}
RSS_LIMIT_MB = {"web": 150.0, "celery": 250.0}


def pct(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile of sorted values (NaN when there are none)."""
    if not sorted_values:
        return math.nan
    return sorted_values[max(0, math.ceil(p / 100 * len(sorted_values)) - 1)]


class Recorder:
    """Samples per (phase, endpoint): latency from the scheduled time and success; per phase the
    schedule loop's lateness and the requests' wait for a sender."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.samples: dict[tuple[str, str], list[float]] = defaultdict(list)
        self.errors: dict[tuple[str, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.lag: dict[tuple[str, str], list[float]] = defaultdict(list)  # (phase, "loop"|"sender")
        # per phase, every request: (due, latency, endpoint, error); due from the phase's start
        self.timeline: dict[str, list[tuple[float, float, str, str]]] = defaultdict(list)
        self.started: dict[str, float] = {}

    def add(
        self,
        phase: str,
        endpoint: str,
        latency_s: float,
        error: str = "",
        wait_s: float | None = None,
        due: float | None = None,
    ):
        with self.lock:
            self.samples[(phase, endpoint)].append(latency_s)
            if error:
                self.errors[(phase, endpoint)][error] += 1
            if wait_s is not None:
                self.lag[(phase, "sender")].append(wait_s)
            if due is not None and phase in self.started:
                self.timeline[phase].append((due - self.started[phase], latency_s, endpoint, error))

    def loop_late(self, phase: str, late_s: float) -> None:
        self.lag[(phase, "loop")].append(late_s)  # one thread appends: no lock needed

    def stats(self, phase: str) -> dict[str, dict]:
        rows = {}
        keys = sorted(k for k in self.samples if k[0] == phase)
        for _, endpoint in keys:
            rows[endpoint] = self._row(
                self.samples[(phase, endpoint)], self.errors.get((phase, endpoint), {})
            )
        portal = [(k, v) for k, v in self.samples.items() if k[0] == phase and not k[1].startswith("slurm")]
        if len(portal) > 1:  # a mix: its figures over every portal request too
            errs: dict[str, int] = defaultdict(int)
            for key, _ in portal:
                for what, n in self.errors.get(key, {}).items():
                    errs[what] += n
            rows["ALL (portal)"] = self._row([x for _, v in portal for x in v], errs)
        return rows

    @staticmethod
    def _row(values: list[float], errors: dict[str, int]) -> dict:
        ms = sorted(v * 1000 for v in values)
        return {
            "count": len(ms),
            "p50_ms": pct(ms, 50),
            "p95_ms": pct(ms, 95),
            "p99_ms": pct(ms, 99),
            "max_ms": ms[-1] if ms else math.nan,
            "errors": sum(errors.values()),
            "error_kinds": dict(errors),
        }

    def lag_stats(self, phase: str) -> dict:
        out = {}
        for kind in ("loop", "sender"):
            ms = sorted(v * 1000 for v in self.lag.get((phase, kind), []))
            out[kind] = {"p50_ms": pct(ms, 50), "p99_ms": pct(ms, 99), "max_ms": ms[-1] if ms else math.nan}
        return out


def print_table(title: str, rows: dict[str, dict], lag: dict | None = None) -> None:
    print(f"\n== {title}")
    print(f"  {'endpoint':<28}{'count':>7}{'P50':>9}{'P95':>9}{'P99':>9}{'max':>9}{'errors':>8}")
    for endpoint, r in rows.items():
        print(
            f"  {endpoint:<28}{r['count']:>7}{r['p50_ms']:>9.1f}{r['p95_ms']:>9.1f}{r['p99_ms']:>9.1f}"
            f"{r['max_ms']:>9.1f}{r['errors']:>8}" + (f"  {r['error_kinds']}" if r["errors"] else "")
        )
    for kind, what in (("loop", "schedule loop late"), ("sender", "wait for a sender")):
        if not lag:
            break
        one = lag[kind]
        warn = "  (the generator fell behind)" if kind == "loop" and one["p99_ms"] > LAG_WARN_S * 1000 else ""
        print(f"  {what} ms: P50 {one['p50_ms']:.1f}  P99 {one['p99_ms']:.1f}  max {one['max_ms']:.1f}{warn}")


def targets(results: dict) -> list[dict]:
    """Each target of the issue: the figure, the bound it must meet, and whether it did."""
    out = []

    def add(target: str, figure: str, bound: str, passed: bool) -> None:
        out.append({"target": target, "figure": figure, "bound": bound, "pass": passed})

    def ep(phase: str, name: str) -> dict | None:
        rows = results["phases"].get(phase, {}).get("endpoints", {})
        return next((r for k, r in rows.items() if k.startswith(name)), None)

    for name, phase, mine, peer, factor in (
        ("(#8) get a job P99 vs slurmrestd", "a", "portal GET job", "slurmrestd GET job", 1.5),
        ("(#8) submit P99 vs slurmrestd", "b", "portal POST job", "slurmrestd POST submit", 2.0),
    ):
        if (a := ep(phase, mine)) and (b := ep(phase, peer)):
            bound = f"≤ {factor:g} × {b['p99_ms']:.1f} ms"
            add(name, f"{a['p99_ms']:.1f} ms", bound, a["p99_ms"] <= factor * b["p99_ms"] and not a["errors"])
    if row := ep("c", "portal GET jobs"):
        bound = TARGETS_MS["list_p99"]
        add("(#8) tenant job list P99", f"{row['p99_ms']:.1f} ms", f"≤ {bound:g} ms",
            row["p99_ms"] <= bound and not row["errors"])  # fmt: skip
    if (a := ep("d", "portal all active")) and (b := ep("d", "slurmrestd GET jobs")):
        add("(#8) all active jobs (P50) vs slurmrestd list", f"{a['p50_ms']:.0f} ms", f"< 0.5 × {b['p50_ms']:.0f} ms",
            a["p50_ms"] < 0.5 * b["p50_ms"] and not a["errors"])  # fmt: skip
    if row := ep("e", "ALL (portal)"):
        bound = TARGETS_MS["mixed_p99"]
        add("(#8) mixed load P99, no errors", f"{row['p99_ms']:.1f} ms, {row['errors']} errors", f"≤ {bound:g} ms, 0",
            row["p99_ms"] <= bound and row["errors"] == 0)  # fmt: skip
    _sla_targets(results, add, ep)
    rss = results.get("rss", {})
    for kind, label in (("web", "web worker"), ("celery", "Celery worker")):
        # gunicorn's master serves nothing; Celery's main process and its pool children all count
        rows = [v for k, v in rss.items() if k.startswith(kind) and (kind == "celery" or "master" not in k)]
        if rows:
            worst = max(v["max_mb"] for v in rows)
            growth = max(v["end_mb"] - v["start_mb"] for v in rows)
            limit = RSS_LIMIT_MB[kind]
            add(
                f"{label} RSS (max; growth)",
                f"{worst:.0f} MB; {growth:+.0f} MB",
                f"≤ {limit:g} MB",
                worst <= limit,
            )
    return out


def _sla_targets(results: dict, add, ep) -> None:
    """Issue 18's: the floor's ratio under load, the mix at 100/s and 150/s, submissions at
    50/s, the capacity, and the overload's figures."""
    for label, phase, mine, floor_phase, floor in (
        ("get a job P99 ÷ the floor's", "a", "portal GET job", "g", "floor GET job"),
        ("page of 50 P99 ÷ the floor's", "c", "portal GET jobs", "h", "floor GET jobs"),
    ):
        if (a := ep(phase, mine)) and (b := ep(floor_phase, floor)):
            ratio = a["p99_ms"] / b["p99_ms"]
            add(label, f"{ratio:.2f} × ({a['p99_ms']:.1f} / {b['p99_ms']:.1f})", "≤ 1.3 ×",
                ratio <= 1.3 and not a["errors"])  # fmt: skip
    for phase, bound in (("e", TARGETS_MS["mix_p99_100"]), ("i", TARGETS_MS["sla_p99"])):
        if row := ep(phase, "ALL (portal)"):
            rate = results["config"].get("sla_rate" if phase == "i" else "rate")
            add(f"mix P99 at {rate:g}/s, no errors", f"{row['p99_ms']:.1f} ms, {row['errors']} errors",
                f"≤ {bound:g} ms, 0", row["p99_ms"] <= bound and row["errors"] == 0)  # fmt: skip
    if row := ep("b", "portal POST job"):
        rate, bound = results["config"].get("submit_rate"), TARGETS_MS["submit_p99"]
        add(f"submit P99 at {rate:g}/s, dispatched meanwhile", f"{row['p99_ms']:.1f} ms, {row['errors']} errors",
            f"≤ {bound:g} ms, 0", row["p99_ms"] <= bound and row["errors"] == 0)  # fmt: skip
    if found := results["phases"].get("k", {}).get("capacity_per_s"):
        for label, rate in found.items():
            add(f"capacity, {label} (P99 ≤ {TARGETS_MS['sla_p99']:g} ms)", "none" if rate is None else f"{rate:g}/s",
                "reported", rate is not None)  # fmt: skip
    if o := results["phases"].get("o", {}).get("figures"):
        at = f"at {o['rate_high_per_s']:g}/s"
        add(
            f"overload {at}: longest wait for an answer",
            f"{o['max_ms']:.0f} ms",
            "≤ 1000 ms",
            o["max_ms"] <= 1000,
        )
        add(f"overload {at}: answered P99", f"{o['answered_p99_ms']:.0f} ms ({o['answered']} answered)",
            "≤ 500 ms", o["answered_p99_ms"] <= 500)  # fmt: skip
        add(f"overload {at}: refused fast, nothing else failed", f"{o['refused']} refused, {o['failed']} failed",
            "503s only", o["failed"] == 0)  # fmt: skip
        add(
            "overload: back to normal after the drop",
            f"{o['recovery_s']:g} s",
            "≤ 10 s",
            o["recovery_s"] <= 10,
        )
        add(
            "overload: accepted submissions lost", f"{o['lost']} of {o['submitted_201']}", "0", o["lost"] == 0
        )


def print_summary(results: dict) -> None:
    if results.get("rss"):
        print("\n== RSS (MB): start / max / end")
        for label, v in sorted(results["rss"].items()):
            print(
                f"  {label:<28}{v['start_mb']:>8.0f}{v['max_mb']:>8.0f}{v['end_mb']:>8.0f}   ({v['samples']} samples)"
            )
    print("\n== targets")
    for t in results["targets"]:
        print(f"  {'PASS' if t['pass'] else 'FAIL'}  {t['target']:<52} {t['figure']:>28}   {t['bound']}")
    if floor := floor_lines(results):
        print("\n== the floor against the same bounds (bench/floor_views.py; not the portal)")
        for line in floor:
            print(f"  {line}")


def floor_lines(results: dict) -> list[str]:
    """Phases g and h against the bounds of a and c: what a bare Django view reaches here."""
    lines = []
    g = results["phases"].get("g", {}).get("endpoints", {})
    if (mine := g.get("floor GET job")) and (peer := g.get("slurmrestd GET job")):
        ratio = mine["p99_ms"] / peer["p99_ms"]
        lines.append(
            f"get a job P99: {mine['p99_ms']:.1f} ms = {ratio:.2f} × slurmrestd's {peer['p99_ms']:.1f} ms "
            f"(bound 1.5 ×), {mine['errors']} errors"
        )
    h = results["phases"].get("h", {}).get("endpoints", {})
    if row := h.get("floor GET jobs (50, state)"):
        lines.append(
            f"tenant job list P99: {row['p99_ms']:.1f} ms (bound {TARGETS_MS['list_p99']:g} ms), {row['errors']} errors"
        )
    return lines
