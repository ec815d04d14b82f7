"""The portal on a real GPU machine, end to end, with the embedded default (SQLite, Celery on
kombu's filesystem broker, the local cluster): the local cluster finds the GPUs through NVML, a
job of the ai-training `python` template trains a PyTorch model on one GPU, and the portal's own
beat task reads its GPUs every GPU_SAMPLE_INTERVAL_S while the run also reads NVML once a second
on its own, for comparison. Writes OUT/h200-run.json (the fixture tests/fixtures/h200-run/ keeps)
and prints the figures of docs/monitoring-h200.md.

Run on the lent H200 machine (see docs/monitoring-h200.md for the exact command):
    python3 bench/gpu_h200_run.py --out "$OUT" [--train-seconds 90]

The job's working directory is its own folder on the local cluster, made when the cluster
accepts it. So that train.py is there before it starts, a process submitted to the local cluster
directly (not through the portal: the portal would rightly hold its job back until the GPU is
free) holds the GPU for a while; the portal's job waits in the cluster's queue for the GPU, and
this script writes train.py into its folder meanwhile, as a user's files would be there.
Every loop here is bounded; all traffic goes to 127.0.0.1.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.procs import stop_all  # noqa: E402 - once ROOT is on the path (run as a script)

PORT = 8642
BASE = f"http://127.0.0.1:{PORT}"

TRAIN = '''\
"""A small transformer language model trained on random tokens in bf16: real kernels, real memory.
After a few steps it takes more of the GPU's memory, as a larger batch would, up to --memory-pct
of the card (so that the memory alert's threshold is crossed by a real run)."""
import argparse, time
import torch

parser = argparse.ArgumentParser()
parser.add_argument("--seconds", type=float, default=90)
parser.add_argument("--memory-pct", type=float, default=93)
args = parser.parse_args()
device = torch.device("cuda")
print("device", torch.cuda.get_device_name(device), flush=True)
layer = torch.nn.TransformerEncoderLayer(d_model=2048, nhead=16, dim_feedforward=8192, batch_first=True)
model = torch.nn.Sequential(torch.nn.Embedding(32000, 2048), torch.nn.TransformerEncoder(layer, 8),
                            torch.nn.Linear(2048, 32000)).to(device=device, dtype=torch.bfloat16)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
start, step, ballast = time.monotonic(), 0, None
while time.monotonic() - start < args.seconds:
    tokens = torch.randint(0, 32000, (16, 512), device=device)
    logits = model(tokens)
    loss = torch.nn.functional.cross_entropy(logits.float().view(-1, 32000), tokens.view(-1))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    step += 1
    if step == 20 and ballast is None:
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info()
        size = max(0, int(free - total * (1 - args.memory_pct / 100)))
        ballast = torch.empty(size, dtype=torch.uint8, device=device)
        print(f"holding {size / 2**30:.1f} GiB more: {100 * (1 - torch.cuda.mem_get_info()[0] / total):.1f}% used", flush=True)
    if step % 50 == 0:
        torch.cuda.synchronize()
        print(f"step {step} loss {loss.item():.3f} t {time.monotonic() - start:.0f}s", flush=True)
torch.cuda.synchronize()
print(f"done: {step} steps in {time.monotonic() - start:.1f}s; peak {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB", flush=True)
'''


def api(path: str, token: str = "", body: dict | None = None) -> dict | list:
    request = urllib.request.Request(BASE + path, method="POST" if body is not None else "GET")
    request.add_header("Accept", "application/json")
    if token:
        request.add_header("Authorization", f"Token {token}")
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        request.add_header("Content-Type", "application/json")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, data=data, timeout=30) as response:
            return json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        raise SystemExit(f"{path}: HTTP {exc.code}: {exc.read()[:500]!r}") from None


def wait(what: str, check, timeout_s: float, interval_s: float = 1.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(interval_s)
    raise SystemExit(f"timed out waiting for {what}")


def nvml_reading() -> dict:
    import pynvml

    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
        return {
            "t": round(time.time(), 2),
            "utilization_pct": pynvml.nvmlDeviceGetUtilizationRates(handle).gpu,
            "memory_used_mib": round(memory.used / 2**20, 1),
            "memory_total_mib": round(memory.total / 2**20, 1),
            "temperature_c": pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU),
            "power_w": round(pynvml.nvmlDeviceGetPowerUsage(handle) / 1000, 1),
        }
    finally:
        pynvml.nvmlShutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--train-seconds", type=float, default=90)
    parser.add_argument("--idle-seconds", type=float, default=35)
    parser.add_argument(
        "--rehearse",
        action="store_true",
        help="on a machine without a GPU: one pretend GPU, and a train.py that sleeps",
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    var = Path(tempfile.mkdtemp(prefix="portal-h200-"))
    env = os.environ | {
        "VAR_DIR": str(var),
        "LOCAL_CLUSTER_GPUS": "1" if args.rehearse else "0",  # 0: as many as NVML finds
        "GPU_SAMPLE_INTERVAL_S": "10",
        "LOG_LEVEL": "WARNING",
        "PROMETHEUS_MULTIPROC_DIR": str(var / "metrics"),
        "DJANGO_SETTINGS_MODULE": "portal.settings",
    }
    (var / "metrics").mkdir()
    os.environ.update(env)
    run = [sys.executable, "manage.py"]
    subprocess.run([*run, "migrate", "--noinput", "-v0"], cwd=ROOT, env=env, check=True)
    subprocess.run([*run, "demo_data"], cwd=ROOT, env=env, check=True, capture_output=True)

    import django

    django.setup()
    from clusters.backends.local.devices import detect_gpus
    from clusters.backends.local.gpus import gpu_indexes_nvml, read_gpus
    from clusters.gpu_metrics import QUERY_GPU_ARGS
    from clusters.models import Cluster, Partition
    from jobs.models import Job, JobGpuSample

    nvml_gpus = gpu_indexes_nvml()
    gpus = detect_gpus()
    print(f"GPUs found through NVML: {nvml_gpus}; the local cluster's: {gpus}")
    print("read_gpus:", read_gpus("nvidia-smi"))
    if args.rehearse:
        gpus = [0]
    else:
        assert nvml_gpus, "NVML found no GPU"
    Cluster.objects.filter(slug="local").update(local_gpus=1 if args.rehearse else 0)
    Partition.objects.filter(cluster__slug="local").update(gpus_per_node=len(gpus))

    logs = {name: open(args.out / f"{name}.log", "w") for name in ("gunicorn", "worker", "beat")}  # noqa: SIM115
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "portal.wsgi", "--bind", f"127.0.0.1:{PORT}", "--workers", "2"],
            cwd=ROOT, env=env, stdout=logs["gunicorn"], stderr=subprocess.STDOUT,
        ),
        subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "portal", "worker", "--concurrency", "2", "--loglevel", "INFO"],
            cwd=ROOT, env=env, stdout=logs["worker"], stderr=subprocess.STDOUT,
        ),
        subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "portal", "beat", "--loglevel", "INFO",
             "--schedule", str(var / "beat-schedule")],
            cwd=ROOT, env=env, stdout=logs["beat"], stderr=subprocess.STDOUT,
        ),
    ]  # fmt: skip
    nvml: list[dict] = []
    try:
        wait("the portal", lambda: _answers(BASE + "/healthz"), 60)
        password = json.loads((var / "demo-logins.txt").read_text())["carol"]
        token = api("/api/v1/auth/token/", body={"username": "carol", "password": password, "name": "h200"})[
            "token"
        ]
        common = {
            "tenant": "protein-lab", "scenario": "ai-training", "gpu_model": "h100-80gb", "gpus": 1,
            "walltime_minutes": 30, "cluster": "local",
        }  # fmt: skip
        from clusters.backends.base import JobSpec
        from clusters.services import backend_of

        hold = JobSpec(
            token="holdthegpu0000000000000000000000"[:32], name="hold-gpu", account="protein-lab",
            qos="portal-normal", priority="normal", partition="local", gpu_type="local", k8s_resource="",
            k8s_product="", gpus_per_node=1, nodes=1, walltime_minutes=10,
            script=f"#!/bin/bash\nsleep {args.idle_seconds:g}\n", env={},
        )  # fmt: skip
        print("holding the GPU:", backend_of(Cluster.objects.get(slug="local")).submit(hold))
        train = api(
            "/api/v1/jobs/", token,
            {**common, "name": "train-lm", "template": "python",
             "parameters": {"script": "train.py", "args": ["--seconds", f"{args.train_seconds:g}"]}},
        )  # fmt: skip
        print("submitted", train["id"])
        job = Job.objects.get(pk=train["id"])

        def folder() -> Path | None:
            found = [p for p in var.rglob(job.token) if p.is_dir() and (p / ".portal").is_dir()]
            return found[0] if found else None

        job_dir = wait("the training job's folder", folder, 120)
        (job_dir / "train.py").write_text("import time; time.sleep(20)\n" if args.rehearse else TRAIN)
        print("train.py written to", job_dir)

        def ended(job_id: int) -> bool:
            return api(f"/api/v1/jobs/{job_id}/", token)["state"] in {
                "COMPLETED",
                "FAILED",
                "CANCELLED",
                "TIMEOUT",
                "REJECTED",
            }

        smi_busy = ""  # nvidia-smi's own query while the job trains, beside NVML's
        deadline = time.monotonic() + args.idle_seconds + args.train_seconds + 240
        while time.monotonic() < deadline and not ended(train["id"]):
            if not args.rehearse:
                nvml.append(nvml_reading())
                busy = (
                    nvml[-1]["utilization_pct"] >= 90
                    and nvml[-1]["memory_used_mib"] > 0.85 * nvml[-1]["memory_total_mib"]
                )
                if busy and not smi_busy and (smi := shutil.which("nvidia-smi")):
                    smi_busy = subprocess.run(
                        [smi, *QUERY_GPU_ARGS], capture_output=True, text=True, check=False
                    ).stdout
            time.sleep(1)
        answers = {
            key: {
                "job": api(f"/api/v1/jobs/{job_id}/", token),
                "events": api(f"/api/v1/jobs/{job_id}/events/", token),
                "gpu_samples": api(f"/api/v1/jobs/{job_id}/gpu-samples/", token),
                "log": api(f"/api/v1/jobs/{job_id}/log/?tail=40", token),
            }
            for key, job_id in (("train", train["id"]),)
        }
        smi = shutil.which("nvidia-smi")
        query = subprocess.run([smi, "--query-gpu=index,uuid,name,memory.total", "--format=csv,noheader"],
                               capture_output=True, text=True, check=False).stdout if smi else ""  # fmt: skip
        capture = {"gpu": query.strip(), "nvml_gpus": nvml_gpus, "nvml_1s": nvml, "portal": answers}
        capture["query_gpu_training"] = smi_busy
        (args.out / "h200-run.json").write_text(json.dumps(capture, indent=1))
        rows = JobGpuSample.objects.filter(job_id=train["id"])
        print("train job:", answers["train"]["job"]["state"], "exit", answers["train"]["job"]["exit_code"])
        print("log tail:", *answers["train"]["log"]["lines"][-5:], sep="\n  ")
        _figures("portal readings of the training job", answers["train"]["gpu_samples"])
        _figures("NVML every second (whole run)", nvml)
        print("rows:", rows.count())
    finally:
        stop_all(procs, timeout_s=20)


def _answers(url: str) -> bool:
    try:
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url, timeout=5) as response:
            return response.status == 200
    except OSError:
        return False


def _figures(title: str, rows: list[dict]) -> None:
    if not rows:
        print(f"{title}: none")
        return

    def pct(row: dict) -> float | None:
        if row.get("memory_used_pct") is not None:
            return row["memory_used_pct"]
        return 100 * row["memory_used_mib"] / row["memory_total_mib"] if row.get("memory_total_mib") else None

    util = [r["utilization_pct"] for r in rows]
    mem = [p for r in rows if (p := pct(r)) is not None]
    temp = [r["temperature_c"] for r in rows if r.get("temperature_c") is not None]
    power = [r["power_w"] for r in rows if r.get("power_w") is not None]
    print(
        f"{title}: {len(rows)} readings; utilization mean {sum(util) / len(util):.0f}% max {max(util):.0f}%; "
        f"memory max {max(mem, default=0):.1f}%; temperature {min(temp, default=0):.0f}–{max(temp, default=0):.0f} °C; "
        f"power {min(power, default=0):.0f}–{max(power, default=0):.0f} W"
    )


if __name__ == "__main__":
    main()
