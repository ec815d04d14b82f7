"""ai-training: a plain Python script, torchrun (PyTorch elastic) and Horovod.

NCCL settings (NCCL_SOCKET_IFNAME, NCCL_IB_DISABLE, …) are the scenario's env, which the backend
exports before these lines; the templates do not repeat them.
"""

from __future__ import annotations

from typing import Any

from .base import ARGS, VENV, JobTemplate, Shape, header, mpi_launch, python_script, q, schema, venv_lines

SCENARIO = "ai-training"


def _program(values: dict[str, Any]) -> str:
    return " ".join(q(part) for part in [values["script"], *values["args"]])


def render_python(values: dict[str, Any], shape: Shape) -> list[str]:
    return [*header("python", shape), *venv_lines(values), f"exec python3 {_program(values)}"]


def render_torchrun(values: dict[str, Any], shape: Shape) -> list[str]:
    # Options in their underscore spelling: every torchrun accepts it, while the dashed aliases
    # (--nproc-per-node) came with PyTorch 2 and fail on 1.x (Debian bookworm's 1.13).
    lines = [*header("torchrun", shape), *venv_lines(values)]
    common = f"--nproc_per_node={shape.gpus_per_node} --max_restarts={int(values['max_restarts'])}"
    port = int(values["rdzv_port"])
    if not shape.multi:
        # --standalone runs the rendezvous store on a free local port: two single-node jobs
        # that share a machine (the local backend, a shared Slurm node) never collide on one.
        return [*lines, f"exec torchrun --standalone --nnodes=1 {common} {_program(values)}"]
    rdzv = f"--nnodes={shape.nodes} {common} --rdzv_backend=c10d"
    if shape.backend_kind == "slurm":
        return [
            *lines,
            # The rendezvous host is the allocation's first node: Slurm runs this batch script
            # there, and every node derives the same name from the node list without talking to
            # the others. The torchrun agent whose host name matches runs the c10d store.
            # (sed reads all of scontrol's output; `head -n 1` could exit first and, under
            # pipefail, fail the job through scontrol's SIGPIPE on a long node list.)
            'rdzv_host=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)',
            "",
            # One agent per node starts one worker per GPU. The step asks for every CPU of the
            # node: srun gives a step only the CPUs it asks for, and the workers are its children.
            f"srun --nodes={shape.nodes} --ntasks={shape.nodes} --ntasks-per-node=1 "
            '--cpus-per-task="$SLURM_CPUS_ON_NODE" \\',
            f'  torchrun {rdzv} --rdzv_id="$SLURM_JOB_ID" --rdzv_endpoint="$rdzv_host":{port} \\',
            f"  {_program(values)}",
        ]
    # kubernetes: an Indexed Job of `nodes` pods, each running this script once. The backend
    # sets PORTAL_RDZV_HOST to the stable DNS name of pod 0 (subdomain + headless Service);
    # Kubernetes sets JOB_COMPLETION_INDEX. Pod 0 hosts the store, said outright with is_host
    # because a pod's host name need not match the DNS name that the others dial.
    return [
        *lines,
        'if [[ "$JOB_COMPLETION_INDEX" == 0 ]]; then is_host=1; else is_host=0; fi',
        "",
        f'exec torchrun {rdzv} --rdzv_id="$PORTAL_RDZV_HOST" --rdzv_endpoint="$PORTAL_RDZV_HOST":{port} \\',
        f'  --rdzv_conf=is_host="$is_host" {_program(values)}',
    ]


def render_horovod(values: dict[str, Any], shape: Shape) -> list[str]:
    setup, launcher = mpi_launch(shape, ranks_per_node=shape.gpus_per_node)
    # One rank per GPU; Horovod picks its GPU by local rank.
    return [
        *header("horovod", shape),
        *venv_lines(values),
        *setup,
        f"exec {launcher} python3 {_program(values)}",
    ]


PYTHON = JobTemplate(
    slug="python",
    scenario=SCENARIO,
    name="Python script",
    description="Runs `python3 <script> <args>` once on one node with all of its GPUs visible: "
    "single-GPU training, fine-tuning with its own launcher, evaluation, data preparation.",
    parameters_schema=schema(
        {
            "script": python_script("The script to run, relative to the working directory."),
            "args": ARGS,
            "venv": VENV,
        },
        required=["script"],
    ),
    renderer=render_python,
)

TORCHRUN = JobTemplate(
    slug="torchrun",
    scenario=SCENARIO,
    name="PyTorch torchrun",
    description="PyTorch distributed training (DDP, FSDP, DeepSpeed) under torchrun: one worker per GPU. "
    "On several nodes (Slurm, or Kubernetes as an Indexed Job) the workers meet at a c10d rendezvous "
    "on the first node.",
    parameters_schema=schema(
        {
            "script": python_script("The training script; torchrun starts it once per GPU."),
            "args": ARGS,
            "venv": VENV,
            "rdzv_port": {
                "type": "integer",
                "title": "Rendezvous port",
                "minimum": 1024,
                "maximum": 65535,
                "default": 29500,
                "description": "TCP port of the rendezvous store on the first node (multi-node runs only).",
            },
            "max_restarts": {
                "type": "integer",
                "title": "Restarts",
                "minimum": 0,
                "maximum": 10,
                "default": 0,
                "description": "How often torchrun restarts all workers after one fails.",
            },
        },
        required=["script"],
    ),
    renderer=render_torchrun,
    multi_node_backends=frozenset({"slurm", "kubernetes"}),
)

HOROVOD = JobTemplate(
    slug="horovod",
    scenario=SCENARIO,
    name="Horovod",
    description="Horovod data-parallel training: one MPI rank per GPU, started by srun on Slurm and by "
    "Open MPI's mpirun on one node elsewhere.",
    parameters_schema=schema(
        {"script": python_script("The training script; one copy runs per GPU."), "args": ARGS, "venv": VENV},
        required=["script"],
    ),
    renderer=render_horovod,
    multi_node_backends=frozenset({"slurm"}),
)
