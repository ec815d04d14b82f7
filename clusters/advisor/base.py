"""What the sizing advisors (clusters/advisor/) share: the GPU figures they read, the advice
they answer, the memory sizing every advisor starts from, and the text of a model left out.

Text is built with gettext at call time, in the active language; figures go in formatted, as
named placeholders.
"""

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from django.utils.translation import gettext as _
from django.utils.translation import ngettext, pgettext

GPUS_PER_NODE = 8
MAX_GPUS = 256
# CUDA/ROCm context, allocator fragmentation and communication buffers take the rest.
USABLE_MEMORY = 0.9
# NVLink-class links; below this, sharded training waits on gradient and parameter traffic.
FAST_LINK_GBS = 300


class GpuFigures(Protocol):
    slug: str
    name: str
    memory_gb: int
    fp64_tflops: float
    fp32_tflops: float
    fp16_tflops: float
    memory_bandwidth_gbs: int
    interconnect_gbs: int


@dataclass(frozen=True)
class Option:
    gpu_model: str
    gpus: int
    nodes: int
    gpu_hours: float
    arithmetic: list[str]


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
    the model out, named at the end of the assumptions."""
    options, left_out = [], []
    for gpu in gpus:
        sized = size(gpu)
        if isinstance(sized, str):
            left_out.append(sized)
        else:
            options.append(sized)
    if left_out:
        reasons = pgettext("list separator", "; ").join(left_out)
        assumptions.append(_("Left out (cannot run this job): %(reasons)s.") % {"reasons": reasons})
    return Advice(assumptions=assumptions, options=options)
