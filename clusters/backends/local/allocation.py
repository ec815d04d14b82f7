"""What a local job gets of the machine's devices (devices.py) for its share (clusters/shares.py):
whole devices no other job uses, MIG devices of its profile, or slices (a memory cap and a
compute percentage on a device that other slices may share while their caps fit in it).

Pure functions of the records backend.py keeps in alloc.json:

    queue entry   {"gpus": units, "share", "vendor", "mig_profile", "memory_mib", "cores_pct"}
    running job   {"gpus": [device indexes], "mig": [MIG UUIDs], and its queue entry's keys}

An entry without "share" or "vendor", from a state written before shares, is a whole NVIDIA job.
A running MIG job's "gpus" are its MIG devices' GPUs; "mig" is only a MIG job's.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from clusters.backends.base import JobSpec
from clusters.backends.local.devices import NOUNS, Device, Machine
from clusters.shares import KINDS_BY_CLUSTER, VISIBLE_DEVICES, ShareKind

LOCAL_SHARES = tuple(str(kind) for kind in KINDS_BY_CLUSTER["local"])
SLICE_VENDORS = ("nvidia",)  # HAMi-core, which holds a process to a slice's caps, is CUDA's


@dataclass(frozen=True)
class Ask:
    """What one job asks for: `units` of its share on its vendor's devices."""

    units: int
    share: str = ShareKind.WHOLE.value
    vendor: str = "nvidia"
    mig_profile: str = ""
    memory_mib: int = 0  # a slice's cap, per unit
    cores_pct: int = 0  # a slice's compute percentage, per unit

    @classmethod
    def of_spec(cls, spec: JobSpec) -> Ask:
        return cls(
            spec.gpus, str(spec.share), spec.vendor, spec.mig_profile, spec.gpu_memory_mib, spec.gpu_cores_pct
        )

    @classmethod
    def of_record(cls, job: dict[str, Any]) -> Ask:
        """A queue entry's ask; an entry from before shares asks for whole NVIDIA GPUs."""
        return cls(
            job["gpus"],
            job.get("share", ShareKind.WHOLE.value),
            job.get("vendor", "nvidia"),
            job.get("mig_profile", ""),
            job.get("memory_mib", 0),
            job.get("cores_pct", 0),
        )

    def record(self) -> dict[str, Any]:
        """The keys a queue entry (and then the running job) keeps of it."""
        found: dict[str, Any] = {"gpus": self.units, "share": self.share, "vendor": self.vendor}
        if self.share == ShareKind.MIG:
            found["mig_profile"] = self.mig_profile
        if self.share == ShareKind.SLICE:
            found |= {"memory_mib": self.memory_mib, "cores_pct": self.cores_pct}
        return found

    @property
    def pool(self) -> tuple[str, str]:
        """What the job competes for: its vendor's devices (whole jobs and slices alike), or the
        MIG devices of its profile. Waiting jobs start in order within a pool."""
        return ("mig", self.mig_profile) if self.share == ShareKind.MIG else ("devices", self.vendor)


@dataclass
class _Usage:
    whole: set[tuple[str, int]] = field(default_factory=set)  # (vendor, index) held whole
    sliced: dict[tuple[str, int], tuple[int, int]] = field(default_factory=dict)  # → MiB, % held
    migs: set[str] = field(default_factory=set)  # MIG UUIDs held

    def busy(self, device: Device) -> bool:
        key = (device.vendor, device.index)
        return key in self.whole or key in self.sliced


def _usage(running: Iterable[dict[str, Any]]) -> _Usage:
    usage = _Usage()
    for job in running:
        vendor, share = job.get("vendor", "nvidia"), job.get("share", ShareKind.WHOLE)
        if share == ShareKind.MIG:
            usage.migs.update(job.get("mig", []))
        elif share == ShareKind.SLICE:
            for index in job["gpus"]:
                memory_mib, cores_pct = usage.sliced.get((vendor, index), (0, 0))
                usage.sliced[vendor, index] = (memory_mib + job["memory_mib"], cores_pct + job["cores_pct"])
        else:
            usage.whole.update((vendor, index) for index in job["gpus"])
    return usage


def _unsplit(machine: Machine, vendor: str) -> list[Device]:
    """The vendor's devices that a whole job or a slice may get: not NVIDIA GPUs in MIG mode."""
    split = machine.split if vendor == "nvidia" else frozenset()
    return [device for device in machine.of(vendor) if device.index not in split]


def refusal(ask: Ask, machine: Machine) -> str | None:
    """Why this machine can never give the job what it asks for, even with nothing else running;
    None when it can."""
    if ask.share not in LOCAL_SHARES:
        return f"the local cluster gives {', '.join(LOCAL_SHARES)} shares, not {ask.share!r}"
    if ask.vendor not in VISIBLE_DEVICES:
        return f"unknown accelerator vendor {ask.vendor!r}"
    if ask.share == ShareKind.MIG:
        return _mig_refusal(ask, machine)
    if ask.share == ShareKind.SLICE:
        return _slice_refusal(ask, machine)
    have = len(_unsplit(machine, ask.vendor))
    if ask.units <= have:
        return None
    why = f"the job asks for {ask.units} {NOUNS[ask.vendor]}; the local cluster has {have}"
    if ask.vendor == "nvidia" and machine.split:
        why += f" (and GPUs {_listed(machine.split)} split into MIG devices, which whole jobs do not get)"
    return why


