"""Job templates per scenario, rendered to a bash batch script per backend (docs/architecture.md, Domain).

Each template publishes a JSON Schema (draft 2020-12) of its parameters at
GET /api/v1/templates/; render_template validates against it before rendering, and every
value that reaches the script is shell-quoted as well. The script goes into JobSpec.script;
the backend exports the job's env (the scenario's NCCL_*/OMP_* settings among it) after the
shebang.

Contract with the backends for several nodes:
- slurm: the script is the batch step on the allocation's first node; it starts the ranks
  with srun and reads SLURM_JOB_NODELIST, SLURM_JOB_ID and SLURM_CPUS_ON_NODE.
- kubernetes (torchrun only): an Indexed Job of `nodes` pods with completions = parallelism
  = nodes, each running the script once. The backend sets PORTAL_RDZV_HOST to the DNS name
  of the pod with index 0 (Job `subdomain` + a headless Service); Kubernetes sets
  JOB_COMPLETION_INDEX. MPI templates run on one pod only.
- local: one machine; one node only.

The accelerator's vendor (GpuModel.vendor) picks what differs between devices: torch.distributed's
backend and the collective library's variables (ai.py), and whether a tool has a build for the
devices at all (md.py's GROMACS and LAMMPS have none for Huawei Ascend or Cambricon). The local
cluster pins a job to its devices with the vendor's own variables (clusters.shares.VISIBLE_DEVICES);
on Slurm the site's GRES plugin or prolog sets them, on Kubernetes the vendor's device plugin.
"""

from __future__ import annotations

from typing import Any

from .ai import HOROVOD, PYTHON, TORCHRUN
from .base import BACKEND_KINDS, VENDORS, JobTemplate, TemplateInvalid
from .cfd import OPENFOAM
from .md import GROMACS, LAMMPS

__all__ = [
    "BACKEND_KINDS",
    "TEMPLATES",
    "VENDORS",
    "JobTemplate",
    "TemplateInvalid",
    "render_template",
    "templates_for",
]

TEMPLATES: dict[str, JobTemplate] = {
    template.slug: template for template in (PYTHON, TORCHRUN, HOROVOD, GROMACS, LAMMPS, OPENFOAM)
}


def templates_for(scenario: str) -> list[JobTemplate]:
    """The scenario's templates, in the order a form should offer them."""
    return [template for template in TEMPLATES.values() if template.scenario == scenario]


def render_template(
    slug: str, params: Any, *, nodes: int, gpus_per_node: int, backend_kind: str, vendor: str = "nvidia"
) -> str:
    """The batch script of template `slug` for `vendor`'s devices; raises TemplateInvalid (keys
    `template`, `nodes`, `gpus_per_node`, `gpu_model`, `parameters.<name>`) on anything it cannot
    render."""
    template = TEMPLATES.get(slug)
    if template is None:
        raise TemplateInvalid(
            {"template": [f"No template {str(slug)[:64]!r}. Templates: {', '.join(TEMPLATES)}."]}
        )
    return template.render(
        params=params, nodes=nodes, gpus_per_node=gpus_per_node, backend_kind=backend_kind, vendor=vendor
    )
