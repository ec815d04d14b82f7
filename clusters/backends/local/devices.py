"""The local cluster's accelerators: what each vendor's tool lists, read once per process.

NVIDIA: `nvidia-smi -L`, which also lists each GPU's MIG devices (profile and MIG UUID) under it,
and the GPUs' memory from the telemetry reading (gpus.py: NVML, else nvidia-smi); NVML's count
where nvidia-smi is missing. AMD: `rocm-smi --showproductname --showmeminfo vram --json`; Hygon
DCU: `hy-smi` with the same arguments (Hygon's fork of rocm-smi; where it is there, rocm-smi is
Hygon's too and is not read); Huawei Ascend: `npu-smi info -m` (the chips' logic ids, which
ASCEND_RT_VISIBLE_DEVICES takes); Cambricon: `cnmon`. Each tool
is run where it is on the PATH, through a fixed argv and a timeout; one that is missing, fails
or hangs adds no device (logged), as a machine without that vendor's devices would.

The parsers are pure functions of the tool's text (tests/fixtures/accelerators/ holds their
recordings). An index is the one the vendor's VISIBLE_DEVICES variable takes.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import shutil
import subprocess
from dataclasses import dataclass, replace

from clusters.backends.base import BackendError

log = logging.getLogger(__name__)

TOOL_TIMEOUT_S = 15.0
_MIB = 1 << 20

_SMI_GPU = re.compile(r"^GPU (\d+):.*\(UUID: (GPU-[0-9A-Fa-f-]+)\)$")
_SMI_GPU_NAME = re.compile(r"^GPU \d+: (.*?) \(UUID: ")
# `  MIG 3g.71gb     Device  0: (UUID: MIG-…)`; drivers before R470 wrote MIG-GPU-<uuid>/<gi>/<ci>.
_SMI_MIG = re.compile(r"^MIG (\S+)\s+Device\s+(\d+): \(UUID: (MIG-(?:GPU-)?[0-9A-Fa-f-]+(?:/\d+/\d+)?)\)$")
_NPU_CHIP = re.compile(r"^(\d+)\s+(\d+)\s+(\d+|-)\s+(\S.*?)\s*$")
_CNMON_CARD = re.compile(r"^\|\s*(\d+)\s+(\S+)\s+(\S+)\s+\S+\s*\|")
_CNMON_MEMORY = re.compile(r"\|\s*\d+ MiB/\s*(\d+) MiB\s*\|")
_HYGON_VENDOR = re.compile(r"haiguang|hygon", re.I)
# What the portal calls each vendor's devices, in counts and refusals.
NOUNS = {
    "nvidia": "GPUs",
    "amd": "AMD GPUs",
    "hygon": "Hygon DCUs",
    "huawei": "Ascend NPUs",
    "cambricon": "Cambricon MLUs",
}


@dataclass(frozen=True)
class Device:
    """One whole device: `index` as its vendor's VISIBLE_DEVICES variable takes it; memory 0
    where it is not known."""

    vendor: str
    index: int
    name: str = ""
    uuid: str = ""
    memory_mib: int = 0


@dataclass(frozen=True)
class MigDevice:
    """One MIG device (a GPU instance with its compute instance) of NVIDIA GPU `gpu`."""

    gpu: int
    profile: str  # 3g.71gb
    index: int  # under its GPU, as nvidia-smi numbers it
    uuid: str  # MIG-…, what CUDA_VISIBLE_DEVICES takes


@dataclass(frozen=True)
class Machine:
    """This machine's devices, and the MIG devices its NVIDIA GPUs are split into."""

    devices: tuple[Device, ...] = ()
    migs: tuple[MigDevice, ...] = ()

    def of(self, vendor: str) -> list[Device]:
        return [device for device in self.devices if device.vendor == vendor]

    @property
    def split(self) -> frozenset[int]:
        """The NVIDIA GPUs split into MIG devices: no whole job and no slice goes there."""
        return frozenset(mig.gpu for mig in self.migs)

    def summary(self) -> str:
        """The devices in a few words: "4 GPUs", "4 GPUs (2 split into 9 MIG devices), 8 Ascend NPUs"."""
        parts = []
        for vendor in dict.fromkeys(device.vendor for device in self.devices):
            part = f"{len(self.of(vendor))} {NOUNS.get(vendor, vendor)}"
            if vendor == "nvidia" and self.migs:
                part += f" ({len(self.split)} split into {len(self.migs)} MIG devices)"
            parts.append(part)
        return ", ".join(parts) or "0 GPUs"


