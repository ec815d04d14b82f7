"""What the fake Kubernetes API server's own tests share (tests/k8s_apiserver/): its nodes and
token, the official client on it, and bodies of jobs and pods."""

from __future__ import annotations

import json
from types import SimpleNamespace

from kubernetes import client

from tests.k8s_apiserver import FakeApiServer
from tests.wait_support import wait_until

TOKEN = "t0k"
NODES = [
    {"name": "cpu-1", "labels": {"node-role": "cpu"}},
    {
        "name": "gpu-1",
        "labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
        "capacity": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "8"},
        "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
    },
]
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def api_server():
    with FakeApiServer(token=TOKEN, nodes=NODES) as server:
        yield server
        assert server.cluster.errors == []


def k8s_client(api):
    config = client.Configuration(
        host=api.url, api_key={"authorization": TOKEN}, api_key_prefix={"authorization": "Bearer"}
    )
    with client.ApiClient(config) as api_client:
        yield SimpleNamespace(
            core=client.CoreV1Api(api_client),
            batch=client.BatchV1Api(api_client),
            custom=client.CustomObjectsApi(api_client),
            scheduling=client.SchedulingV1Api(api_client),
            networking=client.NetworkingV1Api(api_client),
        )


def team_namespace(k8s):
    k8s.core.create_namespace({"metadata": {"name": "team-a"}})
    return "team-a"


def wait_for(probe, timeout_s: float = 10.0, what: str = "condition"):
    """wait_until, every 50 ms: the fake's controller and kubelet are quick."""
    return wait_until(probe, timeout_s=timeout_s, interval_s=0.05, what=what)


def job_body(name: str, script: str, *, env=None, resources=None, annotations=None, **spec) -> dict:
    container = {"name": "main", "image": "ignored:latest", "command": ["/bin/bash", "-c", script]}
    container |= {"env": env} if env else {}
    container |= {"resources": resources} if resources else {}
    template = {
        "metadata": {"annotations": annotations or {}},
        "spec": {"restartPolicy": "Never", "containers": [container]},
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {"app": "portal"}},
        "spec": {"backoffLimit": 0, "template": template} | spec,
    }


def pod_body(name: str, script: str, *, annotations=None, limits=None, **spec) -> dict:
    container = {"name": "c", "image": "x", "command": ["/bin/bash", "-c", script]}
    container |= {"resources": {"limits": limits}} if limits else {}
    metadata = {"name": name, "annotations": annotations or {}}
    return {"metadata": metadata, "spec": {"restartPolicy": "Never", "containers": [container]} | spec}


def job_condition(k8s, ns: str, name: str):
    conditions = k8s.batch.read_namespaced_job(name, ns).status.conditions or []
    return next((c for c in conditions if c.type in ("Complete", "Failed") and c.status == "True"), None)


def job_pods(k8s, ns: str, name: str):
    return k8s.core.list_namespaced_pod(ns, label_selector=f"batch.kubernetes.io/job-name={name}").items


def status_of(exc: client.ApiException) -> dict:
    body = json.loads(exc.body)
    assert body["kind"] == "Status" and body["apiVersion"] == "v1" and body["status"] == "Failure"
    assert body["code"] == exc.status
    return body


def alive(pid: int) -> bool:
    """Whether the process runs; an exited one that its (new) parent has not reaped yet counts as gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
