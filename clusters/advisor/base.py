"""What the sizing advisors (clusters/advisor/) share: the GPU figures they read, the advice
they answer, the memory sizing every advisor starts from, the fraction of one device a job that
fits in one gets (a MIG instance or a slice, clusters/shares.py), and the text of a model left out.

Text is built with gettext at call time, in the active language; figures go in formatted, as
named placeholders.
"""

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Protocol

from django.utils.translation import gettext as _
from django.utils.translation import ngettext, pgettext

from clusters import shares
from clusters.shares import ShareKind

GPUS_PER_NODE = 8
MAX_GPUS = 256
# CUDA/ROCm context, allocator fragmentation and communication buffers take the rest.
USABLE_MEMORY = 0.9
# NVLink-class links; below this, sharded training waits on gradient and parameter traffic.
FAST_LINK_GBS = 300
# A slice's memory cap is given in whole GiB: finer caps buy nothing a researcher would notice,
# and a GiB is a whole number of every vendor's memory unit (HAMi counts Cambricon's in 256 MiB).
SLICE_CAP_STEP_MIB = 1024
# Float slack when a share's compute is held against what the job needs (27 % of 27 %).
SLACK = 1e-9


class GpuFigures(Protocol):
    slug: str
    name: str
    memory_gb: int
    fp64_tflops: float
    fp32_tflops: float
    fp16_tflops: float
    memory_bandwidth_gbs: int
    interconnect_gbs: int
    cost_index: int
    share_kinds: list[str]
    mig_profiles: list[dict]


@dataclass(frozen=True)
class Fit:
    """The part of one device an option takes: the whole device, a MIG instance or a slice;
    `fraction` is what it counts of the device in GPU-hours (clusters/shares.py), `compute` its
    share of the device's throughput (g/7 of a MIG instance, the percentage of a slice)."""

    kind: str = ShareKind.WHOLE.value
    mig_profile: str = ""
    memory_mib: int = 0
    cores_pct: int = 0
    fraction: Decimal = shares.ONE
    compute: float = 1.0

    @property
    def whole(self) -> bool:
        return self.kind == ShareKind.WHOLE


WHOLE = Fit()


@dataclass(frozen=True)
class Option:
    """One GPU model's answer: `gpus` units of the share (devices, or one MIG instance or slice),
    `gpu_hours` device-equivalent (units × device_fraction × hours), and the fields a job asks
    for that share by (jobs' `share`, `mig_profile`, `gpu_memory_mib`, `gpu_cores_pct`)."""

    gpu_model: str
    gpus: int
    nodes: int
    gpu_hours: float
    arithmetic: list[str]
    share: str = ShareKind.WHOLE.value
    mig_profile: str = ""
    gpu_memory_mib: int = 0
    gpu_cores_pct: int = 0
    device_fraction: Decimal = shares.ONE


def option(
    gpu: GpuFigures, *, gpus: int, nodes: int, gpu_hours: float, lines: list[str], fit: Fit = WHOLE
) -> Option:
    """The option of `gpu`: `gpus` units of `fit`, GPU-hours rounded as the answer shows them."""
    return Option(
        gpu.slug,
        gpus,
        nodes,
        round(gpu_hours, 2),
        lines,
        share=fit.kind,
        mig_profile=fit.mig_profile,
        gpu_memory_mib=fit.memory_mib,
        gpu_cores_pct=fit.cores_pct,
        device_fraction=fit.fraction,
    )


@dataclass(frozen=True)
class Advice:
    assumptions: list[str]
    options: list[Option]


def num(x: float) -> str:
    """A figure as a reader wants it: thousands separated, three significant digits below 100."""
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def pct(fraction: float) -> str:
    """A fraction as the whole percent the text states: 0.9 → "90"."""
    return f"{fraction * 100:.0f}"


def decimal(value: Decimal) -> str:
    """A device fraction as the ledger keeps it, without trailing zeros: 0.5000 → "0.5"."""
    return f"{value.normalize():f}"


def nodes_for(gpus: int, per_node: int) -> int:
    return math.ceil(gpus / per_node)


def memory_gpus(need_gb: float, gpu: GpuFigures, lines: list[str]) -> int:
    """GPUs of the model that hold `need_gb`, the step appended to `lines`."""
    usable = gpu.memory_gb * USABLE_MEMORY
    count = max(1, math.ceil(need_gb / usable))
    lines.append(
        _(
            "Usable memory per GPU: %(usable_pct)s %% of %(memory_gb)s GB = %(usable_gb)s GB → "
            "⌈%(need_gb)s / %(usable_gb)s⌉ = %(count)s GPU(s) to hold the job"
        )
        % {
            "usable_pct": pct(USABLE_MEMORY),
            "memory_gb": gpu.memory_gb,
            "usable_gb": num(usable),
            "need_gb": num(need_gb),
            "count": count,
        }
    )
    return count


