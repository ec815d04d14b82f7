"""The Kubernetes backend's state mapping and its plumbing (paths, connection, errors), as pure
functions: no API server."""

from __future__ import annotations

import json
import socket
from datetime import UTC, datetime

import pytest
from kubernetes.client.exceptions import ApiException

from clusters.backends import base
from clusters.backends.base import BackendError, BackendUnavailable
from clusters.backends.kubernetes import KubernetesBackend
from clusters.backends.kubernetes.backend import contains, overlay, path
from clusters.backends.kubernetes.client import connection, translate
from clusters.backends.kubernetes.states import job_status, needs_events, needs_pods
from tests.k8s_support import TOKEN, make_config

# ---------------------------------------------------------------- states --
T0, T1, T2 = "2025-01-01T10:00:00Z", "2025-01-01T10:05:00Z", "2025-01-01T11:00:00Z"


def k8s_job(status: dict | None = None, **extra) -> dict:
    job = {
        "metadata": {"name": f"pj-{TOKEN}", "namespace": "protein-lab", "labels": {}},
        "spec": {"completions": 1},
        "status": status or {},
    }
    job["metadata"] |= extra.pop("metadata", {})
    job["spec"] |= extra.pop("spec", {})
    return job


def condition(kind: str, reason: str = "", when: str = T2) -> dict:
    return {"type": kind, "status": "True", "reason": reason, "lastTransitionTime": when}


def pod(
    phase: str, *, reason: str = "", terminated: dict | None = None, conditions=(), node="gpu-1", waiting=""
) -> dict:
    state = {"terminated": {"startedAt": T1, "finishedAt": T2, **terminated}} if terminated else {}
    if phase == "Running":
        state = {"running": {"startedAt": T1}}
    if waiting:
        state = {"waiting": {"reason": waiting}}
    return {
        "metadata": {"name": "p", "namespace": "protein-lab", "labels": {"gpu-portal/token": TOKEN}},
        "spec": {"nodeName": node},
        "status": {
            "phase": phase,
            "reason": reason,
            "conditions": list(conditions),
            "containerStatuses": [{"name": "job", "state": state}] if state else [],
        },
    }


def test_complete():
    job = k8s_job(
        {"conditions": [condition("Complete")], "startTime": T0, "completionTime": T2, "succeeded": 1}
    )
    status = job_status(job, [pod("Succeeded", terminated={"exitCode": 0, "reason": "Completed"})])
    assert (status.state, status.raw_state, status.exit_code) == (base.JobState.COMPLETED, "Complete", 0)
    assert status.backend_id == f"protein-lab/pj-{TOKEN}"
    assert status.started_at == datetime(2025, 1, 1, 10, 5, tzinfo=UTC)
    assert status.finished_at == datetime(2025, 1, 1, 11, 0, tzinfo=UTC)
    assert status.node_list == "gpu-1"
    assert not needs_pods(job)


def test_failed_with_exit_code():
    job = k8s_job({"conditions": [condition("Failed", "BackoffLimitExceeded")], "failed": 1})
    status = job_status(job, [pod("Failed", terminated={"exitCode": 3, "reason": "Error"})])
    assert (status.state, status.raw_state, status.reason, status.exit_code) == (
        base.JobState.FAILED,
        "BackoffLimitExceeded",
        "Error",
        3,
    )
    assert status.finished_at == datetime(2025, 1, 1, 11, 0, tzinfo=UTC)


def test_deadline_exceeded_is_timeout():
    job = k8s_job({"conditions": [condition("Failed", "DeadlineExceeded")], "startTime": T0})
    status = job_status(job, [pod("Failed", terminated={"exitCode": 137, "reason": "Error"})])
    assert (status.state, status.raw_state, status.reason) == (
        base.JobState.TIMEOUT,
        "DeadlineExceeded",
        "DeadlineExceeded",
    )


def test_oom_killed_is_out_of_memory():
    job = k8s_job({"conditions": [condition("Failed", "BackoffLimitExceeded")]})
    status = job_status(job, [pod("Failed", terminated={"exitCode": 137, "reason": "OOMKilled"})])
    assert (status.state, status.reason, status.exit_code) == (base.JobState.OUT_OF_MEMORY, "OOMKilled", 137)
    assert status.raw_state == "BackoffLimitExceeded"


