"""GPU telemetry as machines and exporters report it, matched to the scheduler's jobs: nvidia-smi's
CSV queries, NVIDIA's DCGM exporter read through a Prometheus server's query API (PromQL) or, for
a cluster without one, its text exposition (read by prometheus_client's parser).

Plain data in and out; no model is imported. The only I/O is fetch_metrics and query_prometheus
(one HTTP GET each). Output that cannot be read raises GpuMetricsError saying where, so that a
caller (the GPU sampler, the idle-GPU sweep) reports the one cluster and goes on with the others.

A job's sample (clusters.backends.base.GpuSample) sums or spans its GPUs: utilization lowest,
highest and mean; framebuffer used and total (used + free) summed; the hottest GPU's
temperature; power summed; the highest XID error code any of them reports (0: none; through
Prometheus only an XID new in the last XID_WINDOW, from an exposition DCGM's last one, which it
keeps until the next). A figure that not every GPU read reports is None rather than a sum over
some of them.

What the DCGM matching relies on (dcgm-exporter's own field and label names):

- the fields (DCGM_FIELDS): `DCGM_FI_DEV_GPU_UTIL` (percent; for a device that has none, a MIG
  instance, `DCGM_FI_PROF_GR_ENGINE_ACTIVE`, a ratio, ×100), `DCGM_FI_DEV_FB_USED` and
  `DCGM_FI_DEV_FB_FREE` (MiB), `DCGM_FI_DEV_GPU_TEMP` (°C), `DCGM_FI_DEV_POWER_USAGE` (W) and
  `DCGM_FI_DEV_XID_ERRORS` (the last XID's code). DCGM's "blank" sentinels (about 9.2e18) and
  NaN mean "no value" and are dropped, as is a value outside the field's range. A device
  counts as one of the job's GPUs when it reports a utilization.
- Through Prometheus, the series must carry the label `cluster="<the cluster's slug>"`: the
  example scrape job in deploy/prometheus/prometheus.yml sets it, so that one Prometheus may
  serve several clusters whose Slurm job ids overlap.
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

import http.client
import json
import math
import re
import urllib.error
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlencode, urlsplit

from prometheus_client.parser import text_string_to_metric_families

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
    temperature_c: float | None = None
    power_w: float | None = None
    xid: int | None = None  # the last XID error's code (0: none); nvidia-smi's query has none


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
                temperature_c=_number(row["temperature.gpu"], "temperature.gpu", line_no),
                power_w=_number(row["power.draw"], "power.draw", line_no),
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


def job_sample(backend_id: str, readings: list[GpuReading]) -> GpuSample:
    """One job's sample over its GPUs' readings, each with a utilization (the module's docstring
    says how each figure is summed or spanned)."""
    utilization = [reading.utilization_pct or 0.0 for reading in readings]

    def every(values: list) -> list | None:
        return None if None in values else values

    used = every([reading.memory_used_mib for reading in readings])
    total = every([reading.memory_total_mib for reading in readings])
    temperature = every([reading.temperature_c for reading in readings])
    power = every([reading.power_w for reading in readings])
    xid = [reading.xid for reading in readings if reading.xid is not None]
    return GpuSample(
        backend_id,
        gpus=len(readings),
        min_pct=min(utilization),
        max_pct=max(utilization),
        mean_pct=round(sum(utilization) / len(utilization), 2),
        memory_used_mib=sum(used) if used else None,
        memory_total_mib=sum(total) if total else None,
        temperature_c=max(temperature) if temperature else None,
        power_w=round(sum(power), 2) if power else None,
        xid=max(xid) if xid else None,
    )


def samples_by_index(held: dict[str, list[int]], readings: list[GpuReading]) -> dict[str, GpuSample]:
    """A sample for each job (backend id → the GPU indices it holds) whose every GPU was
    reported with a utilization; a job with a GPU unknown or without a value is left out."""
    by_index = {reading.index: reading for reading in readings}
    samples = {}
    for backend_id, indices in held.items():
        mine = [by_index.get(index) for index in indices]
        if mine and all(reading is not None and reading.utilization_pct is not None for reading in mine):
            samples[backend_id] = job_sample(backend_id, mine)
    return samples


# --- Prometheus text exposition, read by prometheus_client's parser


@dataclass(frozen=True)
class Series:
    """One sample: a metric name, its labels and its value."""

    name: str
    labels: dict[str, str]
    value: float


def parse_prometheus_text(text: str, *, names: Iterable[str] | None = None) -> list[Series]:
    """The samples in a text exposition (of those metrics only, when `names` is given). An answer
    that prometheus_client's parser refuses is unreadable as a whole, as it is for Prometheus:
    GpuMetricsError naming the first line the parser refuses."""
    wanted = None if names is None else frozenset(names)
    try:
        samples = [sample for family in text_string_to_metric_families(text) for sample in family.samples]
    except ValueError:
        raise GpuMetricsError(_first_refused_line(text)) from None
    return [
        Series(sample.name, dict(sample.labels), float(sample.value))
        for sample in samples
        if wanted is None or sample.name in wanted
    ]


def _first_refused_line(text: str) -> str:
    """Where the parser stops, said by reading again one line at a time (only once it failed)."""
    for line_no, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        try:
            list(text_string_to_metric_families(line + "\n"))
        except ValueError as exc:
            return f"metrics line {line_no}: {exc}: {line[:120]!r}"
    return "metrics: the exposition is not valid as a whole"


# --- DCGM exporter

DCGM_UTIL = "DCGM_FI_DEV_GPU_UTIL"  # percent
DCGM_ENGINE_ACTIVE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"  # ratio; what MIG instances report
DCGM_FB_USED = "DCGM_FI_DEV_FB_USED"  # MiB
DCGM_FB_FREE = "DCGM_FI_DEV_FB_FREE"  # MiB
DCGM_TEMP = "DCGM_FI_DEV_GPU_TEMP"  # °C
DCGM_POWER = "DCGM_FI_DEV_POWER_USAGE"  # W
DCGM_XID = "DCGM_FI_DEV_XID_ERRORS"  # the last XID error's code
# Each field read, with the range outside which a value is DCGM's blank sentinel or nonsense.
DCGM_FIELDS: dict[str, tuple[float, float]] = {
    DCGM_UTIL: (0, 100),
    DCGM_ENGINE_ACTIVE: (0, 1),
    DCGM_FB_USED: (0, 1 << 30),
    DCGM_FB_FREE: (0, 1 << 30),
    DCGM_TEMP: (0, 200),
    DCGM_POWER: (0, 100_000),
    DCGM_XID: (0, 1 << 20),
}
DCGM_METRICS = tuple(DCGM_FIELDS)  # the names to read from an exposition
XID_WINDOW = "5m"  # through Prometheus, an XID counts this long after it changed
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


def dcgm_job_samples(
    series: Iterable[Series], backend_ids: Iterable[str], *, xid_absent: int | None = None
) -> dict[str, GpuSample]:
    """A sample for each asked-for job that the exporter's labels name (see the module's
    docstring); jobs it does not name, or none of whose devices reports a utilization, are left
    out. A backend id with a "/" is a Kubernetes one (namespace/Job name); any other is a Slurm
    job id. `xid_absent`: a device's XID where no XID series came (dcgm_promql's answer has one
    only for a new XID, so 0 there)."""
    wanted = set(backend_ids)
    # job → device → {field: value}; a device is one GPU, or one MIG instance of it.
    found: dict[str, dict[tuple[str, str, str], dict[str, float]]] = {}
    for sample in series:
        bounds = DCGM_FIELDS.get(sample.name)
        if bounds is None or not bounds[0] <= sample.value <= bounds[1]:  # NaN and blanks included
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
        found.setdefault(owner, {}).setdefault(device, {})[sample.name] = sample.value
    samples = {}
    for backend_id, devices in found.items():
        readings = [reading for fields in devices.values() if (reading := _dcgm_reading(fields, xid_absent))]
        if readings:
            samples[backend_id] = job_sample(backend_id, readings)
    return samples


def _dcgm_reading(fields: dict[str, float], xid_absent: int | None) -> GpuReading | None:
    """One device's fields as a reading; None for a device without a utilization."""
    if DCGM_UTIL in fields:
        utilization = fields[DCGM_UTIL]
    elif DCGM_ENGINE_ACTIVE in fields:
        utilization = fields[DCGM_ENGINE_ACTIVE] * 100
    else:
        return None
    used, free = fields.get(DCGM_FB_USED), fields.get(DCGM_FB_FREE)
    return GpuReading(
        index=0,
        uuid="",
        name="",
        utilization_pct=utilization,
        memory_used_mib=used,
        memory_total_mib=used + free if used is not None and free is not None else None,
        temperature_c=fields.get(DCGM_TEMP),
        power_w=fields.get(DCGM_POWER),
        xid=int(fields[DCGM_XID]) if DCGM_XID in fields else xid_absent,
    )