def _mig_fit(gpu: GpuFigures, need_gb: float, compute_need: float, lines: list[str]) -> Fit | None:
    """The smallest MIG profile of the model (by what it counts of the device, then more compute)
    that holds `need_gb` and gives `compute_need` of the device's compute; None if only 7g does."""
    fitting = [
        p
        for p in shares.mig_profiles(gpu.mig_profiles)
        if p.fraction < 1
        and p.memory_gb * USABLE_MEMORY >= need_gb
        and p.compute_slices >= compute_need * 7 - SLACK
    ]
    if not fitting:
        return None
    best = min(fitting, key=lambda p: (p.fraction, -p.compute_slices, p.name))
    lines.append(
        _(
            "MIG %(profile)s, the smallest profile that fits: %(compute_slices)s/7 of the compute ≥ "
            "%(need_pct)s %%, %(usable_pct)s %% of %(memory_gb)s GB = %(usable_gb)s GB ≥ %(need_gb)s GB; "
            "it counts max(%(compute_slices)s/7, %(memory_slices)s/8) = %(fraction)s of the device"
        )
        % {
            "profile": best.name,
            "compute_slices": best.compute_slices,
            "need_pct": num(compute_need * 100),
            "usable_pct": pct(USABLE_MEMORY),
            "memory_gb": best.memory_gb,
            "usable_gb": num(best.memory_gb * USABLE_MEMORY),
            "need_gb": num(need_gb),
            "memory_slices": best.memory_slices,
            "fraction": decimal(best.fraction),
        }
    )
    return Fit(
        kind=ShareKind.MIG.value,
        mig_profile=best.name,
        fraction=best.fraction,
        compute=best.compute_slices / 7,
    )


def _slice_fit(gpu: GpuFigures, need_gb: float, compute_need: float, lines: list[str]) -> Fit | None:
    """A slice that holds `need_gb` (the cap: need ÷ usable share, in whole GiB) with at least
    `compute_need` of the compute; None if it would be the whole device."""
    device_mib = shares.device_memory_mib(gpu.memory_gb)
    cap_gib = max(1, math.ceil(need_gb / USABLE_MEMORY - SLACK))
    memory_mib = cap_gib * SLICE_CAP_STEP_MIB
    # The slice counts the larger of its memory and compute parts: compute up to the memory
    # part costs nothing more and runs the job faster.
    cores_pct = max(1, math.ceil(compute_need * 100 - SLACK), math.floor(memory_mib * 100 / device_mib))
    if memory_mib >= device_mib or cores_pct >= 100:
        return None
    fraction = shares.slice_fraction(memory_mib=memory_mib, cores_pct=cores_pct, memory_gb=gpu.memory_gb)
    if fraction >= 1:
        return None
    lines.append(
        _(
            "Slice: a memory cap of ⌈%(need_gb)s / %(usable_pct)s %%⌉ = %(cap_gib)s GiB = %(memory_mib)s "
            "MiB and %(cores_pct)s %% of the compute (at least the %(need_pct)s %% needed and the cap's "
            "share, which the slice counts anyway); it counts max(%(memory_mib)s / %(device_mib)s MiB, "
            "%(cores_pct)s %%) = %(fraction)s of the device"
        )
        % {
            "need_gb": num(need_gb),
            "usable_pct": pct(USABLE_MEMORY),
            "cap_gib": cap_gib,
            "memory_mib": f"{memory_mib:,}",
            "cores_pct": cores_pct,
            "need_pct": num(compute_need * 100),
            "device_mib": f"{device_mib:,}",
            "fraction": decimal(fraction),
        }
    )
    return Fit(
        kind=ShareKind.SLICE.value,
        memory_mib=memory_mib,
        cores_pct=cores_pct,
        fraction=fraction,
        compute=cores_pct / 100,
    )


