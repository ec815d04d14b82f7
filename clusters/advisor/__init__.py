"""Sizing advisor: from what a researcher knows about a job to GPUs, nodes and GPU-hours per
GPU model, in the scenario's rank order (MD's by cost, as its scenario ranks). A job that one GPU
holds and runs in time gets a fraction of it instead (the model's smallest MIG profile that fits,
else a slice), its GPU-hours device-equivalent (units × fraction × hours).

Pure functions on plain data: no request, no database. The estimates are rough on purpose; what
matters is the order of magnitude and arithmetic a researcher can check, so every option carries
its steps as text and every answer states its assumptions. A model that cannot hold the job in
memory even at `max_gpus` (or has no units for the asked precision) is left out of the options
and named, with the reason, in the assumptions.

The text is built in the active language (gettext, not lazy: an Advice is made per request and
read once). Figures are formatted here, then passed as named placeholders, so a translation can
reorder them but never reformats a number. One module per advisor (ai.py, md.py, cfd.py); what
the three share is in base.py.
"""

from collections.abc import Sequence

from clusters.advisor.ai import DEFAULT_TOKENS_B, AiJob, advise_ai
from clusters.advisor.base import GPUS_PER_NODE, MAX_GPUS, Advice, GpuFigures, Option
from clusters.advisor.cfd import CfdJob, advise_cfd
from clusters.advisor.md import MdJob, advise_md

__all__ = [
    "ADVISORS",
    "DEFAULT_TOKENS_B",
    "GPUS_PER_NODE",
    "MAX_GPUS",
    "Advice",
    "AiJob",
    "CfdJob",
    "GpuFigures",
    "MdJob",
    "Option",
    "advise",
    "advise_ai",
    "advise_cfd",
    "advise_md",
]

ADVISORS = {"ai": advise_ai, "md": advise_md, "cfd": advise_cfd}


def advise(*, advisor: str, job: AiJob | MdJob | CfdJob, gpus: Sequence[GpuFigures]) -> Advice:
    """Advice from the named advisor (Scenario.advisor) over `gpus`, given in rank order."""
    return ADVISORS[advisor](job, gpus)