# --- the tools' outputs, parsed


def parse_nvidia_smi_list(text: str) -> list[tuple[int, str]]:
    """(index, UUID) of each GPU in `nvidia-smi -L` output; MIG devices and other lines are skipped."""
    return [(int(m[1]), m[2]) for line in text.splitlines() if (m := _SMI_GPU.match(line.strip()))]


def parse_nvidia_smi_devices(text: str) -> tuple[list[Device], list[MigDevice]]:
    """The GPUs in `nvidia-smi -L` output and the MIG devices listed under each of them."""
    gpus: list[Device] = []
    migs: list[MigDevice] = []
    for line in text.splitlines():
        line = line.strip()
        if m := _SMI_GPU.match(line):
            name = _SMI_GPU_NAME.match(line)
            gpus.append(Device("nvidia", int(m[1]), name[1] if name else "", m[2]))
        elif (m := _SMI_MIG.match(line)) and gpus:
            migs.append(MigDevice(gpus[-1].index, m[1], int(m[2]), m[3]))
    return gpus, migs


def _first_json_object(text: str) -> dict:
    # Some rocm-smi and hy-smi builds print a warning line around their JSON.
    start = text.find("{")
    if start < 0:
        raise BackendError("no JSON object in the tool's output")
    try:
        found, _end = json.JSONDecoder().raw_decode(text[start:])
    except json.JSONDecodeError as exc:
        raise BackendError(f"unreadable JSON from the tool: {exc}") from None
    if not isinstance(found, dict):
        raise BackendError("the tool's JSON is not an object of cards")
    return found


def _field(fields: dict, *names: str) -> str:
    wanted = {name.lower() for name in names}
    return next((str(value).strip() for key, value in fields.items() if key.lower() in wanted), "")


def _memory_mib(fields: dict) -> int:
    if (in_bytes := _field(fields, "VRAM Total Memory (B)")).isdigit():
        return int(in_bytes) // _MIB
    in_mib = _field(fields, "VRAM Total Memory (MiB)")
    return int(in_mib) if in_mib.isdigit() else 0


def parse_rocm_smi_devices(text: str, *, vendor: str = "amd") -> list[Device]:
    """The cards in `rocm-smi --showproductname --showmeminfo vram --json` output (`card<N>`: N is
    the index ROCR_VISIBLE_DEVICES takes), or hy-smi's with vendor "hygon". rocm-smi leaves out
    the Hygon DCUs that a Hygon host's rocm-smi lists: hy-smi reports those."""
    devices = []
    for key, fields in _first_json_object(text).items():
        if not (key.startswith("card") and key[4:].isdigit() and isinstance(fields, dict)):
            continue  # "system" and the like
        if vendor == "amd" and _HYGON_VENDOR.search(_field(fields, "Card Vendor")):
            continue
        name = _field(fields, "Card Series", "Card series", "Device Name")
        devices.append(Device(vendor, int(key[4:]), name, memory_mib=_memory_mib(fields)))
    return sorted(devices, key=lambda device: device.index)


def parse_npu_smi_devices(text: str) -> list[Device]:
    """The NPU chips in `npu-smi info -m` output by their logic id (ASCEND_RT_VISIBLE_DEVICES');
    a board's MCU, which has none ("-"), is no device."""
    devices = []
    for line in text.splitlines():
        if (m := _NPU_CHIP.match(line.strip())) and m[3] != "-":
            devices.append(Device("huawei", int(m[3]), m[4]))
    return sorted(devices, key=lambda device: device.index)


def parse_cnmon_devices(text: str) -> list[Device]:
    """The cards in `cnmon`'s table: a card's row (`| 0  /  MLU370-X8  v1.1.6 |`; VF "/" is the
    physical card, whose index MLU_VISIBLE_DEVICES takes) and, on the next row, its memory."""
    devices = []
    lines = text.splitlines()
    for number, line in enumerate(lines):
        if (m := _CNMON_CARD.match(line)) and m[2] == "/":
            below = lines[number + 1] if number + 1 < len(lines) else ""
            memory = _CNMON_MEMORY.search(below)
            devices.append(Device("cambricon", int(m[1]), m[3], memory_mib=int(memory[1]) if memory else 0))
    return devices


