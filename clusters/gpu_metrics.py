"""GPU utilization as machines and exporters report it: nvidia-smi's CSV queries, and the
Prometheus text exposition of NVIDIA's DCGM exporter, matched to the scheduler's jobs.

Plain data in and out; no model is imported. The only I/O is fetch_metrics (one HTTP GET).
Output that cannot be read raises GpuMetricsError naming the line, so that a caller (the idle-GPU
sweep) reports the one cluster and goes on with the others.

What the DCGM matching relies on (dcgm-exporter's own label names):

- the value: `DCGM_FI_DEV_GPU_UTIL` (percent); for a device that has none (a MIG instance),
  `DCGM_FI_PROF_GR_ENGINE_ACTIVE` (a ratio, ×100). DCGM's "blank" sentinels (about 9.2e18) and
  NaN mean "no value" and are dropped, as is anything outside 0–100 %.
- one device: the `Hostname`, the `UUID` (else `gpu`, the index) and, for a MIG instance,
  `GPU_I_ID`; a series repeated for the same device (two jobs mapped to one GPU) counts once.
- Slurm: the `hpc_job` label, which the exporter sets only where the site runs it with the HPC
  job mapping (`--hpc-job-mapping-dir`, filled by a Slurm prolog); it must equal the job id that
  sbatch returned (the portal's backend id).
- Kubernetes (backend id `<namespace>/<Job name>`): `namespace` and `pod` as the exporter's pod
  mapping sets them (`pod_namespace`/`pod_name` with its old label names; `exported_namespace`/
  `exported_pod`, preferred, where a Prometheus scrape renamed them); the pod is the Job's
  when it is named `<Job name>-<suffix>`, as the Job controller names its pods.
"""

from __future__ import annotations

import math
import re
import urllib.error
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from clusters.backends.base import GpuSample


class GpuMetricsError(ValueError):
    """Output that could not be read, or a metrics URL that did not answer; the message says which."""


# --- nvidia-smi

# The queries the local backend runs, exactly as the H200 fixtures were captured (see
# tests/fixtures/nvidia-smi/h200/README.md); the columns of each row follow these fields.
QUERY_GPU_FIELDS = (
    "index", "uuid", "name", "memory.total", "memory.used", "utilization.gpu", "utilization.memory",
    "temperature.gpu", "power.draw", "clocks.sm", "ecc.mode.current",
)  # fmt: skip
QUERY_GPU_ARGS = (f"--query-gpu={','.join(QUERY_GPU_FIELDS)}", "--format=csv,noheader,nounits")
COMPUTE_APPS_FIELDS = ("pid", "gpu_uuid", "used_memory", "process_name")
QUERY_COMPUTE_APPS_ARGS = (
    f"--query-compute-apps={','.join(COMPUTE_APPS_FIELDS)}",
    "--format=csv,noheader,nounits",
)

# What nvidia-smi writes where it has no value: [N/A] for the utilization of a GPU in MIG mode
# (its instances have none either), [Not Supported] on boards or drivers without the counter.
_NO_VALUE = re.compile(
    r"^\[?(N/A|Not Supported|Unknown Error|Insufficient Permissions|GPU is lost)\]?$", re.I
)


@dataclass(frozen=True)
class GpuReading:
    """One GPU in `nvidia-smi --query-gpu` output; None where nvidia-smi had no value."""

    index: int
    uuid: str
    name: str
    utilization_pct: float | None
    memory_used_mib: float | None
    memory_total_mib: float | None


@dataclass(frozen=True)
class ComputeApp:
    """One process in `nvidia-smi --query-compute-apps` output."""

    pid: int
    gpu_uuid: str
    used_memory_mib: float | None
    process_name: str


def _number(value: str, what: str, line_no: int) -> float | None:
    if _NO_VALUE.match(value):
        return None
    try:
        number = float(value)
    except ValueError:
        raise GpuMetricsError(f"nvidia-smi line {line_no}: {what} is not a number: {value[:40]!r}") from None
    if not math.isfinite(number):
        raise GpuMetricsError(f"nvidia-smi line {line_no}: {what} is not finite: {value[:40]!r}")
    return number


def _rows(text: str, columns: int, what: str) -> Iterable[tuple[int, list[str]]]:
    """The rows of a `csv,noheader,nounits` answer. nvidia-smi does not quote: it joins values
    with ", ", so only the last column (a process name) may itself hold a comma."""
    for line_no, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        cells = [cell.strip() for cell in line.split(",", columns - 1)]
        if len(cells) != columns:
            raise GpuMetricsError(
                f"nvidia-smi {what} line {line_no}: {len(cells)} columns, expected {columns}: {line[:120]!r}"
            )
        yield line_no, cells


