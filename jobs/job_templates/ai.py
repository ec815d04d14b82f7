"""ai-training: a plain Python script, torchrun (PyTorch elastic) and Horovod.

NCCL settings (NCCL_SOCKET_IFNAME, NCCL_IB_DISABLE, …) are the scenario's env, which the backend
exports before these lines; the templates do not repeat them. What torchrun's workers need beyond
them differs by the accelerator's vendor (collective_lines): the name of torch.distributed's
backend, exported as PORTAL_DIST_BACKEND for the training script's
`init_process_group(backend=os.environ["PORTAL_DIST_BACKEND"])`, and the collective library's own
variables. Every variable the template sets is a default (`${NAME:-value}`): the job's env, or the
scenario's, overrides it.

Checkpoints are the training program's own: the template hands it the contract's variables
(PORTAL_CHECKPOINT_DIR, PORTAL_CHECKPOINT_MINUTES, PORTAL_ATTEMPT) and, on a preemption warning,
a SIGTERM, on which the program saves, prints `PORTAL_CHECKPOINT <epoch>` and exits; it resumes
from the newest checkpoint in the directory and prints `PORTAL_RESUMED <epoch> <what>` (README,
"The checkpoint contract for job scripts", has an example). torchrun hands the SIGTERM on to
its workers and kills them 30 seconds later (torch.distributed.elastic's agent, _shutdown), so
a worker's save must fit in that time.
"""

from __future__ import annotations

from typing import Any

from .base import (
    ARGS,
    VENV,
    JobTemplate,
    Shape,
    checkpoint_lines,
    checkpoint_minutes,
    exit_lines,
    forward_lines,
    header,
    launch_lines,
    mpi_launch,
    preempt_lines,
    python_script,
    q,
    schema,
    venv_lines,
)

SCENARIO = "ai-training"


def _program(values: dict[str, Any]) -> str:
    return " ".join(q(part) for part in [values["script"], *values["args"]])


# torch.distributed's backend on each vendor's devices.
DIST_BACKENDS = {
    "nvidia": "nccl",
    # PyTorch's ROCm builds run the "nccl" backend on RCCL, AMD's drop-in NCCL, with no code change
    # (https://www.kubeflow.org/docs/components/trainer/user-guides/pytorch-rocm/). Hygon's DCU
    # toolkit (DTK) is built on ROCm and ships RCCL; Hygon's own documentation was not reachable
    # when this was written, so AMD's is followed for it.
    "amd": "nccl",
    "hygon": "nccl",
    # torch_npu's process group over HCCL: init_process_group(backend="hccl") (Ascend Extension for
    # PyTorch, https://www.hiascend.com/doc_center/source/zh/Pytorch/700/ptmoddevg/trainingmigrguide/
    # PT_LMTMOG_0074.html, its torchrun example).
    "huawei": "hccl",
    # torch_mlu's process group over CNCL registers as "cncl" (github.com/Cambricon/torch_mlu,
    # torch_mlu/csrc/framework/distributed/process_group_cncl.hpp: CNCL_BACKEND_NAME).
    "cambricon": "cncl",
}


def _nvidia_lines(shape: Shape) -> list[str]:
    # NCCL reads the NCCL_* variables of the scenario's env; nothing to add.
    return []


def _rocm_lines(shape: Shape) -> list[str]:
    return [
        # RCCL reads NCCL's variable names (NCCL_SOCKET_IFNAME, NCCL_IB_HCA, NCCL_DEBUG…), so the
        # scenario's NCCL_* settings apply unchanged
        # (https://rocm.docs.amd.com/projects/rccl/en/latest/api-reference/env-variables.html).
        # Peer-to-peer transport between PCIe-attached GPUs needs HSA_FORCE_FINE_GRAIN_PCIE=1
        # (RCCL usage tips, Enabling peer-to-peer transport,
        # https://rocm.docs.amd.com/projects/rccl/en/latest/how-to/rccl-usage-tips.html), and
        # GPUs with large-BAR support; a site without it sets 0 in the scenario's env.
        'export HSA_FORCE_FINE_GRAIN_PCIE="${HSA_FORCE_FINE_GRAIN_PCIE:-1}"',
    ]


