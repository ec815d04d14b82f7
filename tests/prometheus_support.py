"""Prometheus and Alertmanager as a deployment runs them, for tests: Debian's real `prometheus` and
`prometheus-alertmanager`, each on a free loopback port and a data folder of the test's own, with
deploy/prometheus/'s configurations and rules, placeholders filled in; and a stand-in for NVIDIA's
DCGM exporter on a GPU node, which serves the exporter's text for the GPUs of a real nvidia-smi
capture and whose values a test changes while Prometheus scrapes it.

A test reads what Prometheus holds through its query API (`Prometheus.query`, `Prometheus.value`):
the GPU telemetry of a job (the exporter's series name it by `hpc_job`), the portal's own series.

`fast=True` (the default) makes the copies quick enough for a test, and changes only timings:
scrape and rule evaluation every second, Alertmanager's group_wait and group_interval one second,
and each rule's `for:` read in seconds rather than minutes (`for: 2m` becomes `for: 2s`);
`promtool test rules` proves the real durations (tests/monitoring/test_alert_rules.py).
Everything else (jobs, labels, the rules' expressions, the route, the receiver, its bearer
credentials_file, send_resolved) is the shipped text."""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import threading
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tests.conftest import ROOT, die_with_parent, free_port, stop
from tests.http_support import Answer, Request, loopback_server
from tests.wait_support import wait_until

PROM_DIR = ROOT / "deploy" / "prometheus"
RULES = PROM_DIR / "rules" / "portal.rules.yml"
H200_BUSY = ROOT / "tests" / "fixtures" / "nvidia-smi" / "h200" / "query-gpu-busy.csv"
H200_RUN = ROOT / "tests" / "fixtures" / "h200-run" / "h200-run.json"
# Where Prometheus is told to find a portal or an Alertmanager that the test does not run:
# nothing listens on port 1, so the scrape (or the send) fails at once, on loopback.
NOWHERE = "127.0.0.1:1"
START_TIMEOUT_S = 30
HTTP_TIMEOUT_S = 5
# Only loopback, and never through a proxy that the environment may name.
_LOOPBACK = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http_json(url: str) -> dict:
    """GET a loopback URL's JSON (Prometheus's and Alertmanager's APIs)."""
    assert url.startswith("http://127.0.0.1:"), url
    with _LOOPBACK.open(url, timeout=HTTP_TIMEOUT_S) as response:
        return json.loads(response.read())


def _ready(url: str) -> bool:
    try:
        with _LOOPBACK.open(url, timeout=HTTP_TIMEOUT_S) as response:
            return response.status == 200
    except OSError:
        return False


# --- The DCGM exporter stand-in


@dataclass
class Gpu:
    """One GPU as NVIDIA's dcgm-exporter reports it; `labels` are the exporter's others (Hostname,
    hpc_job of the job mapping)."""

    index: int
    uuid: str
    model: str
    memory_total_mib: float
    memory_used_mib: float
    util_pct: float
    temp_c: float
    power_w: float
    xid: int = 0
    labels: dict[str, str] = field(default_factory=dict)


def gpus_from_nvidia_smi(path: Path = H200_BUSY) -> list[Gpu]:
    """The GPUs of an `nvidia-smi --query-gpu=index,uuid,name,memory.total,memory.used,
    utilization.gpu,…,temperature.gpu,power.draw,… --format=csv,noheader,nounits` capture
    (tests/fixtures/nvidia-smi/h200/README.md)."""
    gpus = []
    for row in csv.reader(path.read_text().splitlines()):
        index, uuid, name, total, used, util, _util_mem, temp, power, *_ = (cell.strip() for cell in row)
        gpus.append(
            Gpu(index=int(index), uuid=uuid, model=name, memory_total_mib=float(total),
                memory_used_mib=float(used), util_pct=float(util), temp_c=float(temp), power_w=float(power))
        )  # fmt: skip
    return gpus


def gpu_of_the_h200_run(index: int) -> Gpu:
    """The real H200 run's GPU at its fullest moment (tests/fixtures/h200-run/): NVML's reading
    of the most memory used, while the ai-training job trained."""
    run = json.loads(H200_RUN.read_text())
    peak = max(run["nvml_1s"], key=lambda reading: (reading["memory_used_mib"], reading["utilization_pct"]))
    _index, uuid, model, _total = (cell.strip() for cell in run["gpu"].split(","))
    return Gpu(
        index=index, uuid=uuid, model=model, memory_total_mib=peak["memory_total_mib"],
        memory_used_mib=peak["memory_used_mib"], util_pct=peak["utilization_pct"],
        temp_c=peak["temperature_c"], power_w=peak["power_w"],
    )  # fmt: skip