def _mig_refusal(ask: Ask, machine: Machine) -> str | None:
    if ask.vendor != "nvidia":
        return f"MIG devices are NVIDIA GPUs', not {NOUNS[ask.vendor]}'"
    if not ask.mig_profile:
        return "a MIG job names its MIG profile (e.g. 3g.71gb)"
    if ask.units < 1:
        return "a MIG job asks for at least one MIG device"
    have = sum(1 for mig in machine.migs if mig.profile == ask.mig_profile)
    if ask.units <= have:
        return None
    profiles = ", ".join(sorted({mig.profile for mig in machine.migs}))
    there = f"its MIG devices are {profiles}" if profiles else "no GPU here is split into MIG devices"
    asked = f"{ask.units} MIG {ask.mig_profile} devices"
    return f"the job asks for {asked}; the local cluster has {have} ({there})"


def _slice_refusal(ask: Ask, machine: Machine) -> str | None:
    if ask.vendor not in SLICE_VENDORS:
        return (
            f"the local cluster gives slices of NVIDIA GPUs only (HAMi-core, which holds a job to "
            f"a slice's caps, is CUDA's), not of {NOUNS[ask.vendor]}"
        )
    if ask.units < 1:
        return "a slice job asks for at least one slice"
    if ask.memory_mib < 1:
        return "a slice needs a memory cap in MiB"
    if not 1 <= ask.cores_pct <= 100:
        return f"a slice's compute percentage is between 1 and 100, not {ask.cores_pct}"
    devices = _unsplit(machine, ask.vendor)
    known = [device.memory_mib for device in devices if device.memory_mib]
    if devices and not known:
        return (
            "the local cluster does not know its GPUs' memory (they are configured by count, or "
            "nvidia-smi did not report it), so it gives no slices"
        )
    fit = [memory for memory in known if memory >= ask.memory_mib]
    if ask.units <= len(fit):
        return None
    largest = f"; its largest has {max(known)} MiB" if known else ""
    return (
        f"the job asks for {ask.units} slices of {ask.memory_mib} MiB, each on a GPU of its own; the "
        f"local cluster has {len(fit)} GPUs with that much memory{largest}"
    )


def place(ask: Ask, machine: Machine, running: Iterable[dict[str, Any]]) -> dict[str, list] | None:
    """The devices the job gets now, beside the running jobs ({"gpus": [indexes]}, and "mig":
    [UUIDs] for a MIG job); None while they are not free. Lowest indexes first, as before shares;
    a slice goes first where slices already are, so that whole devices stay whole."""
    usage = _usage(running)
    if ask.share == ShareKind.MIG:
        free = [mig for mig in machine.migs if mig.profile == ask.mig_profile and mig.uuid not in usage.migs]
        if len(free) < ask.units:
            return None
        taken = free[: ask.units]
        return {"gpus": sorted({mig.gpu for mig in taken}), "mig": [mig.uuid for mig in taken]}
    devices = _unsplit(machine, ask.vendor)
    if ask.share == ShareKind.SLICE:
        fits = [device for device in devices if _slice_fits(ask, device, usage)]
        fits.sort(key=lambda device: ((device.vendor, device.index) not in usage.sliced, device.index))
        free = [device.index for device in fits]
    else:
        free = [device.index for device in devices if not usage.busy(device)]
    return {"gpus": free[: ask.units]} if len(free) >= ask.units else None


def _slice_fits(ask: Ask, device: Device, usage: _Usage) -> bool:
    key = (device.vendor, device.index)
    if key in usage.whole or not device.memory_mib:
        return False
    memory_mib, cores_pct = usage.sliced.get(key, (0, 0))
    return memory_mib + ask.memory_mib <= device.memory_mib and cores_pct + ask.cores_pct <= 100


def devices_free(machine: Machine, running: Iterable[dict[str, Any]]) -> int:
    """How many of the machine's devices hold nothing: no whole job, no slice, no MIG device in use."""
    usage = _usage(running)
    in_mig_use = {mig.gpu for mig in machine.migs if mig.uuid in usage.migs}
    return sum(
        1
        for device in machine.devices
        if not usage.busy(device) and not (device.vendor == "nvidia" and device.index in in_mig_use)
    )


def device_env(ask: Ask, grant: dict[str, list]) -> dict[str, str]:
    """The variables that pin the job to what it was given, and a slice's caps.

    NVIDIA: CUDA_VISIBLE_DEVICES, GPU indexes in PCI bus order as nvidia-smi numbers them, or MIG
    UUIDs. Other vendors: their VISIBLE_DEVICES variables; where there are several, the runtime
    applies them in turn (AMD: ROCr's ROCR_VISIBLE_DEVICES, then HIP's HIP_VISIBLE_DEVICES within
    what ROCr shows), so the first takes the device indexes and each next one their positions. A
    slice's caps: the portal's own names, and HAMi-core's (CUDA_DEVICE_MEMORY_LIMIT,
    CUDA_DEVICE_SM_LIMIT), which it enforces where the site preloads it."""
    if ask.share == ShareKind.MIG:
        return {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": ",".join(grant["mig"])}
    indexes = grant["gpus"]
    first, *then = VISIBLE_DEVICES[ask.vendor]
    env = {first: ",".join(map(str, indexes))}
    env |= {name: ",".join(map(str, range(len(indexes)))) for name in then}
    if ask.vendor == "nvidia":  # nvidia-smi numbers GPUs in PCI bus order, CUDA by default fastest first
        env = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", **env}
    if ask.share == ShareKind.SLICE:
        env |= {
            "PORTAL_GPU_MEMORY_MIB": str(ask.memory_mib),
            "PORTAL_GPU_CORES_PCT": str(ask.cores_pct),
            "CUDA_DEVICE_MEMORY_LIMIT": f"{ask.memory_mib}m",
            "CUDA_DEVICE_SM_LIMIT": str(ask.cores_pct),
        }
    return env


def _listed(indexes: Iterable[int]) -> str:
    return ", ".join(map(str, sorted(indexes)))
