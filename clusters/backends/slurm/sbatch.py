"""One job's sbatch request: its options (GRES, CPUs and memory, preemption), its rendered script
and the checkpoint contract's restart environment, every value checked (SlurmBackend.submit_many)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from clusters.backends.base import BackendError, JobSpec
from clusters.backends.slurm.parse import check_count, check_job_name, check_name, check_token, render_script
from clusters.shares import ShareKind, slurm_gres

if TYPE_CHECKING:
    from clusters.backends.slurm.backend import SlurmBackend


def sbatch_request(backend: SlurmBackend, spec: JobSpec) -> tuple[list[str], str, str]:
    """sbatch's arguments, the rendered script and the job's directory, every value checked."""
    check_token(spec.token)
    check_job_name(spec.name)
    for value, what in ((spec.account, "account"), (spec.qos, "QOS"), (spec.partition, "partition")):
        check_name(value, what)
    check_name(spec.gpu_type, "GPU type")  # typed always: an untyped request slips past typed limits
    if spec.share not in (ShareKind.WHOLE, ShareKind.MIG, ShareKind.SHARD):
        raise BackendError(f"Slurm gives whole GPUs, MIG instances and shards, not a {spec.share}")
    if spec.share == ShareKind.MIG:
        check_name(spec.mig_profile, "MIG profile")  # a typed GRES, as AutoDetect=nvml names it
    for value, what in (
        (spec.gpus_per_node, "GPUs per node"),
        (spec.nodes, "node count"),
        (spec.walltime_minutes, "walltime"),
        (spec.cpus_per_gpu, "CPUs per GPU"),
        (spec.mem_per_gpu_mb, "memory per GPU"),
    ):
        check_count(value, what)
    directory = backend.job_dir(spec.account, spec.user)
    restart_env = _restart_env(spec, directory)
    script = render_script(
        spec.script,
        {**spec.env, **restart_env},
        then='mkdir -p -m 0700 -- "$PORTAL_CHECKPOINT_DIR"\n' if restart_env else "",
    )
    output = f"{directory}/{spec.token}.out"
    argv = [
        "--parsable",
        f"--job-name={spec.name}",
        f"--account={spec.account}",
        f"--qos={spec.qos}",
        f"--partition={spec.partition}",
        "--gres=" + _gres(spec),
        f"--nodes={spec.nodes}",
        f"--time={spec.walltime_minutes}",
        *_cpus_and_memory(spec),
        f"--comment={spec.token}",
        f"--output={output}",
        f"--error={output}",
        f"--chdir={directory}",
        *_preemption(spec),
    ]
    return argv, script, directory


def _restart_env(spec: JobSpec, directory: str) -> dict[str, str]:
    """The checkpoint contract's variables (README): the job's checkpoint directory in its
    identity's tree, the same for every attempt; the attempt; the signal it is warned with."""
    if not spec.checkpoint_key:
        return {}
    check_name(spec.checkpoint_key, "checkpoint key")
    return {
        "PORTAL_CHECKPOINT_DIR": f"{directory}/checkpoints/{spec.checkpoint_key}",
        "PORTAL_ATTEMPT": str(check_count(spec.attempt, "attempt")),
        "PORTAL_PREEMPT_SIGNAL": "USR1",
    }


def _preemption(spec: JobSpec) -> list[str]:
    """A preemptible job's batch shell gets USR1 grace_s before its end (its walltime's, or a
    preemption's: PreemptParameters=send_user_signal); one the portal restarts is not requeued by
    Slurm, whose node failure or preemption then ends it, and the portal submits the next attempt."""
    options = []
    if spec.preemptible and spec.grace_s:
        options.append(f"--signal=B:USR1@{check_count(spec.grace_s, 'grace')}")
    if spec.preemptible or spec.restarts:
        options.append("--no-requeue")
    return options


def _gres(spec: JobSpec) -> str:
    kind, per_node = spec.share, spec.gpus_per_node
    return slurm_gres(kind=kind, gpu_type=spec.gpu_type, mig_profile=spec.mig_profile, per_node=per_node)


def _cpus_and_memory(spec: JobSpec) -> list[str]:
    """CPUs and memory per unit: per GPU for whole GPUs and MIG instances (typed gres/gpu); for
    shards, which are no gres/gpu, per node (sbatch refuses --cpus-per-gpu without a GPU)."""
    if spec.share == ShareKind.SHARD:
        return [
            "--ntasks-per-node=1",
            f"--cpus-per-task={spec.cpus_per_gpu * spec.gpus_per_node}",
            f"--mem={spec.mem_per_gpu_mb * spec.gpus_per_node}M",
        ]
    return [f"--cpus-per-gpu={spec.cpus_per_gpu}", f"--mem-per-gpu={spec.mem_per_gpu_mb}M"]
