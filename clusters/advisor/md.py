"""The molecular dynamics advisor: GPUs to reach the wanted ns/day, from a throughput index
calibrated on public AMBER/GROMACS figures, and GPU-hours for the whole simulated length. A system
that one GPU holds and runs fast enough gets the fraction of it that still reaches the ns/day.
The options are ranked by cost, as the scenario ranks its models (throughput per cost): those
that reach the wanted ns/day first, then the cheapest simulated nanosecond."""

import math
from collections.abc import Sequence
from dataclasses import dataclass

from django.utils.translation import gettext as _
from django.utils.translation import ngettext

from clusters.advisor.base import (
    GPUS_PER_NODE,
    MAX_GPUS,
    SLACK,
    USABLE_MEMORY,
    WHOLE,
    Advice,
    GpuFigures,
    Option,
    advice_from,
    decimal,
    fraction_for,
    memory_gpus,
    no_rate,
    nodes_for,
    num,
    option,
    pct,
    too_big,
)


@dataclass(frozen=True)
class MdJob:
    atoms: int
    ns_per_day: float
    simulated_ns: float | None = None
    days: float | None = None
    timestep_fs: float = 2.0
    gpus_per_node: int = GPUS_PER_NODE
    max_gpus: int = MAX_GPUS


# atom·ns/day per throughput-index point per fs of time step: one A100 (index 199) then runs a
# 1.07 M-atom STMV-size system at ≈ 50 ns/day with a 4 fs step, the order of public AMBER 22 and
# GROMACS benchmark figures.
MD_CALIBRATION = 67_000
MD_LATENCY_ATOMS = 50_000
MD_ATOMS_PER_GPU = 25_000
MD_KEPT_PER_DOUBLING = 0.8
MD_BYTES_PER_ATOM = 1_000


def _md_speedup(gpus: int) -> float:
    return gpus * MD_KEPT_PER_DOUBLING ** math.log2(gpus)