def fraction_for(gpu: GpuFigures, *, need_gb: float, compute_need: float, lines: list[str]) -> Fit:
    """The smallest part of one device of the model that holds `need_gb` and gives `compute_need`
    (0–1) of its throughput: a MIG instance where the model has MIG, else (or where no profile
    short of the whole device fits) a slice where it offers slices; else the whole device. The
    step is appended to `lines`. Only for a job that one whole device holds and runs in time."""
    kinds = set(gpu.share_kinds)
    if ShareKind.MIG.value in kinds and (fit := _mig_fit(gpu, need_gb, compute_need, lines)):
        return fit
    if ShareKind.SLICE.value in kinds and (fit := _slice_fit(gpu, need_gb, compute_need, lines)):
        return fit
    if kinds & {ShareKind.MIG.value, ShareKind.SLICE.value}:
        lines.append(
            _(
                "No MIG profile or slice smaller than the whole GPU holds %(need_gb)s GB at %(need_pct)s "
                "%% of its compute: one whole GPU"
            )
            % {"need_gb": num(need_gb), "need_pct": num(compute_need * 100)}
        )
    else:
        lines.append(_("%(name)s offers no MIG instances or slices: one whole GPU") % {"name": gpu.name})
    return WHOLE


def in_time(hours: float, target_h: float, lines: list[str]) -> float:
    """The share of one GPU's compute that finishes `hours` of it within `target_h`, the step
    appended to `lines`."""
    need = hours / target_h
    lines.append(
        _(
            "One GPU holds the job and finishes it in time: %(hours)s ÷ %(target_h)s h = %(need_pct)s %% "
            "of its compute is enough"
        )
        % {"hours": num(hours), "target_h": num(target_h), "need_pct": num(need * 100)}
    )
    return need


def fraction_hours(fit: Fit, hours: float, lines: list[str]) -> float:
    """Device-equivalent GPU-hours of `hours` of one whole GPU's work run on `fit`, which runs at
    its compute share of the device's speed; the step appended to `lines`."""
    wall_h = hours / fit.compute
    gpu_hours = float(fit.fraction) * wall_h
    lines.append(
        _(
            "At %(compute)s of the GPU's speed: wall time ≈ %(hours)s ÷ %(compute)s = %(wall_h)s h "
            "(%(wall_days)s days); %(fraction)s of a GPU × %(wall_h)s h = %(gpu_hours)s GPU-hours "
            "(device-equivalent)"
        )
        % {
            "compute": f"{fit.compute:.3g}",
            "hours": num(hours),
            "wall_h": num(wall_h),
            "wall_days": num(wall_h / 24),
            "fraction": decimal(fit.fraction),
            "gpu_hours": num(gpu_hours),
        }
    )
    return gpu_hours


def too_big(gpu: GpuFigures, count: int, need_gb: float, max_gpus: int) -> str:
    """Why the model is left out: holding the job takes more than `max_gpus` of it."""
    # count > max_gpus >= 1: the singular is there for languages that need it, not for English.
    return ngettext(
        "%(name)s needs %(count)s GPU of %(memory_gb)s GB for %(need_gb)s GB, over max_gpus=%(max_gpus)s",
        "%(name)s needs %(count)s GPUs of %(memory_gb)s GB for %(need_gb)s GB, over max_gpus=%(max_gpus)s",
        count,
    ) % {
        "name": gpu.name,
        "count": count,
        "memory_gb": gpu.memory_gb,
        "need_gb": num(need_gb),
        "max_gpus": max_gpus,
    }


def no_rate(gpu: GpuFigures, label: str) -> str:
    """Why the model is left out: no figure for the precision the job computes in."""
    return _("%(name)s has no %(label)s rate on record") % {"name": gpu.name, "label": label}


def advice_from(
    gpus: Sequence[GpuFigures], size: Callable[[GpuFigures], Option | str], assumptions: list[str]
) -> Advice:
    """Advice from `size` over `gpus` in their order; a string from `size` is a reason to leave
    the model out, named at the end of the assumptions, after how fractions are counted where
    an option is one."""
    options, left_out = [], []
    for gpu in gpus:
        sized = size(gpu)
        if isinstance(sized, str):
            left_out.append(sized)
        else:
            options.append(sized)
    if any(o.share != ShareKind.WHOLE for o in options):
        assumptions.append(
            _(
                "Fractions: a job that one GPU holds and that needs only part of its speed gets the "
                "smallest MIG instance that fits, else a slice (a memory cap and a compute percentage). "
                "A fraction's throughput is assumed to scale with its compute share (g/7 of a MIG "
                "instance, the percentage of a slice); its GPU-hours are device-equivalent: units × its "
                "fraction of the device × hours."
            )
        )
    if left_out:
        reasons = pgettext("list separator", "; ").join(left_out)
        assumptions.append(_("Left out (cannot run this job): %(reasons)s.") % {"reasons": reasons})
    return Advice(assumptions=assumptions, options=options)
