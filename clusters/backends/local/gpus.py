"""The local cluster's GPU telemetry: one nvidia-smi query for all of this machine's GPUs."""

from __future__ import annotations

import logging
import shutil
import subprocess

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


def read_gpus(nvidia_smi: str, *, timeout_s: float = NVIDIA_SMI_TIMEOUT_S) -> list[GpuReading]:
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
    """A sample per job (backend id → the GPU indexes it holds) from one nvidia-smi call; {} when
    no job is asked about, without starting nvidia-smi."""
    return samples_by_index(held, read_gpus(nvidia_smi)) if held else {}