@pytest.mark.parametrize(
    "failed_pod",
    [
        pod("Failed", conditions=[condition("DisruptionTarget", "PreemptionByScheduler")]),
        pod("Failed", conditions=[condition("DisruptionTarget", "EvictionByEvictionAPI")]),
        pod("Failed", reason="Evicted"),
        pod("Failed", reason="PreemptionByScheduler"),
    ],
)
def test_preemption(failed_pod):
    job = k8s_job({"conditions": [condition("Failed", "BackoffLimitExceeded")]})
    status = job_status(job, [failed_pod])
    assert status.state == base.JobState.PREEMPTED
    assert status.reason in ("PreemptionByScheduler", "EvictionByEvictionAPI", "Evicted")


@pytest.mark.parametrize(
    "failed_pod",
    [
        pod("Failed", reason="NodeLost"),
        pod("Failed", reason="NodeAffinity"),
        pod("Failed", conditions=[condition("DisruptionTarget", "DeletionByPodGC")]),
        pod("Failed", conditions=[condition("DisruptionTarget", "DeletionByTaintManager")]),
    ],
)
def test_node_failure(failed_pod):
    job = k8s_job({"conditions": [condition("Failed", "BackoffLimitExceeded")]})
    assert job_status(job, [failed_pod]).state == base.JobState.NODE_FAIL


def test_worst_pod_decides_for_several():
    job = k8s_job({"conditions": [condition("Failed", "BackoffLimitExceeded")]})
    pods = [
        pod("Failed", terminated={"exitCode": 1, "reason": "Error"}, node="gpu-1"),
        pod("Failed", reason="NodeLost", node="gpu-2"),
    ]
    status = job_status(job, pods)
    assert status.state == base.JobState.NODE_FAIL and status.node_list == "gpu-1,gpu-2"


def test_no_pods_because_of_quota_is_pending():
    job = k8s_job({"startTime": T0})
    event = {
        "metadata": {"name": "e", "creationTimestamp": T1},
        "involvedObject": {"kind": "Job", "name": f"pj-{TOKEN}", "namespace": "protein-lab"},
        "reason": "FailedCreate",
        "message": 'Error creating: pods "pj-x-abcde" is forbidden: exceeded quota: gpu-portal, '
        "requested: requests.nvidia.com/gpu=4, used: requests.nvidia.com/gpu=8, limited: requests.nvidia.com/gpu=8",
        "lastTimestamp": T1,
    }
    assert needs_events(job, [])
    status = job_status(job, [], [event])
    assert (status.state, status.reason, status.raw_state) == (
        base.JobState.PENDING,
        "ExceededQuota",
        "FailedCreate",
    )
    other = dict(event, message="Error creating: pods is forbidden: violates PodSecurity")
    assert job_status(job, [], [other]).reason.startswith("Error creating")
    assert job_status(job, [], []).state == base.JobState.PENDING


