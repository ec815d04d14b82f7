"""bench/load.py's phases k and o: the capacity (the highest rate at which the mix keeps the
SLA's P99) and the overload at twice it (how long any request waits, the answered P99, the
recovery after the drop, and whether an accepted submission is lost). Each takes the run's Load."""

from __future__ import annotations

import math
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

from bench.figures import pct
from bench.openloop import ApiError, run_open_loop
from bench.rss import cpu_pressure

SLA_P99_MS = 200.0  # the Postman SLA our sites use: the capacity is the rate that keeps it
RECOVERY_S = 20.0  # phase o: how long the load stays low after the overload


def phase_capacity(load) -> None:
    """Phase k: the mix at rising rates (--capacity-rates, --step-seconds each) while its P99
    stays within the SLA with no error; then slurmrestd's get the same way. The capacity is
    the highest rate that held."""
    steps = [float(r) for r in load.args.capacity_rates.split(",")]
    found = {}
    for label, pick in (("portal mix", load.mixed), ("slurmrestd GET job", load.rest_get_job)):
        held = None
        for rate in steps:
            # A rate fails when two runs of it in a row fail: one burst of the machine's own
            # (a periodic task, another process) does not end the search.
            if not any(_step_holds(load, label, pick, rate, attempt) for attempt in (1, 2)):
                break
            held = rate
        found[label] = held
    print_table_capacity(found)
    load.results["phases"]["k"] = {
        "capacity_per_s": found,
        "steps": steps,
        "step_s": load.args.step_seconds,
    }
    load.capacity = found.get("portal mix")


def _step_holds(load, label: str, pick, rate: float, attempt: int) -> bool:
    key = f"k {label} @{rate:g}/s" + (" (again)" if attempt > 1 else "")
    load.settle(key)
    run_open_loop(key, [(rate, pick)], load.args.step_seconds, load.args.senders, load.rec)
    p99, errors = _overall(load.rec.stats(key))
    late = load.rec.lag_stats(key)["loop"]["p99_ms"]
    print(f"  {key}: P99 {p99:.1f} ms, {errors} errors (schedule loop late P99 {late:.1f} ms)")
    return p99 <= SLA_P99_MS and not errors


def phase_overload(load) -> None:
    """Phase o: the mix at twice the capacity (phase k's, else --overload-rate ÷ 2) for
    --duration, then at half the capacity for RECOVERY_S more. Refusals (503 `unavailable`)
    are the portal shedding what waited too long; the figures: how long any request waited
    before its answer, the answered ones' P99, how soon after the load drops every second is
    back to normal, and whether every submission answered 201 exists afterwards."""
    capacity = getattr(load, "capacity", None) or load.args.overload_rate / 2
    high, low, span = 2 * capacity, capacity / 2, load.args.duration
    submitted_before = len(load.site.submitted)
    key = "o"
    load.settle(key)
    senders = max(load.args.senders, int(high * 2))  # answers may take a second: enough in flight
    streams = [(high, load.mixed, 0.0, span), (low, load.mixed, span, span + RECOVERY_S)]
    run_open_loop(key, streams, span + RECOVERY_S, senders, load.rec)
    timeline = load.rec.timeline[key]
    over = [t for t in timeline if t[0] < span]
    answered = sorted(t[1] * 1000 for t in over if not t[3])
    refused = sorted(t[1] * 1000 for t in over if t[3].startswith("HTTP 503"))
    failed = [t for t in over if t[3] and not t[3].startswith("HTTP 503")]
    recovery_s = _recovery_s(timeline, span, span + RECOVERY_S)
    accepted = load.site.submitted[submitted_before:]
    lost = _missing(load, accepted)
    figures = {
        "rate_high_per_s": high,
        "rate_low_per_s": low,
        "requests": len(over),
        "answered": len(answered),
        "answered_p99_ms": pct(answered, 99),
        "refused": len(refused),
        "refused_max_ms": refused[-1] if refused else 0.0,
        "max_ms": max([t[1] * 1000 for t in over], default=0.0),
        "failed": len(failed),
        "failed_kinds": sorted({t[3] for t in failed}),
        "recovery_s": recovery_s,
        "submitted_201": len(accepted),
        "lost": lost,
    }
    print(f"\n== o: overload, the mix at {high:g}/s for {span:g} s, then {low:g}/s for {RECOVERY_S:g} s")
    for name, value in figures.items():
        print(f"  {name:<20} {value:.1f}" if isinstance(value, float) else f"  {name:<20} {value}")
    load.results["phases"]["o"] = {"figures": figures, "machine": cpu_pressure()}


def _missing(load, accepted: list[tuple[str, str]]) -> int:
    """How many of these (token, job id) the portal no longer answers: lost submissions."""

    def gone(item) -> bool:
        token, job_id = item
        for _ in range(5):  # bounded: a 503 now is the overload's tail, not a loss
            try:
                load.api.call("GET", f"/api/v1/jobs/{job_id}/", token)
                return False
            except ApiError as exc:
                if not str(exc).startswith("HTTP 503"):
                    return True
                time.sleep(1)
        return True

    with ThreadPoolExecutor(max_workers=4) as pool:
        return sum(pool.map(gone, accepted))


def _overall(rows: dict[str, dict]) -> tuple[float, int]:
    """P99 and errors of a phase's rows: its ALL line when it has one, else its one endpoint."""
    row = rows.get("ALL (portal)") or next(iter(rows.values()))
    return row["p99_ms"], row["errors"]


def _recovery_s(timeline: list[tuple], drop_s: float, end_s: float) -> float:
    """Seconds after the load dropped until every later second (by arrival) had no refusal, no
    error and a P99 within the SLA: how soon the portal was back to normal. inf: never."""
    windows: dict[int, list[tuple]] = defaultdict(list)
    for due, latency, _, error in timeline:
        if due >= drop_s:
            windows[int(due - drop_s)].append((latency * 1000, error))
    last = int(end_s - drop_s)
    normal_from = last
    for second in range(last - 1, -1, -1):
        got = windows.get(second, [])
        if any(error for _, error in got) or pct(sorted(ms for ms, _ in got), 99) > SLA_P99_MS:
            break
        normal_from = second
    return float(normal_from) if normal_from < last else math.inf


def print_table_capacity(found: dict) -> None:
    print(f"\n== k: capacity, the highest rate whose P99 stayed ≤ {SLA_P99_MS:g} ms with no error")
    for label, rate in found.items():
        print(f"  {label:<24} {'below the first step' if rate is None else f'{rate:g}/s'}")
