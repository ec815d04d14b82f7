"""The cluster as a whole: its partitions and free GPUs (sinfo), whether the service user may act
as each job identity, and whether slurmctld answers (scontrol ping)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from clusters.backends.base import BackendError, Health, PartitionInfo
from clusters.backends.slurm.parse import gpu_gres, minutes, split_rows

if TYPE_CHECKING:
    from clusters.backends.slurm.backend import SlurmBackend

USABLE_NODE_STATES = {"idle", "mixed", "allocated", "completing", "planned"}


def inventory(backend: SlurmBackend) -> list[PartitionInfo]:
    """One line per (partition, node) from sinfo. A partition named after one of its
    nodes' GPU types offers that type; otherwise one entry per type its nodes have."""
    fields = "PartitionName:|,NodeList:|,Gres:|,GresUsed:|,Time:|,StateLong:|"
    stdout = backend.check(["sinfo", "-h", "-N", "-O", fields])
    partitions: dict[str, dict[str, PartitionInfo]] = {}
    for partition, _node, gres, used, limit, state, *_rest in split_rows(stdout, 7):
        usable = state.rstrip("*~#!%$@^-+").lower() in USABLE_NODE_STATES
        used_counts = gpu_gres(used)
        by_type = partitions.setdefault(partition, {})
        for gpu_type, total in gpu_gres(gres).items():
            free = max(total - used_counts.get(gpu_type, 0), 0) if usable else 0
            info = by_type.get(gpu_type) or PartitionInfo(partition, gpu_type, 0, 0, 0, minutes(limit))
            by_type[gpu_type] = replace(
                info,
                gpus_per_node=max(info.gpus_per_node, total),
                nodes=info.nodes + 1,
                gpus_free=info.gpus_free + free,
            )
    result = []
    for partition, by_type in partitions.items():
        result += [by_type[partition]] if partition in by_type else list(by_type.values())
    return result


def identities_check(backend: SlurmBackend, users: list[str]) -> dict[str, str]:
    """Per identity, whether the service user may act as it: one harmless command through the
    sudoers rule (`tail -c 0 /dev/null`), which fails for a user that does not exist, is
    outside the job identities' group, or is root or the service user itself), and whether
    it owns its tree <scratch root>/<identity>, which the site makes with the identity."""
    problems = {}
    for user in sorted(set(users)):
        try:
            argv = backend.as_identity(user, ["tail", "-c", "0", "/dev/null"])
            top = backend.job_dir("x", user).rpartition("/")[0]
        except BackendError as exc:
            problems[user] = str(exc)
            continue
        result = backend.run(argv)
        if result.rc != 0:
            if "unknown user" in result.message:
                problems[user] = f"no user {user} on the login node"
            else:
                problems[user] = f"the service user may not act as {user}: {result.message[:200]}"
            continue
        owner = backend.run(["stat", "-c", "%U", "--", top])
        problems[user] = "" if owner.stdout.strip() == user else f"{top} is missing or not owned by {user}"
    return problems


def health(backend: SlurmBackend) -> Health:
    try:
        result = backend.run(["scontrol", "ping"], timeout_s=min(backend.command_timeout_s, 10))
    except BackendError as exc:  # BackendUnavailable included
        return Health(False, str(exc))
    except Exception as exc:  # health() never raises: it is what tells admins what broke
        return Health(False, f"{type(exc).__name__}: {exc}")
    answer = " ".join(result.stdout.split()) or result.message
    return Health(result.rc == 0 and "is UP" in answer, answer[:200])