def _ascend_lines(shape: Shape) -> list[str]:
    return [
        # Time for every rank to reach HCCL's link set-up: 120 s by default, [120, 7200] allowed
        # (CANN environment variables, HCCL_CONNECT_TIMEOUT,
        # https://www.hiascend.com/document/detail/zh/canncommercial/83RC1/maintenref/envvar/envref_07_0149.html).
        # Ranks reach it unevenly (one node loads its data or model slower), so 20 minutes here.
        'export HCCL_CONNECT_TIMEOUT="${HCCL_CONNECT_TIMEOUT:-1200}"',
        # How long ranks wait for each other inside a collective, as when only some ranks save a
        # checkpoint: 1836 s by default on current CANN (HCCL_EXEC_TIMEOUT,
        # https://www.hiascend.com/document/detail/zh/canncommercial/latest/maintenref/envvar/envref_07_0078.html),
        # but 600 s on CANN 6.0.RC1 (…/canncommercial/60RC1/modeldev/tfmigr1/tfmigr1_000069.html):
        # said outright, so that a checkpoint gets half an hour on every release.
        'export HCCL_EXEC_TIMEOUT="${HCCL_EXEC_TIMEOUT:-1836}"',
        # The host network interface HCCL sets up on. HCCL_SOCKET_IFNAME takes NCCL's syntax
        # (prefixes, ^ to exclude, = for exact names) and HCCL_IF_IP, an address, overrides it
        # (https://www.hiascend.com/document/detail/zh/CANNCommunityEdition/83RC1/maintenref/envvar/envref_07_0075.html),
        # so the scenario's NCCL_SOCKET_IFNAME says the same for HCCL where nothing else is set.
        'if [[ -z "${HCCL_SOCKET_IFNAME:-}" && -n "${NCCL_SOCKET_IFNAME:-}" ]]; then',
        '  export HCCL_SOCKET_IFNAME="$NCCL_SOCKET_IFNAME"',
        "fi",
        # One worker per NPU the job can see. torchrun's --nproc_per_node=gpu counts CUDA devices
        # (torch/distributed/run.py, determine_local_world_size), and only recent releases count a
        # PrivateUse1 device such as torch_npu's, so the count is given: the entries of
        # ASCEND_RT_VISIBLE_DEVICES where the backend pinned the job (clusters/shares.py), else
        # the NPUs the job asked for (a container that the Ascend device plugin gave only its own).
        f"nproc={shape.gpus_per_node}",
        'if [[ -n "${ASCEND_RT_VISIBLE_DEVICES:-}" ]]; then',
        '  IFS=, read -r -a npus <<< "$ASCEND_RT_VISIBLE_DEVICES"',
        "  nproc=${#npus[@]}",
        "fi",
    ]


def _cambricon_lines(shape: Shape) -> list[str]:
    # CNCL's tuning variables are in Cambricon's CNCL developer guide, which the sources reachable
    # when this was written did not hold; the template sets none, and a site sets them in the
    # scenario's env. torch_mlu reads MLU_VISIBLE_DEVICES, which the backend sets.
    return []


VENDOR_LINES = {
    "nvidia": _nvidia_lines,
    "amd": _rocm_lines,
    "hygon": _rocm_lines,
    "huawei": _ascend_lines,
    "cambricon": _cambricon_lines,
}


def collective_lines(shape: Shape) -> list[str]:
    """The variables torchrun's workers need on the shape's devices, as script lines."""
    return [
        f"export PORTAL_DIST_BACKEND={DIST_BACKENDS[shape.vendor]}",
        *VENDOR_LINES[shape.vendor](shape),
        "",
    ]


def _nproc(shape: Shape) -> str:
    """torchrun's --nproc_per_node: counted at run time on Ascend (_ascend_lines), else the
    devices per node the job asked for."""
    return '"$nproc"' if shape.vendor == "huawei" else str(shape.gpus_per_node)


def _checkpointed(values: dict[str, Any], shape: Shape, command: str, *, srun: bool, mpirun: bool = False):
    """The contract's variables, the warning's handler, the program started in the background
    and the exit: the shell stays, to pass the warning on to the program (exec would leave Slurm's
    USR1, sent to the batch shell alone, with no one to hear it)."""
    return [
        *checkpoint_lines(values),
        *preempt_lines(forward_lines(shape, srun=srun, mpirun=mpirun)),
        *launch_lines(command, poll=False),
        *exit_lines(),
    ]