def parse_query_gpu(text: str) -> list[GpuReading]:
    """The GPUs in the output of `nvidia-smi` with QUERY_GPU_ARGS, in its order."""
    readings = []
    for line_no, cells in _rows(text, len(QUERY_GPU_FIELDS), "--query-gpu"):
        row = dict(zip(QUERY_GPU_FIELDS, cells, strict=True))
        if not row["index"].isdigit():
            raise GpuMetricsError(f"nvidia-smi line {line_no}: GPU index {row['index'][:20]!r}")
        readings.append(
            GpuReading(
                index=int(row["index"]),
                uuid=row["uuid"],
                name=row["name"],
                utilization_pct=_number(row["utilization.gpu"], "utilization.gpu", line_no),
                memory_used_mib=_number(row["memory.used"], "memory.used", line_no),
                memory_total_mib=_number(row["memory.total"], "memory.total", line_no),
            )
        )
    return readings


def parse_compute_apps(text: str) -> list[ComputeApp]:
    """The processes in the output of `nvidia-smi` with QUERY_COMPUTE_APPS_ARGS."""
    apps = []
    for line_no, (pid, uuid, used, name) in _rows(text, len(COMPUTE_APPS_FIELDS), "--query-compute-apps"):
        if not pid.isdigit():
            raise GpuMetricsError(f"nvidia-smi line {line_no}: pid {pid[:20]!r}")
        apps.append(ComputeApp(int(pid), uuid, _number(used, "used_memory", line_no), name))
    return apps


def samples_by_index(held: dict[str, list[int]], readings: list[GpuReading]) -> dict[str, GpuSample]:
    """A sample for each job (backend id → the GPU indices it holds) whose every GPU nvidia-smi
    reported with a utilization; a job with a GPU unknown or without a value is left out."""
    by_index = {reading.index: reading.utilization_pct for reading in readings}
    samples = {}
    for backend_id, indices in held.items():
        values = [by_index.get(index) for index in indices]
        if values and None not in values:
            samples[backend_id] = GpuSample(backend_id, len(values), min(values), max(values))
    return samples


# --- Prometheus text exposition (format 0.0.4; OpenMetrics text reads the same for gauges)

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\\n]|\\.)*)"\s*(,|(?=\}))')
_VALUE = re.compile(
    r"[+-]?(?:[0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?|Inf|NaN)", re.I
)
_TIMESTAMP = re.compile(r"-?[0-9]+(?:\.[0-9]+)?")
_UNESCAPE = re.compile(r"\\(.)")


@dataclass(frozen=True)
class Series:
    """One sample line: a metric name, its labels and its value."""

    name: str
    labels: dict[str, str]
    value: float


def _unescape(value: str) -> str:
    return _UNESCAPE.sub(lambda m: "\n" if m[1] == "n" else m[1], value)


def _parse_line(line: str) -> Series:
    """One sample line; ValueError with the reason if it is not one."""
    name = _METRIC_NAME.match(line)
    if name is None:
        raise ValueError("no metric name")
    pos, labels = name.end(), {}
    if line[pos : pos + 1] == "{":
        pos += 1
        while not line[pos:].lstrip().startswith("}"):
            label = _LABEL.match(line, pos)
            if label is None:
                raise ValueError(f"bad label at column {pos + 1}")
            labels[label[1]] = _unescape(label[2])
            pos = label.end()
        pos = line.index("}", pos) + 1
    rest = line[pos:].split()
    if not 1 <= len(rest) <= 2 or (pos < len(line) and line[pos] not in " \t"):
        raise ValueError("expected a value, and at most a timestamp, after the name and labels")
    if not _VALUE.fullmatch(rest[0]):
        raise ValueError(f"value {rest[0][:40]!r} is not a number")
    if len(rest) == 2 and not _TIMESTAMP.fullmatch(rest[1]):
        raise ValueError(f"timestamp {rest[1][:40]!r} is not a number")
    return Series(name[0], labels, float(rest[0]))


def parse_prometheus_text(text: str, *, names: Iterable[str] | None = None) -> list[Series]:
    """The samples in a text exposition (of those metrics only, when `names` is given). A line
    that is not a comment, a blank or a sample makes the whole answer unreadable, as it does for
    Prometheus: GpuMetricsError with its line number."""
    wanted = None if names is None else frozenset(names)
    series = []
    for line_no, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        try:
            sample = _parse_line(line)
        except ValueError as exc:
            raise GpuMetricsError(f"metrics line {line_no}: {exc}: {line[:120]!r}") from None
        if wanted is None or sample.name in wanted:
            series.append(sample)
    return series