def advise_md(job: MdJob, gpus: Sequence[GpuFigures]) -> Advice:
    """GPUs to reach the wanted ns/day, and GPU-hours for the whole simulated length."""
    simulated_ns = job.simulated_ns if job.simulated_ns is not None else job.ns_per_day * (job.days or 0)
    effective_atoms = max(job.atoms, MD_LATENCY_ATOMS)
    need_gb = job.atoms * MD_BYTES_PER_ATOM / 1e9
    useful = max(1, job.atoms // MD_ATOMS_PER_GPU)
    if job.simulated_ns is None:
        length = _("Simulated length: %(simulated_ns)s ns (%(days)s days at %(ns_per_day)s ns/day).") % {
            "simulated_ns": num(simulated_ns),
            "days": f"{job.days:g}",
            "ns_per_day": f"{job.ns_per_day:g}",
        }
    else:
        length = _("Simulated length: %(simulated_ns)s ns.") % {"simulated_ns": num(simulated_ns)}
    assumptions = [
        length,
        _(
            "Throughput of one GPU: %(calibration)s × time step (fs) × √(FP32 TFLOP/s × memory GB/s) ÷ "
            "atoms, in ns/day; calibrated so one A100 runs a ≈ 1 M-atom PME system (STMV size) at ≈ 50 "
            "ns/day with a 4 fs step, the order of public AMBER/GROMACS benchmarks. Measure your own "
            "system before a large request."
        )
        % {"calibration": f"{MD_CALIBRATION:,}"},
        _("Below %(atoms)s atoms a GPU is latency-bound: throughput stops growing as the system shrinks.")
        % {"atoms": f"{MD_LATENCY_ATOMS:,}"},
        _(
            "Scaling over MPI: each doubling of GPUs keeps %(kept_pct)s %% efficiency (domain "
            "decomposition, PME all-to-all); no more than one GPU per %(atoms_per_gpu)s atoms."
        )
        % {"kept_pct": pct(MD_KEPT_PER_DOUBLING), "atoms_per_gpu": f"{MD_ATOMS_PER_GPU:,}"},
        _(
            "Memory: ≈ 1 kB per atom; %(usable_pct)s %% of each GPU's memory usable. Time step "
            "%(timestep_fs)s fs; nodes of %(gpus_per_node)s GPUs; at most %(max_gpus)s GPUs."
        )
        % {
            "usable_pct": pct(USABLE_MEMORY),
            "timestep_fs": f"{job.timestep_fs:g}",
            "gpus_per_node": job.gpus_per_node,
            "max_gpus": job.max_gpus,
        },
        _(
            "Order: the options that reach %(ns_per_day)s ns/day first, then by cost (device-equivalent "
            "GPU-hours × the model's cost index, H100-80GB = 100), cheapest first; a fraction of a fast "
            "GPU can come before a whole slower one."
        )
        % {"ns_per_day": f"{job.ns_per_day:g}"},
    ]
    # Per model: (short of the ns/day asked, cost per ns/day): the options' order.
    rank: dict[str, tuple[bool, float]] = {}

    def size(gpu: GpuFigures) -> Option | str:
        index = math.sqrt(gpu.fp32_tflops * gpu.memory_bandwidth_gbs)
        if not index:
            return no_rate(gpu, "FP32")
        one = MD_CALIBRATION * job.timestep_fs * index / effective_atoms
        lines = [
            _("Memory: %(atoms)s atoms × 1 kB = %(need_gb)s GB")
            % {"atoms": f"{job.atoms:,}", "need_gb": num(need_gb)}
        ]
        mem = memory_gpus(need_gb, gpu, lines)
        if mem > job.max_gpus:
            return too_big(gpu, mem, need_gb, job.max_gpus)
        lines += [
            _("Throughput index √(%(fp32)s TFLOP/s FP32 × %(bandwidth)s GB/s) = %(index)s")
            % {"fp32": num(gpu.fp32_tflops), "bandwidth": gpu.memory_bandwidth_gbs, "index": num(index)},
            _("One GPU: %(calibration)s × %(timestep_fs)s fs × %(index)s ÷ %(atoms)s atoms = %(one)s ns/day")
            % {
                "calibration": f"{MD_CALIBRATION:,}",
                "timestep_fs": f"{job.timestep_fs:g}",
                "index": num(index),
                "atoms": f"{effective_atoms:,}",
                "one": num(one),
            },
        ]
        fit = WHOLE
        if mem == 1 and one >= job.ns_per_day:
            need = job.ns_per_day / one
            lines.append(
                _(
                    "One GPU holds the job and reaches %(ns_per_day)s ns/day: %(ns_per_day)s ÷ %(one)s = "
                    "%(need_pct)s %% of its throughput is enough"
                )
                % {"ns_per_day": f"{job.ns_per_day:g}", "one": num(one), "need_pct": num(need * 100)}
            )
            fit = fraction_for(gpu, need_gb=need_gb, compute_need=need, lines=lines)
        if not fit.whole:
            count, rate = 1, one * fit.compute
            lines.append(
                _("At %(compute)s of the GPU's speed: %(compute)s × %(one)s ns/day = %(rate)s ns/day")
                % {"compute": f"{fit.compute:.3g}", "one": num(one), "rate": num(rate)}
            )
        else:
            count, rate = _md_whole(job, one, mem, useful, lines)
        wall_days = simulated_ns / rate
        gpu_hours = count * float(fit.fraction) * wall_days * 24
        if fit.whole:
            total = _(
                "%(simulated_ns)s ns ÷ %(rate)s ns/day = %(wall_days)s days × 24 h × %(count)s GPU(s) = "
                "%(gpu_hours)s GPU-hours"
            )
        else:
            total = _(
                "%(simulated_ns)s ns ÷ %(rate)s ns/day = %(wall_days)s days × 24 h × %(fraction)s of a "
                "GPU = %(gpu_hours)s GPU-hours (device-equivalent)"
            )
        lines.append(
            total
            % {
                "simulated_ns": num(simulated_ns),
                "rate": num(rate),
                "wall_days": num(wall_days),
                "count": count,
                "fraction": decimal(fit.fraction),
                "gpu_hours": num(gpu_hours),
            }
        )
        lines.append(
            _("Cost: %(gpu_hours)s GPU-hours × cost index %(cost_index)s = %(cost)s")
            % {
                "gpu_hours": num(gpu_hours),
                "cost_index": gpu.cost_index,
                "cost": num(gpu_hours * gpu.cost_index),
            }
        )
        # Cost per ns/day rather than the cost itself: the same order, also for a length of 0.
        rank[gpu.slug] = (
            rate < job.ns_per_day * (1 - SLACK),
            count * float(fit.fraction) * gpu.cost_index / rate,
        )
        nodes = nodes_for(count, job.gpus_per_node)
        return option(gpu, gpus=count, nodes=nodes, gpu_hours=gpu_hours, lines=lines, fit=fit)

    advice = advice_from(gpus, size, assumptions)
    # Stable: models of equal cost keep the scenario's order.
    return Advice(advice.assumptions, sorted(advice.options, key=lambda o: rank[o.gpu_model]))


def _md_whole(job: MdJob, one: float, mem: int, useful: int, lines: list[str]) -> tuple[int, float]:
    """Whole GPUs to reach the wanted ns/day (at least `mem`, at most `useful` or max_gpus) and
    the rate they reach, the steps appended to `lines`."""
    top = min(max(useful, mem), job.max_gpus)
    count = next((n for n in range(mem, top + 1) if one * _md_speedup(n) >= job.ns_per_day), top)
    rate = one * _md_speedup(count)
    if count > 1:
        lines.append(
            ngettext(
                "%(count)s GPU: speed-up %(count)s × %(kept)s^log2(%(count)s) = %(speedup)s "
                "→ %(rate)s ns/day",
                "%(count)s GPUs: speed-up %(count)s × %(kept)s^log2(%(count)s) = %(speedup)s "
                "→ %(rate)s ns/day",
                count,
            )
            % {
                "count": count,
                "kept": f"{MD_KEPT_PER_DOUBLING:g}",
                "speedup": f"{_md_speedup(count):.2f}",
                "rate": num(rate),
            }
        )
    if rate < job.ns_per_day:
        lines.append(
            _(
                "Short of the %(ns_per_day)s ns/day asked: more GPUs than %(count)s exceed max_gpus or "
                "leave fewer than %(atoms_per_gpu)s atoms per GPU"
            )
            % {
                "ns_per_day": f"{job.ns_per_day:g}",
                "count": count,
                "atoms_per_gpu": f"{MD_ATOMS_PER_GPU:,}",
            }
        )
    return count, rate
