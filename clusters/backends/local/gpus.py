"""The local cluster's GPUs and their telemetry: NVML (nvidia-ml-py, the library nvidia-smi itself
reads) where the driver's libnvidia-ml is present, else one nvidia-smi query for all of this
machine's GPUs. Both give the same GpuReading per GPU, indexed as nvidia-smi indexes them (PCI bus
order, the order CUDA_VISIBLE_DEVICES is given in: launch.py sets CUDA_DEVICE_ORDER=PCI_BUS_ID)."""

from __future__ import annotations

import logging
import shutil
import subprocess
from collections.abc import Callable
from typing import Any

import pynvml

from clusters.backends.base import BackendError, BackendUnavailable, GpuSample
from clusters.gpu_metrics import (
    QUERY_GPU_ARGS,
    GpuMetricsError,
    GpuReading,
    parse_query_gpu,
    samples_by_index,
)

log = logging.getLogger(__name__)

NVIDIA_SMI_TIMEOUT_S = 15.0
_MIB = 1 << 20


def read_gpus(nvidia_smi: str, *, timeout_s: float = NVIDIA_SMI_TIMEOUT_S) -> list[GpuReading]:
    """This machine's GPUs now: through NVML, or where NVML cannot be loaded, nvidia-smi's."""
    readings = read_gpus_nvml()
    return readings if readings is not None else read_gpus_smi(nvidia_smi, timeout_s=timeout_s)


def read_gpus_nvml() -> list[GpuReading] | None:
    """Each GPU as NVML reports it; None where NVML cannot start (no libnvidia-ml: a machine
    without NVIDIA's driver, the demo), so that the caller asks nvidia-smi. A figure the GPU does
    not support (NVML_ERROR_NOT_SUPPORTED and the like) is None; XID errors come as events, not
    as a reading, and are left to the DCGM exporter."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        log.debug("NVML is not available: %s", exc)
        return None
    try:
        readings = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            memory = _nvml(pynvml.nvmlDeviceGetMemoryInfo, handle)
            power_mw = _nvml(pynvml.nvmlDeviceGetPowerUsage, handle)
            utilization = _nvml(pynvml.nvmlDeviceGetUtilizationRates, handle)
            readings.append(
                nvml_reading(
                    index,
                    uuid=_nvml(pynvml.nvmlDeviceGetUUID, handle) or "",
                    name=_nvml(pynvml.nvmlDeviceGetName, handle) or "",
                    utilization_pct=utilization.gpu if utilization is not None else None,
                    memory_used_bytes=memory.used if memory is not None else None,
                    memory_total_bytes=memory.total if memory is not None else None,
                    temperature_c=_nvml(pynvml.nvmlDeviceGetTemperature, handle, pynvml.NVML_TEMPERATURE_GPU),
                    power_mw=power_mw,
                )
            )
        return readings
    except pynvml.NVMLError as exc:  # the count or a handle: a GPU or driver in trouble
        raise BackendUnavailable(f"NVML: {exc}") from None
    finally:
        pynvml.nvmlShutdown()


def _nvml(call: Callable[..., Any], *args: Any) -> Any:
    """One NVML query; None where this GPU does not answer it (not supported, no permission)."""
    try:
        return call(*args)
    except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_NoPermission, pynvml.NVMLError_NoData):
        return None


def nvml_reading(
    index: int,
    *,
    uuid: str | bytes,
    name: str | bytes,
    utilization_pct: float | None,
    memory_used_bytes: int | None,
    memory_total_bytes: int | None,
    temperature_c: float | None,
    power_mw: float | None,
) -> GpuReading:
    """NVML's figures in nvidia-smi's units (MiB, W). Older pynvml releases answer bytes for text."""
    return GpuReading(
        index=index,
        uuid=uuid.decode() if isinstance(uuid, bytes) else uuid,
        name=name.decode() if isinstance(name, bytes) else name,
        utilization_pct=float(utilization_pct) if utilization_pct is not None else None,
        memory_used_mib=round(memory_used_bytes / _MIB, 1) if memory_used_bytes is not None else None,
        memory_total_mib=round(memory_total_bytes / _MIB, 1) if memory_total_bytes is not None else None,
        temperature_c=float(temperature_c) if temperature_c is not None else None,
        power_w=round(power_mw / 1000, 2) if power_mw is not None else None,
    )


def gpu_indexes_nvml() -> list[int] | None:
    """The indexes of this machine's GPUs through NVML; None where NVML cannot start."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        return list(range(pynvml.nvmlDeviceGetCount()))
    except pynvml.NVMLError as exc:
        log.warning("NVML could not count the GPUs: %s", exc)
        return None
    finally:
        pynvml.nvmlShutdown()


def read_gpus_smi(nvidia_smi: str, *, timeout_s: float = NVIDIA_SMI_TIMEOUT_S) -> list[GpuReading]:
    """This machine's GPUs as nvidia-smi reports them now, through a fixed argv (no shell).

    [] where nothing can be known: no nvidia-smi on the PATH (a machine without GPUs, the demo),
    or one that fails (no driver loaded, no device found). An nvidia-smi that hangs is a GPU or
    driver in trouble: BackendUnavailable, so that the caller retries later rather than read it
    as "no GPUs"."""
    path = shutil.which(nvidia_smi)
    if path is None:
        return []
    try:
        done = subprocess.run(  # noqa: S603 - a configured program and constant arguments
            [path, *QUERY_GPU_ARGS], capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        raise BackendUnavailable(f"nvidia-smi did not answer within {timeout_s:g} s") from None
    except OSError as exc:
        log.warning("nvidia-smi could not be started: %s", exc)
        return []
    if done.returncode != 0:
        log.warning(
            "nvidia-smi exited with %s: %s", done.returncode, (done.stdout + done.stderr).strip()[:200]
        )
        return []
    try:
        return parse_query_gpu(done.stdout)
    except GpuMetricsError as exc:
        raise BackendError(str(exc)) from None


def job_samples(held: dict[str, list[int]], nvidia_smi: str) -> dict[str, GpuSample]:
    """A sample per job (backend id → the GPU indexes it holds) from one reading of the GPUs; {}
    when no job is asked about, without reading them."""
    return samples_by_index(held, read_gpus(nvidia_smi)) if held else {}
