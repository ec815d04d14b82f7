"""Sizing advisor: from what a researcher knows about a job to GPUs, nodes and GPU-hours per
GPU model, in the scenario's rank order.

Pure functions on plain data: no request, no database. The estimates are rough on purpose; what
matters is the order of magnitude and arithmetic a researcher can check, so every option carries
its steps as text and every answer states its assumptions. A model that cannot hold the job in
memory even at `max_gpus` (or has no units for the asked precision) is left out of the options
and named, with the reason, in the assumptions.

The text is built in the active language (gettext, not lazy: an Advice is made per request and
read once). Figures are formatted here, then passed as named placeholders, so a translation can
reorder them but never reformats a number. What the three advisors share is in base.py.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass

from django.utils.translation import gettext as _
from django.utils.translation import ngettext

from clusters.advisor.base import (
    FAST_LINK_GBS,
    GPUS_PER_NODE,
    MAX_GPUS,
    USABLE_MEMORY,
    Advice,
    GpuFigures,
    Option,
    advice_from,
    memory_gpus,
    no_rate,
    nodes_for,
    num,
    pct,
    too_big,
)


@dataclass(frozen=True)
class AiJob:
    params_b: float
    precision: str = "bf16"
    method: str = "full"
    tokens_b: float | None = None
    target_days: float = 7.0
    gpus_per_node: int = GPUS_PER_NODE
    max_gpus: int = MAX_GPUS


@dataclass(frozen=True)
class MdJob:
    atoms: int
    ns_per_day: float
    simulated_ns: float | None = None
    days: float | None = None
    timestep_fs: float = 2.0
    gpus_per_node: int = GPUS_PER_NODE
    max_gpus: int = MAX_GPUS


@dataclass(frozen=True)
class CfdJob:
    cells_m: float
    iterations: int
    precision: str = "fp64"
    target_days: float = 1.0
    gpus_per_node: int = GPUS_PER_NODE
    max_gpus: int = MAX_GPUS


# --- AI training -------------------------------------------------------------------------------

DEFAULT_TOKENS_B = 1.0
ACTIVATION_OVERHEAD = 0.2
MFU_FAST = 0.40
MFU_PCIE = 0.25
LORA_TRAINABLE = 0.01
# Bytes per parameter of a full fine-tune with Adam: (weights, gradients, optimizer). Mixed
# precision keeps an FP32 master copy and two FP32 moments: 4 + 4 + 4 = 12 optimizer bytes.
FULL_BYTES = {"bf16": (2, 2, 12), "fp16": (2, 2, 12), "fp8": (2, 2, 12), "fp32": (4, 4, 8)}
WEIGHT_BYTES = {"bf16": 2, "fp16": 2, "fp8": 1, "fp32": 4}


def _ai_state_gb(job: AiJob, params: float) -> tuple[float, str]:
    if job.method == "lora":
        base = WEIGHT_BYTES[job.precision] * params / 1e9
        adapters = 16 * LORA_TRAINABLE * params / 1e9
        return base + adapters, _(
            "LoRA: frozen weights %(bytes)s bytes/parameter × %(params_b)se9 = %(base_gb)s GB; adapters "
            "%(adapter_pct)s %% of the parameters × 16 bytes (mixed-precision Adam) = %(adapters_gb)s GB; "
            "states %(state_gb)s GB"
        ) % {
            "bytes": WEIGHT_BYTES[job.precision],
            "params_b": f"{job.params_b:g}",
            "base_gb": num(base),
            "adapter_pct": f"{LORA_TRAINABLE * 100:g}",
            "adapters_gb": num(adapters),
            "state_gb": num(base + adapters),
        }
    weights, grads, optimizer = FULL_BYTES[job.precision]
    per_param = weights + grads + optimizer
    kind = "FP32 Adam" if job.precision == "fp32" else _("mixed-precision Adam")
    state = per_param * params / 1e9
    return state, _(
        "%(per_param)s bytes/parameter for %(kind)s (%(weights)s weights + %(grads)s grads + "
        "%(optimizer)s optimizer) × %(params_b)se9 = %(state_gb)s GB"
    ) % {
        "per_param": per_param,
        "kind": kind,
        "weights": weights,
        "grads": grads,
        "optimizer": optimizer,
        "params_b": f"{job.params_b:g}",
        "state_gb": num(state),
    }


def advise_ai(job: AiJob, gpus: Sequence[GpuFigures]) -> Advice:
    """GPUs to hold a model's training states and finish its tokens within the target days."""
    params = job.params_b * 1e9
    tokens_b = job.tokens_b if job.tokens_b is not None else DEFAULT_TOKENS_B
    flops_per_token = 6 if job.method == "full" else 4
    flops = flops_per_token * params * tokens_b * 1e9
    state_gb, state_line = _ai_state_gb(job, params)
    need_gb = state_gb * (1 + ACTIVATION_OVERHEAD)
    target_h = job.target_days * 24
    fp32 = job.precision == "fp32"
    if job.tokens_b is None:
        tokens = _(
            "Training tokens: %(tokens_b)se9 (none given: a typical fine-tuning run; pre-training from "
            "scratch wants ≈ 20 tokens per parameter)."
        )
    else:
        tokens = _("Training tokens: %(tokens_b)se9.")
    assumptions = [
        tokens % {"tokens_b": f"{tokens_b:g}"},
        _(
            "Memory: model and optimizer states sharded over all GPUs (ZeRO-3/FSDP), plus %(overhead_pct)s "
            "%% for activations (with checkpointing) and buffers; %(usable_pct)s %% of each GPU's memory "
            "usable."
        )
        % {"overhead_pct": pct(ACTIVATION_OVERHEAD), "usable_pct": pct(USABLE_MEMORY)},
        _(
            "Compute: 6·N·T FLOP for full training (forward 2, backward 4), 4·N·T for LoRA (no weight "
            "gradients for the frozen base); attention FLOPs not counted."
        ),
        _(
            "Throughput: %(mfu_fast)s %% model-FLOPs utilisation (MFU) of the dense peak; %(mfu_pcie)s %% "
            "when more than one GPU shares PCIe-class links (< %(fast_link_gbs)s GB/s). GPU-hours do not "
            "grow with the GPU count (the MFU already pays for communication)."
        )
        % {"mfu_fast": pct(MFU_FAST), "mfu_pcie": pct(MFU_PCIE), "fast_link_gbs": FAST_LINK_GBS},
        # Two counts in one sentence, so no ngettext: English keeps its "GPUs" and "day(s)".
        _(
            "Nodes of %(gpus_per_node)s GPUs; a multi-node job takes whole nodes; at most %(max_gpus)s GPUs; "
            "target %(target_days)s day(s)."
        )
        % {
            "gpus_per_node": job.gpus_per_node,
            "max_gpus": job.max_gpus,
            "target_days": f"{job.target_days:g}",
        },
    ]
    if job.precision == "fp8":
        assumptions.append(
            _(
                "FP8: states as in BF16 mixed precision (master weights and Adam stay FP32); throughput "
                "counted at the BF16 peak, since the FP8 speed-up depends on kernels and model."
            )
        )
    if job.method == "lora":
        assumptions.append(
            _("LoRA: adapters ≈ %(adapter_pct)s %% of the parameters (rank 16 on every linear layer).")
            % {"adapter_pct": f"{LORA_TRAINABLE * 100:g}"}
        )

    def size(gpu: GpuFigures) -> Option | str:
        peak = gpu.fp32_tflops if fp32 else gpu.fp16_tflops
        if not peak:
            return no_rate(gpu, "FP32" if fp32 else "FP16/BF16")
        lines = [
            state_line,
            _("+ %(overhead_pct)s %% for activations and buffers = %(need_gb)s GB")
            % {"overhead_pct": pct(ACTIVATION_OVERHEAD), "need_gb": num(need_gb)},
        ]
        mem = memory_gpus(need_gb, gpu, lines)
        if mem > job.max_gpus:
            return too_big(gpu, mem, need_gb, job.max_gpus)
        lines.append(
            _("Compute: %(per_token)s × %(params_b)se9 parameters × %(tokens_b)se9 tokens = %(flops)s FLOP")
            % {
                "per_token": flops_per_token,
                "params_b": f"{job.params_b:g}",
                "tokens_b": f"{tokens_b:g}",
                "flops": f"{flops:.2e}",
            }
        )
        mfu = MFU_FAST
        hours = flops / (peak * 1e12 * mfu) / 3600
        count = max(mem, math.ceil(hours / target_h))
        if count > 1 and gpu.interconnect_gbs < FAST_LINK_GBS:
            mfu = MFU_PCIE
            hours = flops / (peak * 1e12 * mfu) / 3600
        label = "FP32" if fp32 else "FP16/BF16"
        lines.append(
            _(
                "At %(mfu)s %% MFU of %(peak)s TFLOP/s dense %(label)s = %(rate)s TFLOP/s per GPU: "
                "%(flops)s / %(rate_e12)se12 / 3600 = %(hours)s GPU-hours"
            )
            % {
                "mfu": pct(mfu),
                "peak": num(peak),
                "label": label,
                "rate": num(peak * mfu),
                "flops": f"{flops:.2e}",
                "rate_e12": f"{peak * mfu:.3g}",
                "hours": num(hours),
            }
        )
        time_gpus = math.ceil(hours / target_h)
        lines.append(
            _("Target %(target_days)s day(s) = %(target_h)s h: ⌈%(hours)s / %(target_h)s⌉ = %(count)s GPU(s)")
            % {
                "target_days": f"{job.target_days:g}",
                "target_h": num(target_h),
                "hours": num(hours),
                "count": time_gpus,
            }
        )
        count = max(mem, time_gpus)
        if count > job.gpus_per_node:
            whole = nodes_for(count, job.gpus_per_node) * job.gpus_per_node
            lines.append(
                ngettext(
                    "max(%(mem)s, %(time_gpus)s) = %(count)s, in whole nodes of %(per_node)s: %(whole)s GPU",
                    "max(%(mem)s, %(time_gpus)s) = %(count)s, in whole nodes of %(per_node)s: %(whole)s GPUs",
                    whole,
                )
                % {
                    "mem": mem,
                    "time_gpus": time_gpus,
                    "count": count,
                    "per_node": job.gpus_per_node,
                    "whole": whole,
                }
            )
            count = whole
        if count > job.max_gpus:
            lines.append(_("Capped at max_gpus = %(max_gpus)s") % {"max_gpus": job.max_gpus})
            count = job.max_gpus
        wall_h = hours / count
        if wall_h > target_h * 1.0001:
            wall = _(
                "Wall time ≈ %(hours)s / %(count)s = %(wall_h)s h (%(wall_days)s days, beyond the "
                "%(target_days)s-day target)"
            )
        else:
            wall = _("Wall time ≈ %(hours)s / %(count)s = %(wall_h)s h (%(wall_days)s days)")
        lines.append(
            wall
            % {
                "hours": num(hours),
                "count": count,
                "wall_h": num(wall_h),
                "wall_days": num(wall_h / 24),
                "target_days": f"{job.target_days:g}",
            }
        )
        return Option(gpu.slug, count, nodes_for(count, job.gpus_per_node), round(hours, 2), lines)

    return advice_from(gpus, size, assumptions)


