"""GPU shares: what part of an accelerator a job gets, what that costs in device-equivalent
GPU-hours, and what each scheduler calls it (docs/architecture/shares.md).

Plain data and arithmetic, no model: the catalog, the ledger, the schedulers' backends and the
tenants' limits read the same tables, so that a share means one thing everywhere.

A share is one of
- `whole`: a whole device;
- `mig`: a MIG instance of one profile (`3g.71gb`), on the GPU models that have MIG;
- `slice`: a shared device with a memory cap in MiB and a compute percentage (HAMi on
  Kubernetes, the local cluster's memory cap); no isolation of faults, only of the caps;
- `shard`: Slurm's `gres/shard`, a share of a device with no isolation at all: jobs on one
  device see each other's memory and compete for its compute.

A job asks for `gpus` units of its share (devices, instances, slices, shards); each unit counts
`fraction` of a device. Quota is granted in the same units, and charged in device-equivalent
GPU-hours: units × fraction × hours.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_DOWN, Decimal

from django.db import models
from django.utils.translation import gettext_lazy as _

# Four decimals, as the ledger keeps: a fraction is rounded once, here, and every job of a share
# is charged with the same figure, so that reservations and releases cancel exactly. Rounded
# down, so that a device's shares never add up to more than the device (seven 1g instances are
# 0.9996 of it, not 1.0003): admission counts a partition's capacity in these figures.
FRACTION_PLACES = Decimal("0.0001")
ONE = Decimal(1)


class ShareKind(models.TextChoices):
    WHOLE = "whole", _("Whole device")
    MIG = "mig", _("MIG instance")
    SLICE = "slice", _("Shared slice (memory and compute caps)")
    SHARD = "shard", _("Slurm shard (shared, no isolation)")


# Where each kind of share can be given: MIG needs the device plugin's mixed strategy or
# AutoDetect=nvml's typed GRES; slices need HAMi (Kubernetes) or the local memory cap (NVIDIA's
# alone there, LOCAL_SLICE_VENDORS: HAMi-core, which enforces it, hooks CUDA); shards are Slurm's.
KINDS_BY_CLUSTER = {
    "slurm": (ShareKind.WHOLE, ShareKind.MIG, ShareKind.SHARD),
    "kubernetes": (ShareKind.WHOLE, ShareKind.MIG, ShareKind.SLICE),
    "local": (ShareKind.WHOLE, ShareKind.MIG, ShareKind.SLICE),
}

# What the portal says wherever someone chooses a share without isolation.
SHARD_WARNING = _(
    "Shards share a device without isolation: jobs on one GPU see each other's memory use and "
    "compete for its compute. Use them for small, trusted work."
)


def rounded(value: Decimal) -> Decimal:
    """A fraction as the ledger keeps it: four decimals, rounded down, at most one device."""
    return min(ONE, value).quantize(FRACTION_PLACES, ROUND_DOWN)


@dataclass(frozen=True)
class MigProfile:
    """One MIG profile of a GPU model, as NVIDIA's MIG user guide lists it: `<g>g.<memory>gb`,
    g of the device's 7 compute slices and `memory_slices` of its 8 memory slices."""

    name: str
    compute_slices: int
    memory_slices: int
    memory_gb: int
    instances_max: int

    @property
    def fraction(self) -> Decimal:
        """What one instance counts of its device: the larger of its compute (g/7) and its memory
        (m/8) parts, since an instance blocks both; 7g is the whole device."""
        return rounded(max(Decimal(self.compute_slices) / 7, Decimal(self.memory_slices) / 8))


def mig_profiles(rows: list[dict]) -> list[MigProfile]:
    """A GPU model's `mig_profiles` (the catalog's JSON) as MigProfiles."""
    return [
        MigProfile(
            name=row["name"],
            compute_slices=int(row["compute_slices"]),
            memory_slices=int(row["memory_slices"]),
            memory_gb=int(row["memory_gb"]),
            instances_max=int(row["instances_max"]),
        )
        for row in rows
    ]


def device_memory_mib(memory_gb: int) -> int:
    """A device's memory in MiB as the portal counts a slice's cap against it: the catalog's
    figure taken as GiB (an H200's 141 GB is 144,384 MiB)."""
    return memory_gb * 1024


def slice_memory_unit_mib(vendor: str) -> int:
    """The step a slice's memory cap goes in for the vendor's devices (1 MiB unless HAMi counts
    them coarser)."""
    names = SLICE_RESOURCES.get(vendor)
    return names.memory_unit_mib if names is not None else 1


LOCAL_SLICE_VENDORS = ("nvidia",)


def slice_fraction(*, memory_mib: int, cores_pct: int, memory_gb: int) -> Decimal:
    """What a slice counts of its device: the larger of its memory cap's part and its compute
    percentage (a slice blocks both for others)."""
    memory_part = Decimal(memory_mib) / device_memory_mib(memory_gb)
    cores_part = Decimal(cores_pct) / 100
    return rounded(max(memory_part, cores_part))