# --- DCGM exporter

DCGM_UTIL = "DCGM_FI_DEV_GPU_UTIL"  # percent
DCGM_ENGINE_ACTIVE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"  # ratio; what MIG instances report
DCGM_METRICS = (DCGM_UTIL, DCGM_ENGINE_ACTIVE)
# exported_* first: Prometheus renames the exporter's label so when its own target label (the
# exporter pod's namespace and name) takes the plain name.
_NAMESPACE_LABELS = ("exported_namespace", "namespace", "pod_namespace")
_POD_LABELS = ("exported_pod", "pod", "pod_name")


def _first(labels: dict[str, str], names: tuple[str, ...]) -> str:
    return next((labels[name] for name in names if labels.get(name)), "")


def backend_ids_named(labels: dict[str, str]) -> list[str]:
    """The backend ids a series' (or an alert's) labels may name, most likely first: the Slurm
    job id of `hpc_job`, or `<namespace>/<Job name>` for the pod that `namespace`/`pod` name.
    The Job controller names pods "<job>-<5 chars>" (an indexed Job "<job>-<index>-<5 chars>"):
    the pod's name with one, then two, trailing parts cut off."""
    if hpc_job := labels.get("hpc_job"):
        return [hpc_job]
    namespace, pod = _first(labels, _NAMESPACE_LABELS), _first(labels, _POD_LABELS)
    if not namespace or not pod:
        return []
    names = dict.fromkeys((pod.rsplit("-", 1)[0], pod.rsplit("-", 2)[0], pod))
    return [f"{namespace}/{name}" for name in names]


def _owner(labels: dict[str, str], wanted: set[str]) -> str | None:
    """The backend id of the job that the series' labels name, if it is one of those asked for."""
    return next((backend_id for backend_id in backend_ids_named(labels) if backend_id in wanted), None)


def dcgm_job_samples(series: Iterable[Series], backend_ids: Iterable[str]) -> dict[str, GpuSample]:
    """A sample for each asked-for job that the exporter's labels name (see the module's
    docstring); jobs it does not name are left out. A backend id with a "/" is a Kubernetes one
    (namespace/Job name); any other is a Slurm job id."""
    wanted = set(backend_ids)
    # job → device → {metric: percent}; a device is one GPU, or one MIG instance of it.
    found: dict[str, dict[tuple[str, str, str], dict[str, float]]] = {}
    for sample in series:
        if sample.name not in DCGM_METRICS:
            continue
        pct = sample.value * 100 if sample.name == DCGM_ENGINE_ACTIVE else sample.value
        if not 0 <= pct <= 100:  # NaN and DCGM's blank sentinels (~9.2e18) included
            continue
        owner = _owner(sample.labels, wanted)
        if owner is None:
            continue
        labels = sample.labels
        device = (
            labels.get("Hostname", ""),
            labels.get("UUID") or labels.get("gpu", ""),
            labels.get("GPU_I_ID", ""),
        )
        found.setdefault(owner, {}).setdefault(device, {})[sample.name] = pct
    samples = {}
    for backend_id, devices in found.items():
        values = [metrics.get(DCGM_UTIL, metrics.get(DCGM_ENGINE_ACTIVE)) for metrics in devices.values()]
        samples[backend_id] = GpuSample(backend_id, len(values), min(values), max(values))
    return samples


def fetch_metrics(url: str, *, timeout_s: float = 10.0, max_bytes: int = 32 << 20) -> str:
    """The text a Prometheus or DCGM exporter URL answers (an exporter's /metrics, or a
    Prometheus's /federate?match[]=DCGM_FI_DEV_GPU_UTIL for a cluster of many nodes).
    GpuMetricsError when it cannot be read within timeout_s, or answers more than max_bytes."""
    shown = _without_credentials(url)[:100]  # what a message may say of the URL
    if urlsplit(url).scheme not in ("http", "https"):
        raise GpuMetricsError(f"metrics URL {shown!r} is not http(s)")
    request = urllib.request.Request(url, headers={"Accept": "text/plain;version=0.0.4"})  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310 - http(s) only
            body = response.read(max_bytes + 1)
    except (urllib.error.URLError, OSError, ValueError) as exc:  # HTTPError and timeouts included
        raise GpuMetricsError(f"metrics URL {shown!r}: {exc}") from None
    if len(body) > max_bytes:
        raise GpuMetricsError(f"metrics URL {shown!r} answered more than {max_bytes} bytes")
    return body.decode("utf-8", errors="replace")


def _without_credentials(url: str) -> str:
    """The URL without a user:password@ part, for messages and logs."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return parts._replace(netloc=host).geturl()