# --- discovery


def run_tool(path: str, args: tuple[str, ...], *, timeout_s: float = TOOL_TIMEOUT_S) -> str | None:
    """The tool's standard output, or None (logged) when it fails, hangs or cannot start."""
    try:
        done = subprocess.run(  # noqa: S603 - a program found on the PATH, constant arguments
            [path, *args], capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        log.warning("%s did not answer within %g s", path, timeout_s)
        return None
    except OSError as exc:
        log.warning("%s could not be started: %s", path, exc)
        return None
    if done.returncode != 0:
        log.warning("%s exited with %s: %s", path, done.returncode, (done.stdout + done.stderr).strip()[:200])
        return None
    return done.stdout


def detect_gpus(nvidia_smi: str = "nvidia-smi") -> list[int]:
    """Indexes of this machine's GPUs: NVML's count, or where NVML cannot start, `nvidia-smi -L`'s
    GPUs; [] when neither is there (or nvidia-smi fails or hangs)."""
    from clusters.backends.local.gpus import gpu_indexes_nvml  # the telemetry helper, kept apart

    indexes = gpu_indexes_nvml()
    if indexes is not None:
        return indexes
    path = shutil.which(nvidia_smi)
    listed = run_tool(path, ("-L",)) if path else None
    return [] if listed is None else [index for index, _ in parse_nvidia_smi_list(listed)]


# The vendors' tools other than nvidia-smi: (vendor, program, arguments, parser).
VENDOR_TOOLS = (
    ("amd", "rocm-smi", ("--showproductname", "--showmeminfo", "vram", "--json"), parse_rocm_smi_devices),
    (
        "hygon",
        "hy-smi",
        ("--showproductname", "--showmeminfo", "vram", "--json"),
        functools.partial(parse_rocm_smi_devices, vendor="hygon"),
    ),
    ("huawei", "npu-smi", ("info", "-m"), parse_npu_smi_devices),
    ("cambricon", "cnmon", (), parse_cnmon_devices),
)


def discover(nvidia_smi: str) -> Machine:
    """This machine's accelerators, from the tools on the PATH now: asked once per process for
    each set of tools, since devices (and MIG layouts, which need the GPU idle to change) do not
    come and go while a worker lives."""
    tools = tuple(shutil.which(program) for _vendor, program, _args, _parse in VENDOR_TOOLS)
    return _discover(shutil.which(nvidia_smi), tools)


@functools.cache
def _discover(nvidia_smi: str | None, tools: tuple[str | None, ...]) -> Machine:
    gpus, migs = _nvidia(nvidia_smi)
    devices = list(gpus)
    paths = {vendor: path for (vendor, *_rest), path in zip(VENDOR_TOOLS, tools, strict=True)}
    for vendor, _program, args, parse in VENDOR_TOOLS:
        if (path := paths[vendor]) is None or (vendor == "amd" and paths["hygon"] is not None):
            continue  # a Hygon host's rocm-smi is Hygon's own: hy-smi says it all
        if (text := run_tool(path, args)) is None:
            continue
        try:
            devices += parse(text)
        except BackendError as exc:
            log.warning("%s: %s", path, exc)
    return Machine(tuple(devices), tuple(migs))


def _nvidia(nvidia_smi: str | None) -> tuple[list[Device], list[MigDevice]]:
    from clusters.backends.local.gpus import gpu_indexes_nvml, read_gpus  # telemetry, kept apart

    listed = run_tool(nvidia_smi, ("-L",)) if nvidia_smi else None
    if listed is not None:
        gpus, migs = parse_nvidia_smi_devices(listed)
    else:
        gpus, migs = [Device("nvidia", index) for index in gpu_indexes_nvml() or []], []
    if not gpus:
        return [], []
    try:
        readings = read_gpus(nvidia_smi or "nvidia-smi")
    except BackendError as exc:  # memory unknown: such GPUs take whole jobs and MIG jobs only
        log.warning("the GPUs' memory could not be read: %s", exc)
        readings = []
    memory = {reading.index: int(reading.memory_total_mib or 0) for reading in readings}
    return [replace(gpu, memory_mib=memory.get(gpu.index, 0)) for gpu in gpus], migs