# name → (HELP, value of a GPU): dcgm-exporter's default counters that the rules and the portal read.
DCGM_FIELDS = {
    "DCGM_FI_DEV_GPU_UTIL": ("GPU utilization (in %).", lambda gpu: gpu.util_pct),
    "DCGM_FI_DEV_FB_USED": ("Framebuffer memory used (in MiB).", lambda gpu: gpu.memory_used_mib),
    "DCGM_FI_DEV_FB_FREE": (
        "Framebuffer memory free (in MiB).",
        lambda gpu: gpu.memory_total_mib - gpu.memory_used_mib,
    ),
    "DCGM_FI_DEV_GPU_TEMP": ("GPU temperature (in C).", lambda gpu: gpu.temp_c),
    "DCGM_FI_DEV_POWER_USAGE": ("Power draw (in W).", lambda gpu: gpu.power_w),
    "DCGM_FI_DEV_XID_ERRORS": ("Value of the last XID error encountered.", lambda gpu: gpu.xid),
}


def _label_value(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


@dataclass
class DcgmExporter:
    """What the exporter serves now; `update` changes a GPU between two scrapes."""

    gpus: list[Gpu]
    address: str = ""  # host:port, a scrape target
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        return f"http://{self.address}/metrics"

    def update(self, index: int = 0, **values) -> None:
        """Set fields of GPU `index` (temp_c=86, xid=79, memory_used_mib=…)."""
        with self.lock:
            gpu = next(gpu for gpu in self.gpus if gpu.index == index)
            for name, value in values.items():
                assert hasattr(gpu, name), name
                setattr(gpu, name, value)

    def exposition(self) -> str:
        """The Prometheus text format, as dcgm-exporter writes it (gauges, its label names)."""
        lines = []
        with self.lock:
            for name, (help_text, read) in DCGM_FIELDS.items():
                lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
                for gpu in self.gpus:
                    labels = {"gpu": str(gpu.index), "UUID": gpu.uuid, "device": f"nvidia{gpu.index}",
                              "modelName": gpu.model, **gpu.labels}  # fmt: skip
                    text = ",".join(f'{key}="{_label_value(value)}"' for key, value in labels.items())
                    lines.append(f"{name}{{{text}}} {read(gpu):g}")
        return "\n".join(lines) + "\n"


@contextmanager
def dcgm_exporter(gpus: list[Gpu]) -> Iterator[DcgmExporter]:
    """The exporter on 127.0.0.1 (a port of its own), `GET /metrics`, until the block ends."""
    exporter = DcgmExporter(gpus=gpus)

    def answer(request: Request) -> Answer:
        if request.path != "/metrics":
            return 404, "text/plain", b"not found\n"
        return 200, "text/plain; version=0.0.4; charset=utf-8", exporter.exposition().encode()

    with loopback_server(answer) as address:
        exporter.address = address
        yield exporter


# --- The shipped configurations, filled in


def _swap(text: str, old: str, new: str, *, where: str) -> str:
    """Replace a line of the shipped text that must be there (a changed file fails, not drifts)."""
    assert old in text, f"{where} no longer holds {old!r}"
    return text.replace(old, new)


def config_filled(name: str, folder: Path, *, fast: bool = True, **values: str) -> Path:
    """deploy/prometheus/<name> with its @PLACEHOLDERS@ filled in, written to `folder`; with
    `fast`, the intervals of the module's docstring shortened."""
    text = (PROM_DIR / name).read_text()
    for key, value in values.items():
        text = text.replace(f"@{key}@", value)
    config = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    assert not re.search(r"@[A-Z_]+@", config), f"{name}: a placeholder left:\n{config}"
    if fast and name == "prometheus.yml":
        text = _swap(text, "scrape_interval: 15s", "scrape_interval: 1s", where=name)
        text = _swap(text, "evaluation_interval: 15s", "evaluation_interval: 1s", where=name)
    if fast and name == "alertmanager.yml":
        text = _swap(text, "group_wait: 30s", "group_wait: 1s", where=name)
        text = _swap(text, "group_interval: 5m", "group_interval: 1s", where=name)
    path = folder / name
    path.write_text(text)
    return path


def rules_copied(folder: Path, *, fast: bool = True) -> Path:
    """portal.rules.yml in `folder/rules/`; with `fast`, every `for: Nm` read as `for: Ns`."""
    text = RULES.read_text()
    if fast:
        text, count = re.subn(r"^(\s+for: )(\d+)m$", r"\1\2s", text, flags=re.MULTILINE)
        assert count, "no `for:` in minutes left to shorten"
        assert not re.search(r"^\s+for: \d+[hd]", text, flags=re.MULTILINE), "a `for:` not in minutes"
    path = folder / "rules" / RULES.name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def secret_file(path: Path, value: str) -> Path:
    """A token file for credentials_file (readable by its owner only)."""
    path.write_text(value)
    path.chmod(0o600)
    return path


# --- The servers


@dataclass
class Server:
    """A service process the test started: its base URL and log."""

    url: str
    proc: subprocess.Popen
    log: Path

    def log_tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:]


