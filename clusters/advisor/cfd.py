"""The CFD and FEA advisor: GPUs to hold the mesh and finish its iterations within the target
days, each cell-iteration timed by a roofline (memory traffic or FLOP, whichever is slower). A
mesh that one GPU holds and solves in time gets the fraction of it that still does."""

import math
from collections.abc import Sequence
from dataclasses import dataclass

from django.utils.translation import gettext as _
from django.utils.translation import ngettext

from clusters.advisor.base import (
    GPUS_PER_NODE,
    MAX_GPUS,
    USABLE_MEMORY,
    Advice,
    GpuFigures,
    Option,
    advice_from,
    fraction_for,
    fraction_hours,
    in_time,
    memory_gpus,
    nodes_for,
    num,
    option,
    pct,
    too_big,
)


@dataclass(frozen=True)
class CfdJob:
    cells_m: float
    iterations: int
    precision: str = "fp64"
    target_days: float = 1.0
    gpus_per_node: int = GPUS_PER_NODE
    max_gpus: int = MAX_GPUS


# One outer iteration of a pressure-based implicit solver (or one explicit step), per cell:
# tens of sparse multigrid sweeps at about 1 FLOP per byte. An order of magnitude, set so that a
# V100-class GPU takes ≈ 0.1-0.2 µs per cell-iteration, i.e. does the work of a few dozen cores.
CFD_BYTES_PER_CELL = 100_000
CFD_FLOP_PER_CELL = 100_000
CFD_MIXED_BYTES = 0.6
CFD_BANDWIDTH_EFFICIENCY = 0.7
CFD_FLOP_EFFICIENCY = 0.5
CFD_GB_PER_MCELL = {"fp64": 2.0, "mixed": 1.2}
CFD_MIN_MCELLS_PER_GPU = 1.0
CFD_PARALLEL_EFFICIENCY = 0.9