def shard_fraction(shards_per_gpu: int) -> Decimal:
    """What one shard counts of its device: 1 / the shards a device is split into."""
    return rounded(ONE / shards_per_gpu)


@dataclass(frozen=True)
class Share:
    """What part of a device each of a job's units is."""

    kind: str = ShareKind.WHOLE
    mig_profile: str = ""
    memory_mib: int = 0  # slice: the memory cap per unit
    cores_pct: int = 0  # slice: the compute percentage per unit

    @property
    def label(self) -> str:
        if self.kind == ShareKind.MIG:
            return f"MIG {self.mig_profile}"
        if self.kind == ShareKind.SLICE:
            return f"slice {self.memory_mib} MiB / {self.cores_pct}%"
        return str(ShareKind(self.kind).label)


WHOLE = Share()


# --- What the schedulers call them


def slurm_gres(*, kind: str, gpu_type: str, mig_profile: str, per_node: int) -> str:
    """The job's --gres: typed GPUs, MIG instances as AutoDetect=nvml types them, or shards."""
    if kind == ShareKind.SHARD:
        return f"shard:{per_node}"
    if kind == ShareKind.MIG:
        return f"gpu:{mig_profile}:{per_node}"
    return f"gpu:{gpu_type}:{per_node}"


@dataclass(frozen=True)
class SliceResources:
    """One vendor's device-plugin resources for a shared slice (HAMi's names): the count of
    shared devices ("" : the model's own resource), the memory cap in MiB and the compute
    percentage ("" where the vendor has none)."""

    count: str
    memory: str
    cores: str = ""
    memory_unit_mib: int = 1  # what one unit of the memory resource is, in MiB


SLICE_RESOURCES = {
    "nvidia": SliceResources("nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpucores"),
    # HAMi counts Cambricon's vmemory in 256 MiB (pkg/device/cambricon/device.go, MemoryFactor; its
    # device plugin runs with min-dsmlu-unit=256): a slice's cap is a multiple of that.
    "cambricon": SliceResources(
        "cambricon.com/vmlu",
        "cambricon.com/mlu.smlu.vmemory",
        "cambricon.com/mlu.smlu.vcore",
        memory_unit_mib=256,
    ),
    "hygon": SliceResources("hygon.com/dcunum", "hygon.com/dcumem", "hygon.com/dcucores"),
    "huawei": SliceResources("", "{resource}-memory"),
}
# HAMi's scheduler, which places slices: a pod with a slice names it.
HAMI_SCHEDULER = "hami-scheduler"


def k8s_pod_resources(
    *,
    vendor: str,
    resource: str,
    kind: str,
    per_node: int,
    mig_profile: str = "",
    memory_mib: int = 0,
    cores_pct: int = 0,
) -> dict[str, int]:
    """The extended resources of one pod (one node's part of a job): `resource` is the model's
    whole-device resource (nvidia.com/gpu, huawei.com/Ascend910B…). A slice is one shared
    device per pod, with its caps (HAMi counts gpumem and gpucores per device)."""
    if kind == ShareKind.SLICE:
        names = _slice_resources(vendor)
        memory = memory_mib // names.memory_unit_mib
        found = {names.count or resource: 1, names.memory.format(resource=resource): memory}
        if names.cores:
            found[names.cores] = cores_pct
        return found
    whole_or_mig = {"vendor": vendor, "resource": resource, "kind": kind, "mig_profile": mig_profile}
    return k8s_quota_resources(**whole_or_mig, units=per_node)


def k8s_quota_resources(
    *, vendor: str, resource: str, kind: str, units: int, mig_profile: str = ""
) -> dict[str, int]:
    """What `units` of a share add to a tenant's ResourceQuota: MIG instances by their profile's
    resource, slices by the count of shared devices, whole devices by the model's resource."""
    if kind == ShareKind.MIG:
        return {f"nvidia.com/mig-{mig_profile}": units}
    if kind == ShareKind.SLICE:
        return {_slice_resources(vendor).count or resource: units}
    return {resource: units}


def _slice_resources(vendor: str) -> SliceResources:
    names = SLICE_RESOURCES.get(vendor)
    if names is None:
        raise ValueError(f"{vendor} devices have no shared slices on Kubernetes")
    return names


# --- Which variables pin a local job to its devices


# The first variable of each gets the devices' physical indexes; any after it their positions
# among those (HIP numbers only the devices that ROCr exposes).
VISIBLE_DEVICES = {
    "nvidia": ("CUDA_VISIBLE_DEVICES",),
    "amd": ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"),
    "hygon": ("HIP_VISIBLE_DEVICES",),
    "huawei": ("ASCEND_RT_VISIBLE_DEVICES",),
    "cambricon": ("MLU_VISIBLE_DEVICES",),
}