def dcgm_promql(cluster_label: str) -> tuple[str, str]:
    """The two instant queries that read every DCGM field of a cluster's GPUs: the fields, and the
    XIDs. DCGM keeps a GPU's last XID until the next one, so an XID counts only where it changed
    in the last XID_WINDOW (as the GpuXidError rule has it): an error from before a job started
    is not that job's. Two queries, since `or` would drop each XID series beside the other fields'
    (set operators match label sets without the metric's name)."""
    cluster = f'cluster="{_promql_string(cluster_label)}"'
    names = "|".join(name for name in DCGM_FIELDS if name != DCGM_XID)  # plain [A-Z_] names
    xid = f"{DCGM_XID}{{{cluster}}}"
    return f'{{__name__=~"{names}",{cluster}}}', f"{xid} and changes({xid}[{XID_WINDOW}]) > 0"


def _promql_string(value: str) -> str:
    """A value for inside PromQL's double quotes (Go's string escapes)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def query_prometheus(base_url: str, promql: str, *, timeout_s: float = 10.0) -> list[Series]:
    """The instant vector a Prometheus server's query API (GET /api/v1/query) answers for
    `promql`; each series' `__name__` becomes its name. GpuMetricsError when the server cannot be
    read, refuses the query or answers anything but a vector."""
    url = f"{base_url.rstrip('/')}/api/v1/query?{urlencode({'query': promql})}"
    shown = _without_credentials(base_url)[:100]
    body = _get(
        url, shown=shown, accept="application/json", timeout_s=timeout_s, max_bytes=64 << 20, error_json=True
    )
    unreadable = f"Prometheus {shown!r} answered something that is not its query API's JSON"
    try:
        answer = json.loads(body)
        status, data = answer.get("status"), answer.get("data") or {}
    except (ValueError, AttributeError):
        raise GpuMetricsError(unreadable) from None
    if status != "success":
        why = f"{answer.get('errorType')}: {answer.get('error')}"[:300]
        raise GpuMetricsError(f"Prometheus {shown!r} refused the query: {why}")
    if data.get("resultType") != "vector":
        raise GpuMetricsError(f"Prometheus {shown!r} answered a {data.get('resultType')!s:.20}, not a vector")
    series = []
    try:
        for item in data["result"]:
            labels = {str(key): str(value) for key, value in item["metric"].items()}
            series.append(Series(labels.pop("__name__", ""), labels, float(item["value"][1])))
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        raise GpuMetricsError(unreadable) from None
    return series


def fetch_metrics(url: str, *, timeout_s: float = 10.0, max_bytes: int = 32 << 20) -> str:
    """The text a Prometheus or DCGM exporter URL answers (an exporter's /metrics, or a
    Prometheus's /federate?match[]=DCGM_FI_DEV_GPU_UTIL for a cluster of many nodes).
    GpuMetricsError when it cannot be read within timeout_s, or answers more than max_bytes."""
    shown = _without_credentials(url)[:100]  # what a message may say of the URL
    return _get(url, shown=shown, accept="text/plain;version=0.0.4", timeout_s=timeout_s, max_bytes=max_bytes)


def _get(
    url: str, *, shown: str, accept: str, timeout_s: float, max_bytes: int, error_json: bool = False
) -> str:
    """The body a URL answers. An HTTP error raises GpuMetricsError with its status, except, with
    error_json, one whose body is JSON (Prometheus's API says why it refused a query that way)."""
    if urlsplit(url).scheme not in ("http", "https"):
        raise GpuMetricsError(f"metrics URL {shown!r} is not http(s)")
    request = urllib.request.Request(url, headers={"Accept": accept})  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310 - http(s) only
            body = response.read(max_bytes + 1)
    except urllib.error.HTTPError as exc:
        detail = exc.read(4000).decode("utf-8", errors="replace")
        if error_json and exc.headers.get_content_type() == "application/json":
            return detail
        raise GpuMetricsError(f"metrics URL {shown!r}: HTTP {exc.code}: {detail[:200]}") from None
    except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as exc:  # timeouts too
        # Said by its kind alone: the text of some (InvalidURL) quotes the URL, credentials and all.
        raise GpuMetricsError(f"metrics URL {shown!r}: {_reason(exc)}") from None
    if len(body) > max_bytes:
        raise GpuMetricsError(f"metrics URL {shown!r} answered more than {max_bytes} bytes")
    return body.decode("utf-8", errors="replace")


def _reason(exc: Exception) -> str:
    """Why a request failed, without the URL: the OS's or socket's reason, else the error's kind."""
    reason = getattr(exc, "reason", None)
    if isinstance(reason, OSError | TimeoutError):
        return f"{type(reason).__name__}: {reason.strerror or reason}"
    if isinstance(exc, OSError) and exc.strerror:
        return f"{type(exc).__name__}: {exc.strerror}"
    if isinstance(exc, TimeoutError):
        return "timed out"
    return type(exc).__name__


def _without_credentials(url: str) -> str:
    """The URL without a user:password@ part, for messages and logs."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return parts._replace(netloc=host).geturl()