class Prometheus(Server):
    def query(self, expr: str) -> list[dict]:
        """An instant query's vector: [{"metric": {...}, "value": [time, "text"]}, …]."""
        answer = http_json(f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
        assert answer["status"] == "success", answer
        assert answer["data"]["resultType"] == "vector", answer
        return answer["data"]["result"]

    def value(self, expr: str) -> float | None:
        """The one sample an expression gives now, or None when it gives none."""
        result = self.query(expr)
        assert len(result) <= 1, f"{expr}: {len(result)} series"
        return float(result[0]["value"][1]) if result else None

    def wait_value(self, expr: str, accept, *, timeout_s: float = 20) -> float:
        """Poll `expr` until `accept(value)` holds; the value."""

        def accepted():
            found = self.value(expr)
            return (found,) if found is not None and accept(found) else None

        return wait_until(accepted, timeout_s=timeout_s, interval_s=0.25, what=f"Prometheus: {expr}")[0]

    def targets(self) -> list[dict]:
        return http_json(f"{self.url}/api/v1/targets")["data"]["activeTargets"]

    def alerts(self) -> list[dict]:
        """The rules' alerts, pending and firing."""
        return http_json(f"{self.url}/api/v1/alerts")["data"]["alerts"]


class Alertmanager(Server):
    def alerts(self) -> list[dict]:
        """The alerts it holds now (API v2)."""
        return http_json(f"{self.url}/api/v2/alerts")


def _binary(name: str) -> str:
    path = shutil.which(name)
    assert path, f"{name} is not installed (.ci/run installs it)"
    return path


@contextmanager
def _running(kind: type[Server], argv: list[str], folder: Path, port: int) -> Iterator[Server]:
    """Start a server, wait (bounded) until it says it is ready, stop it when the block ends."""
    log = folder / f"{Path(argv[0]).name}.log"
    env = {key: value for key, value in os.environ.items() if "proxy" not in key.lower()}
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, cwd=folder, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, preexec_fn=die_with_parent)  # fmt: skip
    server = kind(url=f"http://127.0.0.1:{port}", proc=proc, log=log)
    try:

        def ready():
            assert proc.poll() is None, f"{argv[0]} exited with {proc.returncode}:\n{server.log_tail()}"
            return _ready(f"{server.url}/-/ready")

        wait_until(ready, timeout_s=START_TIMEOUT_S, interval_s=0.1, what=f"{argv[0]} ready")
        yield server
    finally:
        stop(proc)


@contextmanager
def prometheus_server(
    folder: Path,
    *,
    dcgm: str,
    cluster: str,
    portal: str = NOWHERE,
    metrics_token: str = "",
    alertmanager: str = NOWHERE,
    fast: bool = True,
) -> Iterator[Prometheus]:
    """Prometheus with the shipped prometheus.yml and rules: it scrapes the portal at `portal`
    (host:port) with `metrics_token`, the DCGM exporter at `dcgm` as cluster `cluster`, and sends
    alerts to `alertmanager`. Its files and data in `folder` (made)."""
    folder.mkdir(parents=True, exist_ok=True)
    rules = rules_copied(folder, fast=fast)
    token = secret_file(folder / "metrics-token", metrics_token)
    config = config_filled(
        "prometheus.yml", folder, fast=fast, PORTAL=portal, TOKEN_FILE=str(token), DCGM=dcgm,
        CLUSTER=cluster, ALERTMANAGER=alertmanager, RULES=str(rules.parent),
    )  # fmt: skip
    port = free_port()
    argv = [
        _binary("prometheus"), f"--config.file={config}", f"--storage.tsdb.path={folder / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}", f"--web.external-url=http://127.0.0.1:{port}",
    ]  # fmt: skip
    with _running(Prometheus, argv, folder, port) as server:
        yield server


@contextmanager
def alertmanager_server(
    folder: Path, *, portal_url: str, token: str, fast: bool = True
) -> Iterator[Alertmanager]:
    """Alertmanager with the shipped alertmanager.yml: every alert to the portal's receiver at
    `portal_url`, with `token` (ALERTMANAGER_TOKEN). Alone: no cluster peers."""
    folder.mkdir(parents=True, exist_ok=True)
    token_file = secret_file(folder / "alertmanager-token", token)
    config = config_filled(
        "alertmanager.yml", folder, fast=fast, PORTAL_URL=portal_url, TOKEN_FILE=str(token_file)
    )
    port = free_port()
    argv = [
        _binary("prometheus-alertmanager"), f"--config.file={config}", f"--storage.path={folder / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}", f"--web.external-url=http://127.0.0.1:{port}",
        "--cluster.listen-address=",  # no gossip port: HA mode off
    ]  # fmt: skip
    with _running(Alertmanager, argv, folder, port) as server:
        yield server