def advise_cfd(job: CfdJob, gpus: Sequence[GpuFigures]) -> Advice:
    """GPUs to hold the mesh and finish its iterations within the target days (roofline)."""
    fp64 = job.precision == "fp64"
    per_cell_bytes = CFD_BYTES_PER_CELL * (1 if fp64 else CFD_MIXED_BYTES)
    need_gb = job.cells_m * CFD_GB_PER_MCELL[job.precision]
    cell_iterations = job.cells_m * 1e6 * job.iterations
    useful = max(1, math.floor(job.cells_m / CFD_MIN_MCELLS_PER_GPU))
    target_h = job.target_days * 24
    assumptions = [
        _(
            "Work per cell and iteration (one implicit outer iteration or explicit step, linear-solver "
            "sweeps included): %(bytes)s bytes of memory traffic and %(flop)s FLOP in FP64; mixed precision "
            "moves %(fewer_pct)s %% fewer bytes and runs at the FP32 rate. An order of magnitude: time 100 "
            "iterations of your case to calibrate."
        )
        % {
            "bytes": f"{CFD_BYTES_PER_CELL:,}",
            "flop": f"{CFD_FLOP_PER_CELL:,}",
            "fewer_pct": pct(1 - CFD_MIXED_BYTES),
        },
        _(
            "Roofline: time = max(bytes ÷ %(bandwidth_pct)s %% of memory bandwidth, FLOP ÷ %(flop_pct)s %% "
            "of peak)."
        )
        % {"bandwidth_pct": pct(CFD_BANDWIDTH_EFFICIENCY), "flop_pct": pct(CFD_FLOP_EFFICIENCY)},
        _(
            "Memory: %(fp64_gb)s GB per million cells in FP64, %(mixed_gb)s GB mixed (mesh, fields, matrix, "
            "multigrid); %(usable_pct)s %% of each GPU's memory usable."
        )
        % {
            "fp64_gb": f"{CFD_GB_PER_MCELL['fp64']:g}",
            "mixed_gb": f"{CFD_GB_PER_MCELL['mixed']:g}",
            "usable_pct": pct(USABLE_MEMORY),
        },
        _(
            "Decomposition: at least %(min_mcells)s M cells per GPU; %(efficiency_pct)s %% parallel "
            "efficiency on more than one GPU. Target %(target_days)s day(s); nodes of %(gpus_per_node)s "
            "GPUs; at most %(max_gpus)s GPUs."
        )
        % {
            "min_mcells": f"{CFD_MIN_MCELLS_PER_GPU:g}",
            "efficiency_pct": pct(CFD_PARALLEL_EFFICIENCY),
            "target_days": f"{job.target_days:g}",
            "gpus_per_node": job.gpus_per_node,
            "max_gpus": job.max_gpus,
        },
    ]

    def size(gpu: GpuFigures) -> Option | str:
        peak = gpu.fp64_tflops if fp64 else gpu.fp32_tflops
        label = "FP64" if fp64 else "FP32"
        if not peak:
            return _("%(name)s has no %(label)s units") % {"name": gpu.name, "label": label}
        lines = [
            _("Memory: %(cells_m)s M cells × %(gb_per_mcell)s GB = %(need_gb)s GB")
            % {
                "cells_m": f"{job.cells_m:g}",
                "gb_per_mcell": f"{CFD_GB_PER_MCELL[job.precision]:g}",
                "need_gb": num(need_gb),
            }
        ]
        mem = memory_gpus(need_gb, gpu, lines)
        if mem > job.max_gpus:
            return too_big(gpu, mem, need_gb, job.max_gpus)
        t_bytes = per_cell_bytes / (CFD_BANDWIDTH_EFFICIENCY * gpu.memory_bandwidth_gbs * 1e9)
        t_flop = CFD_FLOP_PER_CELL / (CFD_FLOP_EFFICIENCY * peak * 1e12)
        per_cell = max(t_bytes, t_flop)
        bound = _("bandwidth-bound") if t_bytes >= t_flop else _("compute-bound")
        lines.append(
            _(
                "Per cell-iteration: %(bytes)s bytes ÷ %(bandwidth_pct)s %% of %(bandwidth)s GB/s = "
                "%(t_bytes)s ns; %(flop)s FLOP ÷ %(flop_pct)s %% of %(peak)s TFLOP/s %(label)s = "
                "%(t_flop)s ns → %(bound)s, %(per_cell)s ns"
            )
            % {
                "bytes": f"{per_cell_bytes:,.0f}",
                "bandwidth_pct": pct(CFD_BANDWIDTH_EFFICIENCY),
                "bandwidth": gpu.memory_bandwidth_gbs,
                "t_bytes": f"{t_bytes * 1e9:.3g}",
                "flop": f"{CFD_FLOP_PER_CELL:,}",
                "flop_pct": pct(CFD_FLOP_EFFICIENCY),
                "peak": num(peak),
                "label": label,
                "t_flop": f"{t_flop * 1e9:.3g}",
                "bound": bound,
                "per_cell": f"{per_cell * 1e9:.3g}",
            }
        )
        one_gpu_h = cell_iterations * per_cell / 3600
        lines.append(
            _(
                "%(cells_m)se6 cells × %(iterations)s iterations × %(per_cell)s ns = %(hours)s hours on "
                "one GPU"
            )
            % {
                "cells_m": f"{job.cells_m:g}",
                "iterations": f"{job.iterations:,}",
                "per_cell": f"{per_cell * 1e9:.3g}",
                "hours": num(one_gpu_h),
            }
        )
        time_gpus = (
            1 if one_gpu_h <= target_h else math.ceil(one_gpu_h / (CFD_PARALLEL_EFFICIENCY * target_h))
        )
        if mem == 1 and time_gpus == 1:
            need = in_time(one_gpu_h, target_h, lines)
            fit = fraction_for(gpu, need_gb=need_gb, compute_need=need, lines=lines)
            if not fit.whole:
                gpu_hours = fraction_hours(fit, one_gpu_h, lines)
                return option(gpu, gpus=1, nodes=1, gpu_hours=gpu_hours, lines=lines, fit=fit)
        count = min(max(mem, min(time_gpus, useful)), job.max_gpus)
        if time_gpus > 1:
            lines.append(
                ngettext(
                    "Target %(target_h)s h: ⌈%(hours)s / (%(efficiency_pct)s %% × %(target_h)s)⌉ = "
                    "%(time_gpus)s GPU; useful up to %(useful)s (%(min_mcells)s M cells each) → %(count)s",
                    "Target %(target_h)s h: ⌈%(hours)s / (%(efficiency_pct)s %% × %(target_h)s)⌉ = "
                    "%(time_gpus)s GPUs; useful up to %(useful)s (%(min_mcells)s M cells each) → %(count)s",
                    time_gpus,
                )
                % {
                    "target_h": num(target_h),
                    "hours": num(one_gpu_h),
                    "efficiency_pct": pct(CFD_PARALLEL_EFFICIENCY),
                    "time_gpus": time_gpus,
                    "useful": useful,
                    "min_mcells": f"{CFD_MIN_MCELLS_PER_GPU:g}",
                    "count": count,
                }
            )
        gpu_hours = one_gpu_h / (CFD_PARALLEL_EFFICIENCY if count > 1 else 1)
        wall_h = gpu_hours / count
        if wall_h > target_h * 1.0001:
            total = _(
                "%(count)s GPU(s): %(gpu_hours)s GPU-hours, wall time ≈ %(wall_h)s h, beyond the "
                "%(target_days)s-day target"
            )
        else:
            total = _("%(count)s GPU(s): %(gpu_hours)s GPU-hours, wall time ≈ %(wall_h)s h")
        lines.append(
            total
            % {
                "count": count,
                "gpu_hours": num(gpu_hours),
                "wall_h": num(wall_h),
                "target_days": f"{job.target_days:g}",
            }
        )
        nodes = nodes_for(count, job.gpus_per_node)
        return option(gpu, gpus=count, nodes=nodes, gpu_hours=gpu_hours, lines=lines)

    return advice_from(gpus, size, assumptions)