# --- Molecular dynamics ------------------------------------------------------------------------

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
    ]

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
        wall_days = simulated_ns / rate
        gpu_hours = count * wall_days * 24
        lines.append(
            _(
                "%(simulated_ns)s ns ÷ %(rate)s ns/day = %(wall_days)s days × 24 h × %(count)s GPU(s) = "
                "%(gpu_hours)s GPU-hours"
            )
            % {
                "simulated_ns": num(simulated_ns),
                "rate": num(rate),
                "wall_days": num(wall_days),
                "count": count,
                "gpu_hours": num(gpu_hours),
            }
        )
        return Option(gpu.slug, count, nodes_for(count, job.gpus_per_node), round(gpu_hours, 2), lines)

    return advice_from(gpus, size, assumptions)


# --- CFD and FEA -------------------------------------------------------------------------------

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
        return Option(gpu.slug, count, nodes_for(count, job.gpus_per_node), round(gpu_hours, 2), lines)

    return advice_from(gpus, size, assumptions)


ADVISORS = {"ai": advise_ai, "md": advise_md, "cfd": advise_cfd}


def advise(*, advisor: str, job: AiJob | MdJob | CfdJob, gpus: Sequence[GpuFigures]) -> Advice:
    """Advice from the named advisor (Scenario.advisor) over `gpus`, given in rank order."""
    return ADVISORS[advisor](job, gpus)