def test_running_pending_suspended_and_deleted():
    running = job_status(k8s_job({"active": 1, "startTime": T0}), [pod("Running")])
    assert (running.state, running.started_at) == (
        base.JobState.RUNNING,
        datetime(2025, 1, 1, 10, 5, tzinfo=UTC),
    )
    unschedulable = pod(
        "Pending", conditions=[{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]
    )
    assert job_status(k8s_job({"active": 1}), [unschedulable]).reason == "Unschedulable"
    assert (
        job_status(k8s_job({"active": 1}), [pod("Pending", waiting="ImagePullBackOff")]).reason
        == "ImagePullBackOff"
    )
    suspended = job_status(k8s_job(spec={"suspend": True}))
    assert (suspended.state, suspended.raw_state) == (base.JobState.PENDING, "Suspended")
    deleted = job_status(k8s_job({"active": 1}, metadata={"deletionTimestamp": T2}), [pod("Running")])
    assert (deleted.state, deleted.raw_state) == (base.JobState.CANCELLED, "Deleting")
    done_then_deleted = k8s_job({"conditions": [condition("Complete")]}, metadata={"deletionTimestamp": T2})
    assert job_status(done_then_deleted).state == base.JobState.COMPLETED


# ---------------------------------------------------------- plumbing (pure) --
def test_paths():
    assert path("batch/v1", "jobs") == "/apis/batch/v1/jobs"
    assert path("batch/v1", "jobs", "ns", "pj-x") == "/apis/batch/v1/namespaces/ns/jobs/pj-x"
    assert path("v1", "namespaces", "", "ns") == "/api/v1/namespaces/ns"


def test_contains_and_overlay():
    current = {
        "metadata": {"name": "q", "labels": {"other": "1"}, "resourceVersion": "7"},
        "spec": {"hard": {"requests.nvidia.com/gpu": "8"}, "scopes": None},
    }
    desired = {
        "metadata": {"name": "q", "labels": {"a": "b"}},
        "spec": {"hard": {"requests.nvidia.com/gpu": "8"}},
    }
    assert not contains(current, desired)
    merged = overlay(current, desired)
    assert merged["metadata"]["labels"] == {"other": "1", "a": "b"}
    assert merged["metadata"]["resourceVersion"] == "7"
    assert contains(merged, desired)
    assert contains({"spec": {}}, {"spec": {"podSelector": {}}})
    assert not contains({"value": 1}, {"value": 2})


def test_connection_settings_and_secrets():
    config = make_config(k8s_ca_cert="-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    conn = connection(config)
    assert conn.host == "https://k8s.example.org:6443" and conn.token == "secret-token-value"
    assert "secret-token-value" not in repr(conn) and "secret-token-value" not in repr(config)
    with pytest.raises(BackendError):
        connection(make_config(k8s_api_url="http://k8s.example.org"))  # a token in clear
    assert connection(make_config(k8s_api_url="http://127.0.0.1:8080")).host == "http://127.0.0.1:8080"
    with pytest.raises(BackendError):
        connection(make_config(k8s_token=""))
    exec_kubeconfig = """
apiVersion: v1
kind: Config
current-context: c
contexts: [{name: c, context: {cluster: k, user: u}}]
clusters: [{name: k, cluster: {server: "https://k8s.example.org"}}]
users: [{name: u, user: {exec: {command: /bin/sh, args: ["-c", "id"]}}}]
"""
    with pytest.raises(BackendError, match="exec"):
        connection(make_config(kubeconfig=exec_kubeconfig))
    token_kubeconfig = exec_kubeconfig.replace(
        '{exec: {command: /bin/sh, args: ["-c", "id"]}}', "{token: from-kubeconfig}"
    )
    assert connection(make_config(kubeconfig=token_kubeconfig)).token == "from-kubeconfig"


def test_error_translation():
    def api_error(code: int, message: str) -> ApiException:
        return ApiException(status=code, reason="x", body=json.dumps({"kind": "Status", "message": message}))

    assert type(translate(api_error(401, "Unauthorized"), "list Jobs")) is BackendUnavailable
    rbac = translate(
        api_error(403, 'jobs.batch is forbidden: User "sa" cannot create resource "jobs"'), "create Job"
    )
    assert type(rbac) is BackendError and "RBAC" in str(rbac) and "cannot create" in str(rbac)
    assert type(translate(api_error(403, "exceeded quota: gpu-portal"), "create Job")) is BackendUnavailable
    assert type(translate(api_error(503, "etcd"), "x")) is BackendUnavailable
    assert type(translate(api_error(422, "invalid"), "x")) is BackendError
    assert type(translate(ConnectionRefusedError(111, "refused"), "x")) is BackendUnavailable


def test_unreachable_api_server_is_unavailable():
    """A port nothing listens on: BackendUnavailable quickly, and health says so."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    backend = KubernetesBackend(
        make_config(slug="nowhere", k8s_api_url=f"http://127.0.0.1:{port}"),
        connect_timeout_s=1,
        request_timeout_s=1,
    )
    with pytest.raises(BackendUnavailable):
        backend.poll([f"protein-lab/pj-{TOKEN}"])
    health = backend.health()
    assert not health.healthy and "secret-token-value" not in health.detail