def render_python(values: dict[str, Any], shape: Shape) -> list[str]:
    return [
        *header("python", shape),
        *venv_lines(values),
        *_checkpointed(values, shape, f"python3 {_program(values)}", srun=False),
    ]


def render_torchrun(values: dict[str, Any], shape: Shape) -> list[str]:
    # Options in their underscore spelling: every torchrun accepts it, while the dashed aliases
    # (--nproc-per-node) came with PyTorch 2 and fail on 1.x (Debian bookworm's 1.13).
    lines = [*header("torchrun", shape), *venv_lines(values), *collective_lines(shape)]
    common = f"--nproc_per_node={_nproc(shape)} --max_restarts={int(values['max_restarts'])}"
    port = int(values["rdzv_port"])
    if not shape.multi:
        # --standalone runs the rendezvous store on a free local port: two single-node jobs
        # that share a machine (the local backend, a shared Slurm node) never collide on one.
        command = f"torchrun --standalone --nnodes=1 {common} {_program(values)}"
        return [*lines, *_checkpointed(values, shape, command, srun=False)]
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
            *_checkpointed(
                values,
                shape,
                f"srun --nodes={shape.nodes} --ntasks={shape.nodes} --ntasks-per-node=1 "
                '--cpus-per-task="$SLURM_CPUS_ON_NODE" \\\n'
                f'  torchrun {rdzv} --rdzv_id="$SLURM_JOB_ID" --rdzv_endpoint="$rdzv_host":{port} \\\n'
                f"  {_program(values)}",
                srun=True,
            ),
        ]
    # kubernetes: an Indexed Job of `nodes` pods, each running this script once. The backend
    # sets PORTAL_RDZV_HOST to the stable DNS name of pod 0 (subdomain + headless Service);
    # Kubernetes sets JOB_COMPLETION_INDEX. Pod 0 hosts the store, said outright with is_host
    # because a pod's host name need not match the DNS name that the others dial.
    return [
        *lines,
        'if [[ "$JOB_COMPLETION_INDEX" == 0 ]]; then is_host=1; else is_host=0; fi',
        "",
        *_checkpointed(
            values,
            shape,
            f'torchrun {rdzv} --rdzv_id="$PORTAL_RDZV_HOST" --rdzv_endpoint="$PORTAL_RDZV_HOST":{port} \\\n'
            f'  --rdzv_conf=is_host="$is_host" {_program(values)}',
            srun=False,
        ),
    ]


def render_horovod(values: dict[str, Any], shape: Shape) -> list[str]:
    setup, launcher = mpi_launch(shape, ranks_per_node=shape.gpus_per_node)
    # One rank per GPU; Horovod picks its GPU by local rank.
    slurm = shape.backend_kind == "slurm"
    return [
        *header("horovod", shape),
        *venv_lines(values),
        *setup,
        *_checkpointed(values, shape, f"{launcher} python3 {_program(values)}", srun=slurm, mpirun=not slurm),
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
            "checkpoint_minutes": checkpoint_minutes(
                "How often the program should save a checkpoint (PORTAL_CHECKPOINT_MINUTES)."
            ),
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
    "on the first node. PORTAL_DIST_BACKEND names torch.distributed's backend for the devices: nccl "
    "(NVIDIA; AMD and Hygon through RCCL), hccl (Huawei Ascend, torch_npu), cncl (Cambricon, torch_mlu).",
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
            "checkpoint_minutes": checkpoint_minutes(
                "How often the program should save a checkpoint (PORTAL_CHECKPOINT_MINUTES)."
            ),
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
        {
            "script": python_script("The training script; one copy runs per GPU."),
            "args": ARGS,
            "venv": VENV,
            "checkpoint_minutes": checkpoint_minutes(
                "How often the program should save a checkpoint (PORTAL_CHECKPOINT_MINUTES)."
            ),
        },
        required=["script"],
    ),
    renderer=render_horovod,
    multi_node_backends=frozenset({"slurm"}),
)
