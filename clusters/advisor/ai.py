"""The AI training advisor: GPUs to hold a model's training states (sharded, ZeRO-3/FSDP) and
to finish its tokens within the target days, at a model-FLOPs utilisation of the dense peak. A
job that one GPU holds and finishes in time gets the fraction of it that still does."""

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
    fraction_for,
    fraction_hours,
    in_time,
    memory_gpus,
    no_rate,
    nodes_for,
    num,
    option,
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
        if mem == 1 and time_gpus == 1:
            need = in_time(hours, target_h, lines)
            fit = fraction_for(gpu, need_gb=need_gb, compute_need=need, lines=lines)
            if not fit.whole:
                gpu_hours = fraction_hours(fit, hours, lines)
                return option(gpu, gpus=1, nodes=1, gpu_hours=gpu_hours, lines=lines, fit=fit)
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
        nodes = nodes_for(count, job.gpus_per_node)
        return option(gpu, gpus=count, nodes=nodes, gpu_hours=hours, lines=lines)

    return advice_from(gpus, size, assumptions)
