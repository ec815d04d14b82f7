"""The fake Kubernetes API server (tests/k8s_apiserver), driven by the official kubernetes client:
its API surface. What the Kubernetes backend's tests rely on: real status codes and Status bodies,
label/field selectors, patches and server-side apply."""

from __future__ import annotations

import pytest
from kubernetes import client

from tests.k8s_apiserver_support import TOKEN, job_body, job_condition, job_pods, status_of, wait_for


# ------------------------------------------------------------------------------------ API surface --
def test_version_readyz_and_bearer_auth(api, k8s):
    assert client.VersionApi(k8s.core.api_client).get_code().git_version == "v1.31.0"
    for config in (
        client.Configuration(host=api.url),
        client.Configuration(host=api.url, api_key={"authorization": "Bearer nope"}),
    ):
        with client.ApiClient(config) as anonymous, pytest.raises(client.ApiException) as caught:
            client.CoreV1Api(anonymous).list_namespaced_pod("default")
        assert caught.value.status == 401
        assert status_of(caught.value) == {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": "Unauthorized",
            "reason": "Unauthorized",
            "code": 401,
        }
    raw = k8s.core.api_client.rest_client.pool_manager.request(
        "GET", f"{api.url}/readyz", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    assert (raw.status, raw.data) == (200, b"ok")


def test_create_get_list_by_label_replace_patch_delete(api, k8s, ns):
    for name, labels in [("web", {"app": "a", "tier": "web"}), ("db", {"app": "a"}), ("cache", {"app": "b"})]:
        created = k8s.core.create_namespaced_service(
            ns, {"metadata": {"name": name, "labels": labels}, "spec": {"ports": [{"port": 80}]}}
        )
        assert (
            created.metadata.uid and created.metadata.namespace == ns and created.metadata.creation_timestamp
        )
    web = k8s.core.read_namespaced_service("web", ns)
    assert (web.kind, web.api_version, web.metadata.labels) == ("Service", "v1", {"app": "a", "tier": "web"})

    def names(**selectors):
        listed = k8s.core.list_namespaced_service(ns, **selectors)
        assert listed.kind == "ServiceList" and int(listed.metadata.resource_version) > 0
        return sorted(s.metadata.name for s in listed.items)

    assert names(label_selector="app=a") == ["db", "web"]
    assert names(label_selector="app!=a") == ["cache"]
    assert names(label_selector="tier") == ["web"]
    assert names(label_selector="app=a,!tier") == ["db"]
    assert names(label_selector="app==a,tier=web") == ["web"]
    assert names(field_selector="metadata.name=cache") == ["cache"]
    assert [
        s.metadata.name for s in k8s.core.list_service_for_all_namespaces(label_selector="app=b").items
    ] == ["cache"]

    web.metadata.labels["tier"] = "frontend"
    replaced = k8s.core.replace_namespaced_service("web", ns, web)
    assert replaced.metadata.labels["tier"] == "frontend"
    assert int(replaced.metadata.resource_version) > int(web.metadata.resource_version)
    web.metadata.labels["tier"] = "stale"  # replace with an old resourceVersion: 409 Conflict
    with pytest.raises(client.ApiException) as caught:
        k8s.core.replace_namespaced_service("web", ns, web)
    assert (caught.value.status, status_of(caught.value)["reason"]) == (409, "Conflict")

    patched = k8s.core.patch_namespaced_service(
        "db", ns, {"metadata": {"labels": {"app": None, "owner": "x"}}}
    )
    assert patched.metadata.labels == {"owner": "x"}  # strategic merge by default; null deletes
    merged = k8s.core.patch_namespaced_service(
        "db", ns, {"metadata": {"annotations": {"a": "1"}}}, _content_type="application/merge-patch+json"
    )
    assert merged.metadata.annotations == {"a": "1"} and merged.metadata.labels == {"owner": "x"}

    # DELETE of a service answers with the service (of a job, network policy...: a Status)
    assert k8s.core.delete_namespaced_service("cache", ns).metadata.name == "cache"
    with pytest.raises(client.ApiException) as caught:
        k8s.core.read_namespaced_service("cache", ns)
    assert caught.value.status == 404
    assert [o["metadata"]["name"] for o in api.objects("Service")] == ["db", "web"]


def test_server_side_apply_creates_merges_and_reports_conflicts(api, k8s, ns):
    apply = {"_content_type": "application/apply-patch+yaml"}
    body = job_body("sa", "true", suspend=True)
    created = k8s.batch.patch_namespaced_job("sa", ns, body, field_manager="gpu-portal", **apply)
    assert created.metadata.labels == {"app": "portal"} and created.spec.suspend is True
    assert api.requests[-1] == (
        "PATCH",
        f"/apis/batch/v1/namespaces/{ns}/jobs/sa",
        {"fieldManager": "gpu-portal"},
    )
    again = k8s.batch.patch_namespaced_job(
        "sa", ns, {"metadata": {"labels": {"team": "a"}}}, field_manager="gpu-portal", **apply
    )
    assert again.metadata.labels == {"app": "portal", "team": "a"}
    with pytest.raises(client.ApiException) as caught:  # another manager changing an owned field
        k8s.batch.patch_namespaced_job(
            "sa", ns, {"metadata": {"labels": {"team": "b"}}}, field_manager="other", **apply
        )
    conflict = status_of(caught.value)
    assert (caught.value.status, conflict["reason"]) == (409, "Conflict")
    assert (
        conflict["message"]
        == 'Apply failed with 1 conflict: conflict with "gpu-portal" using batch/v1: .metadata.labels.team'
    )
    forced = k8s.batch.patch_namespaced_job(
        "sa", ns, {"metadata": {"labels": {"team": "b"}}}, field_manager="other", force=True, **apply
    )
    assert forced.metadata.labels["team"] == "b"
    assert api.requests[-1][2] == {"fieldManager": "other", "force": "true"}
    with pytest.raises(client.ApiException) as caught:
        k8s.batch.patch_namespaced_job("sa", ns, {"metadata": {"labels": {"x": "y"}}}, **apply)
    assert (caught.value.status, status_of(caught.value)["reason"]) == (422, "Invalid")
    assert k8s.batch.list_namespaced_job(ns).items[0].status.active is None  # suspended: no pods
    assert job_pods(k8s, ns, "sa") == []


def test_errors_are_kubernetes_status_objects(k8s, ns):
    k8s.batch.create_namespaced_job(ns, job_body("dup", "true"))
    cases = [
        (
            lambda: k8s.batch.create_namespaced_job(ns, job_body("dup", "true")),
            409,
            "AlreadyExists",
            'jobs.batch "dup" already exists',
            {"name": "dup", "group": "batch", "kind": "jobs"},
        ),
        (
            lambda: k8s.batch.read_namespaced_job("nope", ns),
            404,
            "NotFound",
            'jobs.batch "nope" not found',
            {"name": "nope", "group": "batch", "kind": "jobs"},
        ),
        (
            lambda: k8s.core.read_namespaced_pod("nope", ns),
            404,
            "NotFound",
            'pods "nope" not found',
            {"name": "nope", "kind": "pods"},
        ),
        (
            lambda: k8s.batch.create_namespaced_job("missing-ns", job_body("j", "true")),
            404,
            "NotFound",
            'namespaces "missing-ns" not found',
            {"name": "missing-ns", "kind": "namespaces"},
        ),
    ]
    for call, code, reason, message, details in cases:
        with pytest.raises(client.ApiException) as caught:
            call()
        body = status_of(caught.value)
        assert (caught.value.status, body["reason"], body["message"], body["details"]) == (
            code,
            reason,
            message,
            details,
        )
    with pytest.raises(client.ApiException) as caught:
        k8s.batch.create_namespaced_job(ns, job_body("Bad_Name", "true"))
    body = status_of(caught.value)
    assert (caught.value.status, body["reason"], body["details"]["kind"]) == (422, "Invalid", "Job")
    assert body["message"].startswith(
        'Job.batch "Bad_Name" is invalid: metadata.name: Invalid value: "Bad_Name": '
        "a lowercase RFC 1123 subdomain must consist of"
    )
    with pytest.raises(client.ApiException) as caught:
        k8s.core.create_namespace({"metadata": {"name": "a.b"}})  # namespaces are DNS-1123 labels
    assert "a lowercase RFC 1123 label must consist of" in status_of(caught.value)["message"]


def test_all_namespace_lists_and_a_poll_is_one_list_call(api, k8s, ns):
    k8s.core.create_namespace({"metadata": {"name": "team-b"}})
    for namespace in (ns, "team-b"):
        k8s.batch.create_namespaced_job(namespace, job_body("j", "echo hi"))
    wait_for(lambda: all(job_condition(k8s, n, "j") for n in (ns, "team-b")), what="both jobs finished")
    before = len(api.requests)
    jobs = k8s.batch.list_job_for_all_namespaces(label_selector="app=portal").items
    assert sorted(j.metadata.namespace for j in jobs) == [ns, "team-b"]
    assert api.requests[before:] == [("GET", "/apis/batch/v1/jobs", {"labelSelector": "app=portal"})]
    pods = k8s.core.list_pod_for_all_namespaces(
        label_selector="job-name=j", field_selector="status.phase=Succeeded"
    )
    assert len(pods.items) == 2 and api.requests[-1][1] == "/api/v1/pods"
    page = k8s.core.list_pod_for_all_namespaces(limit=1)
    assert len(page.items) == 1 and page.metadata._continue
    assert len(k8s.core.list_pod_for_all_namespaces(limit=1, _continue=page.metadata._continue).items) == 1


def test_other_resources_the_backend_manages(k8s, ns):
    k8s.core.create_namespaced_resource_quota(
        ns, {"metadata": {"name": "q"}, "spec": {"hard": {"requests.cpu": "4"}}}
    )
    k8s.core.create_namespaced_limit_range(
        ns, {"metadata": {"name": "lr"}, "spec": {"limits": [{"type": "Container"}]}}
    )
    k8s.scheduling.create_priority_class({"metadata": {"name": "high"}, "value": 1000})
    k8s.networking.create_namespaced_network_policy(
        ns, {"metadata": {"name": "deny"}, "spec": {"podSelector": {}}}
    )
    queue = {
        "apiVersion": "kueue.x-k8s.io/v1beta1",
        "kind": "LocalQueue",
        "metadata": {"name": "lq", "labels": {"t": "a"}},
        "spec": {"clusterQueue": "cq"},
    }
    kueue = ("kueue.x-k8s.io", "v1beta1", ns, "localqueues")
    assert k8s.custom.create_namespaced_custom_object(*kueue, queue)["metadata"]["uid"]
    listed = k8s.custom.list_namespaced_custom_object(*kueue, label_selector="t=a")
    assert listed["kind"] == "LocalQueueList" and [q["spec"]["clusterQueue"] for q in listed["items"]] == [
        "cq"
    ]
    assert k8s.custom.get_namespaced_custom_object(*kueue, "lq")["kind"] == "LocalQueue"
    k8s.custom.patch_namespaced_custom_object(*kueue, "lq", {"metadata": {"labels": {"t": "b"}}})
    with pytest.raises(client.ApiException) as immutable:  # Kueue's CRD: self == oldSelf
        k8s.custom.patch_namespaced_custom_object(*kueue, "lq", {"spec": {"clusterQueue": "cq2"}})
    assert (immutable.value.status, status_of(immutable.value)["message"]) == (
        422,
        'LocalQueue.kueue.x-k8s.io "lq" is invalid: spec.clusterQueue: Invalid value: "string": '
        "field is immutable",
    )
    assert k8s.custom.get_namespaced_custom_object(*kueue, "lq")["spec"]["clusterQueue"] == "cq"
    assert k8s.scheduling.read_priority_class("high").value == 1000
    assert wait_for(lambda: k8s.core.read_namespaced_resource_quota("q", ns).status).used == {
        "requests.cpu": "0"
    }
    nodes = {n.metadata.name: n for n in k8s.core.list_node().items}
    assert nodes["gpu-1"].status.allocatable["nvidia.com/gpu"] == "8"
    assert nodes["gpu-1"].metadata.labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert k8s.networking.delete_namespaced_network_policy("deny", ns)["status"] == "Success"
    k8s.custom.delete_namespaced_custom_object(*kueue, "lq")
    assert k8s.custom.list_namespaced_custom_object(*kueue)["items"] == []


def test_claims_cluster_queues_and_flavors_are_stored(k8s, ns):
    claim = {
        "metadata": {"name": "scratch"},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "10Gi"}}},
    }
    k8s.core.create_namespaced_persistent_volume_claim(ns, claim)
    stored = k8s.core.read_namespaced_persistent_volume_claim("scratch", ns)
    assert (stored.status.phase, stored.status.capacity, stored.spec.volume_mode) == (
        "Bound",
        {"storage": "10Gi"},
        "Filesystem",
    )
    assert [c.metadata.name for c in k8s.core.list_namespaced_persistent_volume_claim(ns).items] == [
        "scratch"
    ]
    kueue = ("kueue.x-k8s.io", "v1beta1")
    k8s.custom.create_cluster_custom_object(
        *kueue, "resourceflavors", {"metadata": {"name": "f"}, "spec": {}}
    )
    queue = {"metadata": {"name": "cq"}, "spec": {"cohort": "h100", "resourceGroups": []}}
    created = k8s.custom.create_cluster_custom_object(*kueue, "clusterqueues", queue)
    assert (created["kind"], created["apiVersion"]) == ("ClusterQueue", "kueue.x-k8s.io/v1beta1")
    assert "namespace" not in created["metadata"]
    k8s.custom.patch_cluster_custom_object(*kueue, "clusterqueues", "cq", {"spec": {"cohort": "a100"}})
    assert k8s.custom.get_cluster_custom_object(*kueue, "clusterqueues", "cq")["spec"]["cohort"] == "a100"
    listed = k8s.custom.list_cluster_custom_object(*kueue, "resourceflavors")
    assert [f["metadata"]["name"] for f in listed["items"]] == ["f"]
    k8s.custom.delete_cluster_custom_object(*kueue, "clusterqueues", "cq")
    assert k8s.custom.list_cluster_custom_object(*kueue, "clusterqueues")["items"] == []
    k8s.core.delete_namespace(ns)  # a namespace's claims go with it
    assert k8s.core.list_persistent_volume_claim_for_all_namespaces().items == []
