"""The fake Kubernetes API server (tests/k8s_apiserver), driven by the official kubernetes client:
its job controller and kubelet, which really run the container's script, and its quota and
scheduling as the real API server and scheduler decide them."""

from __future__ import annotations

import re
import threading
import time
from types import SimpleNamespace

import pytest
from kubernetes import client

from tests.k8s_apiserver import FakeApiServer
from tests.k8s_apiserver_support import (
    GPU_TOLERATION,
    TOKEN,
    alive,
    job_body,
    job_condition,
    job_pods,
    pod_body,
    status_of,
    wait_for,
)


# ---------------------------------------------------------------------------- job controller/kubelet --
def test_failing_script_fails_the_job_with_its_exit_code_and_log(api, k8s, ns):
    k8s.batch.create_namespaced_job(ns, job_body("fail", "echo hi; echo oops >&2; exit 3"))
    condition = wait_for(lambda: job_condition(k8s, ns, "fail"), what="job finished")
    assert (condition.type, condition.reason) == ("Failed", "BackoffLimitExceeded")
    job = k8s.batch.read_namespaced_job("fail", ns)
    assert (job.status.failed, job.status.succeeded, job.status.active) == (1, None, None)
    [pod] = job_pods(k8s, ns, "fail")
    terminated = pod.status.container_statuses[0].state.terminated
    assert (pod.status.phase, terminated.exit_code, terminated.reason) == ("Failed", 3, "Error")
    assert k8s.core.read_namespaced_pod_log(pod.metadata.name, ns) == "hi\noops\n"
    assert k8s.core.read_namespaced_pod_log(pod.metadata.name, ns, container="main", tail_lines=1) == "oops\n"
    assert k8s.core.read_namespaced_pod_log(pod.metadata.name, ns, limit_bytes=2) == "hi"
    with pytest.raises(client.ApiException) as caught:
        k8s.core.read_namespaced_pod_log(pod.metadata.name, ns, container="nope")
    assert caught.value.status == 400
    assert pod.metadata.owner_references[0].kind == "Job" and pod.spec.node_name == "cpu-1"


def test_job_completes_and_records_events(k8s, ns):
    env = [{"name": "GREETING", "value": "hello"}, {"name": "TWICE", "value": "$(GREETING) $(GREETING)"}]
    k8s.batch.create_namespaced_job(ns, job_body("ok", 'echo "$TWICE"', env=env))
    condition = wait_for(lambda: job_condition(k8s, ns, "ok"), what="job finished")
    assert (condition.type, condition.reason) == ("Complete", "CompletionsReached")
    job = k8s.batch.read_namespaced_job("ok", ns)
    assert job.status.succeeded == 1 and job.status.completion_time and job.status.start_time
    [pod] = job_pods(k8s, ns, "ok")
    assert pod.status.container_statuses[0].state.terminated.reason == "Completed"
    assert k8s.core.read_namespaced_pod_log(pod.metadata.name, ns) == "hello hello\n"
    events = k8s.core.list_namespaced_event(ns, field_selector="involvedObject.name=ok").items
    assert {(e.reason, e.type) for e in events} == {("SuccessfulCreate", "Normal"), ("Completed", "Normal")}


def test_active_deadline_exceeded_kills_the_process(k8s, ns):
    k8s.batch.create_namespaced_job(
        ns, job_body("slow", "sleep 60 & echo $!; wait", active_deadline_seconds=1)
    )
    pod = wait_for(
        lambda: [p for p in job_pods(k8s, ns, "slow") if p.status.phase == "Running"], what="pod running"
    )[0]
    pid = int(
        wait_for(lambda: k8s.core.read_namespaced_pod_log(pod.metadata.name, ns).strip(), what="pid in log")
    )
    assert alive(pid)
    condition = wait_for(lambda: job_condition(k8s, ns, "slow"), what="job failed")
    assert (condition.type, condition.reason) == ("Failed", "DeadlineExceeded")
    assert condition.message == "Job was active longer than specified deadline"
    wait_for(lambda: not alive(pid), what="sleep killed")
    wait_for(lambda: job_pods(k8s, ns, "slow") == [], what="pods deleted")


def test_quota_refuses_the_third_gpu_pod_until_one_finishes(api, k8s, ns, tmp_path):
    k8s.core.create_namespaced_resource_quota(
        ns, {"metadata": {"name": "gpu-quota"}, "spec": {"hard": {"requests.nvidia.com/gpu": "2"}}}
    )
    script = f'until [ -e "{tmp_path}/$HOSTNAME.go" ]; do sleep 0.05; done'
    body = job_body("q", script, parallelism=3, completions=3, resources={"limits": {"nvidia.com/gpu": "1"}})
    body["spec"]["template"]["spec"]["tolerations"] = [GPU_TOLERATION]
    k8s.batch.create_namespaced_job(ns, body)

    def running():
        return sorted(p.metadata.name for p in job_pods(k8s, ns, "q") if p.status.phase == "Running")

    first_two = wait_for(lambda: len(running()) == 2 and running(), what="two pods running")
    refused = wait_for(
        lambda: [e for e in k8s.core.list_namespaced_event(ns).items if e.reason == "FailedCreate"]
    )
    assert refused[0].type == "Warning" and refused[0].involved_object.name == "q"
    assert re.fullmatch(
        r'Error creating: pods "q-[a-z0-9]{5}" is forbidden: exceeded quota: gpu-quota, requested: '
        r"requests.nvidia.com/gpu=1, used: requests.nvidia.com/gpu=2, limited: requests.nvidia.com/gpu=2",
        refused[0].message,
    )
    time.sleep(0.3)  # the controller keeps retrying, and keeps being refused
    assert [p.spec.node_name for p in job_pods(k8s, ns, "q")] == ["gpu-1", "gpu-1"]
    quota = k8s.core.read_namespaced_resource_quota("gpu-quota", ns)
    assert quota.status.used == {"requests.nvidia.com/gpu": "2"}
    # the admission check answers a direct create the same way
    with pytest.raises(client.ApiException) as caught:
        k8s.core.create_namespaced_pod(ns, pod_body("direct", "true", limits={"nvidia.com/gpu": "2"}))
    body = status_of(caught.value)
    assert (caught.value.status, body["reason"], body["details"]) == (
        403,
        "Forbidden",
        {"name": "direct", "kind": "pods"},
    )
    assert body["message"] == (
        'pods "direct" is forbidden: exceeded quota: gpu-quota, requested: requests.nvidia.com/gpu=2, '
        "used: requests.nvidia.com/gpu=2, limited: requests.nvidia.com/gpu=2"
    )
    (tmp_path / f"{first_two[0]}.go").touch()
    third = wait_for(lambda: set(running()) - set(first_two), what="third pod running")
    for name in [first_two[1], *third]:
        (tmp_path / f"{name}.go").touch()
    assert wait_for(lambda: job_condition(k8s, ns, "q")).type == "Complete"
    assert k8s.batch.read_namespaced_job("q", ns).status.succeeded == 3


def test_quota_counts_extended_resources_by_their_requests_only(k8s, ns):
    """A MIG instance (the device plugin's mixed strategy) or a HAMi slice's memory counts against
    requests.<name> alone, as the quota evaluator counts every extended resource: limits.<name> and the
    bare name bound nothing. Pods that wait for a node count too."""
    mig = "nvidia.com/mig-3g.71gb"
    hard = {f"requests.{mig}": "1", f"limits.{mig}": "0", mig: "0", "requests.nvidia.com/gpumem": "30000"}
    k8s.core.create_namespaced_resource_quota(
        ns, {"metadata": {"name": "gpu-portal"}, "spec": {"hard": hard}}
    )
    k8s.core.create_namespaced_pod(ns, pod_body("first", "true", limits={mig: "1"}))  # no MIG node: it waits
    with pytest.raises(client.ApiException) as caught:
        k8s.core.create_namespaced_pod(ns, pod_body("second", "true", limits={mig: "1"}))
    body = status_of(caught.value)
    assert (caught.value.status, body["reason"], body["details"]) == (
        403,
        "Forbidden",
        {"name": "second", "kind": "pods"},
    )
    assert body["message"] == (
        'pods "second" is forbidden: exceeded quota: gpu-portal, requested: requests.nvidia.com/mig-3g.71gb=1, '
        "used: requests.nvidia.com/mig-3g.71gb=1, limited: requests.nvidia.com/mig-3g.71gb=1"
    )
    hami = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "20000", "nvidia.com/gpucores": "30"}
    k8s.core.create_namespaced_pod(ns, pod_body("slice", "true", limits=hami))
    with pytest.raises(client.ApiException) as caught:
        k8s.core.create_namespaced_pod(ns, pod_body("slice-2", "true", limits=hami))
    assert caught.value.status == 403 and status_of(caught.value)["message"].endswith(
        "requested: requests.nvidia.com/gpumem=20000, used: requests.nvidia.com/gpumem=20000, "
        "limited: requests.nvidia.com/gpumem=30000"
    )
    used = {f"requests.{mig}": "1", f"limits.{mig}": "0", mig: "0", "requests.nvidia.com/gpumem": "20000"}
    wait_for(lambda: k8s.core.read_namespaced_resource_quota("gpu-portal", ns).status.used == used)


def test_extended_resources_are_whole_with_requests_equal_to_limits(api, k8s, ns):
    """The API server's validation of extended resources, before any quota: integers, a limit always, a
    request equal to it (a limit alone is copied to the request). Nothing invalid is stored."""

    def pod(name: str, **resources) -> dict:
        body = pod_body(name, "true")
        body["spec"]["containers"][0]["resources"] = resources
        return body

    refused = [
        (
            pod("fraction", limits={"nvidia.com/gpu": "500m"}),
            'Pod "fraction" is invalid: [spec.containers[0].resources.limits[nvidia.com/gpu]: Invalid value: '
            '"500m": must be an integer, spec.containers[0].resources.requests[nvidia.com/gpu]: Invalid value: '
            '"500m": must be an integer]',
        ),
        (
            pod("unequal", requests={"nvidia.com/mig-1g.18gb": "2"}, limits={"nvidia.com/mig-1g.18gb": "1"}),
            'Pod "unequal" is invalid: spec.containers[0].resources.requests[nvidia.com/mig-1g.18gb]: '
            'Invalid value: "2": must be equal to nvidia.com/mig-1g.18gb limit of 1',
        ),
        (
            pod("no-limit", requests={"hygon.com/dcumem": "2000", "cpu": "1"}, limits={"cpu": "2"}),
            'Pod "no-limit" is invalid: spec.containers[0].resources.limits[hygon.com/dcumem]: Required value: '
            "Limit must be set for non overcommitable resources",
        ),
    ]
    for body, message in refused:
        with pytest.raises(client.ApiException) as caught:
            k8s.core.create_namespaced_pod(ns, body)
        status = status_of(caught.value)
        assert (caught.value.status, status["reason"], status["message"]) == (422, "Invalid", message)
    job = job_body("j", "true", resources={"requests": {"cambricon.com/vmlu": "1"}})
    with pytest.raises(client.ApiException) as caught:
        k8s.batch.create_namespaced_job(ns, job)
    assert status_of(caught.value)["message"] == (
        'Job.batch "j" is invalid: spec.template.spec.containers[0].resources.limits[cambricon.com/vmlu]: '
        "Required value: Limit must be set for non overcommitable resources"
    )
    assert status_of(caught.value)["details"]["causes"] == [
        {
            "reason": "FieldValueRequired",
            "message": "Required value: Limit must be set for non overcommitable resources",
            "field": "spec.template.spec.containers[0].resources.limits[cambricon.com/vmlu]",
        }
    ]
    assert api.objects("Pod") == [] and api.objects("Job") == []
    same = {"nvidia.com/mig-1g.18gb": "1", "cpu": "500m"}  # native resources may be fractions
    k8s.core.create_namespaced_pod(ns, pod("fine", requests=same, limits=same | {"cpu": "1"}))


def test_indexed_job_gets_completion_indexes_and_hostnames(k8s, ns):
    body = job_body(
        "idx",
        'echo "index=$JOB_COMPLETION_INDEX host=$HOSTNAME"',
        completions=2,
        parallelism=2,
        completion_mode="Indexed",
    )
    body["spec"]["template"]["spec"]["subdomain"] = "workers"
    k8s.batch.create_namespaced_job(ns, body)
    assert wait_for(lambda: job_condition(k8s, ns, "idx")).type == "Complete"
    pods = sorted(
        job_pods(k8s, ns, "idx"),
        key=lambda p: p.metadata.annotations["batch.kubernetes.io/job-completion-index"],
    )
    logs = [k8s.core.read_namespaced_pod_log(p.metadata.name, ns) for p in pods]
    assert logs == ["index=0 host=idx-0\n", "index=1 host=idx-1\n"]
    assert [(p.spec.hostname, p.spec.subdomain) for p in pods] == [("idx-0", "workers"), ("idx-1", "workers")]
    assert [p.metadata.labels["batch.kubernetes.io/job-completion-index"] for p in pods] == ["0", "1"]
    assert re.fullmatch(r"idx-0-[a-z0-9]{5}", pods[0].metadata.name)
    assert k8s.batch.read_namespaced_job("idx", ns).status.completed_indexes == "0,1"


def test_delete_propagation_foreground_background_and_the_orphan_default(api, k8s, ns):
    for name in ("fg", "bg", "orphan"):
        k8s.batch.create_namespaced_job(ns, job_body(name, "sleep 60 & echo $!; wait"))
    pids = {}
    for name in ("fg", "bg", "orphan"):
        pod = wait_for(lambda n=name: [p for p in job_pods(k8s, ns, n) if p.status.phase == "Running"])[0]
        pids[name] = int(
            wait_for(lambda p=pod: k8s.core.read_namespaced_pod_log(p.metadata.name, ns).strip())
        )

    options = client.V1DeleteOptions(propagation_policy="Foreground")  # in the body
    deleting = k8s.batch.delete_namespaced_job("fg", ns, body=options)
    assert deleting["metadata"]["deletionTimestamp"]
    assert deleting["metadata"]["finalizers"] == [
        "foregroundDeletion"
    ]  # the Job stays until its pods are gone
    wait_for(lambda: not alive(pids["fg"]), what="fg pod's process killed")
    wait_for(lambda: not [j for j in api.objects("Job") if j["metadata"]["name"] == "fg"], what="fg job gone")
    assert job_pods(k8s, ns, "fg") == []

    gone = k8s.batch.delete_namespaced_job("bg", ns, propagation_policy="Background")  # as a query parameter
    assert gone["status"] == "Success" and gone["details"]["name"] == "bg"
    wait_for(lambda: not alive(pids["bg"]) and job_pods(k8s, ns, "bg") == [], what="bg pod deleted")

    _, _, headers = k8s.batch.delete_namespaced_job_with_http_info("orphan", ns)  # batch/v1 default: Orphan
    assert "child pods are preserved by default" in headers["Warning"]
    time.sleep(0.2)
    [kept] = job_pods(k8s, ns, "orphan")
    assert kept.status.phase == "Running" and not kept.metadata.owner_references and alive(pids["orphan"])
    deleted = k8s.core.delete_namespaced_pod(kept.metadata.name, ns, grace_period_seconds=0)
    assert deleted.metadata.deletion_timestamp
    wait_for(lambda: job_pods(k8s, ns, "orphan") == [] and not alive(pids["orphan"]), what="orphan deleted")


def test_background_delete_terminates_the_pods_with_their_own_grace(api, k8s, ns, tmp_path):
    """As Kubernetes' garbage collector does: the Job goes at once, each pod gets SIGTERM and its own
    terminationGracePeriodSeconds (the Job's gracePeriodSeconds is not passed on), then SIGKILL."""
    out = tmp_path / "handler.log"
    handles = f"trap 'echo got TERM >> {out}; sleep 0.5; echo saved >> {out}; exit 0' TERM\n"
    handles += "echo ready; while :; do sleep 0.1; done"
    ignores = "trap '' TERM; echo ready; while :; do sleep 0.1; done"  # sleep inherits the ignored TERM
    for name, script in (("handles", handles), ("ignores", ignores)):
        body = job_body(name, script)
        body["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 2
        k8s.batch.create_namespaced_job(ns, body)
    for name in ("handles", "ignores"):
        pod = wait_for(lambda n=name: [p for p in job_pods(k8s, ns, n) if p.status.phase == "Running"])[0]
        wait_for(lambda p=pod: k8s.core.read_namespaced_pod_log(p.metadata.name, ns) == "ready\n")

    def terminating(job: str) -> list[dict]:
        pods = [p for p in api.objects("Pod") if p["metadata"]["labels"]["job-name"] == job]
        return [p["metadata"] for p in pods if p["metadata"].get("deletionTimestamp")]

    options = client.V1DeleteOptions(propagation_policy="Background", grace_period_seconds=30)
    started = time.monotonic()
    for name in ("handles", "ignores"):
        assert k8s.batch.delete_namespaced_job(name, ns, body=options)["status"] == "Success"
        assert not [j for j in api.objects("Job") if j["metadata"]["name"] == name]  # gone at once
    for name in ("handles", "ignores"):
        assert [m["deletionGracePeriodSeconds"] for m in wait_for(lambda n=name: terminating(n))] == [2]
    wait_for(lambda: job_pods(k8s, ns, "handles") == [], what="the pod that saved gone")
    assert out.read_text() == "got TERM\nsaved\n"
    wait_for(lambda: job_pods(k8s, ns, "ignores") == [], what="the pod that ignored TERM killed")
    assert 2 <= time.monotonic() - started < 6  # SIGKILL once its two seconds of grace were out


def test_a_pod_waits_for_its_claim_whose_files_outlive_it(k8s, ns):
    """No PersistentVolumeClaim, no scheduling; the claim's directory is shared by the pods that mount
    it, one after another (an env value under its mountPath names it: the test kubelet mounts nothing)."""

    def claim_pod(name: str, script: str) -> dict:
        body = pod_body(name, script, volumes=[{"name": "s", "persistentVolumeClaim": {"claimName": "data"}}])
        container = body["spec"]["containers"][0]
        container |= {"volumeMounts": [{"name": "s", "mountPath": "/scratch"}]}
        container |= {"env": [{"name": "DIR", "value": "/scratch/checkpoints/run-1"}]}
        return body

    k8s.core.create_namespaced_pod(ns, claim_pod("writer", 'mkdir -p "$DIR" && echo 42 > "$DIR/step"'))
    [scheduled] = wait_for(lambda: k8s.core.read_namespaced_pod("writer", ns).status.conditions)
    assert (scheduled.reason, scheduled.message) == (
        "Unschedulable",
        '0/2 nodes are available: persistentvolumeclaim "data" not found.',
    )
    claim = {"metadata": {"name": "data"}, "spec": {"accessModes": ["ReadWriteMany"]}}
    claim["spec"]["resources"] = {"requests": {"storage": "1Gi"}}
    k8s.core.create_namespaced_persistent_volume_claim(ns, claim)
    wait_for(lambda: k8s.core.read_namespaced_pod("writer", ns).status.phase == "Succeeded")
    k8s.core.create_namespaced_pod(
        ns, claim_pod("reader", 'echo "$DIR" | grep -qv "^/scratch"; cat "$DIR/step"')
    )
    wait_for(lambda: k8s.core.read_namespaced_pod("reader", ns).status.phase in ("Succeeded", "Failed"))
    assert k8s.core.read_namespaced_pod("reader", ns).status.phase == "Succeeded"
    assert k8s.core.read_namespaced_pod_log("reader", ns) == "42\n"


def test_delete_precondition_resource_version(api, k8s, ns):
    k8s.batch.create_namespaced_job(ns, job_body("rv", "sleep 30"))
    seen = k8s.batch.read_namespaced_job("rv", ns).metadata.resource_version
    wait_for(lambda: k8s.batch.read_namespaced_job("rv", ns).metadata.resource_version != seen)  # its status
    stale = client.V1DeleteOptions(preconditions=client.V1Preconditions(resource_version=seen))
    with pytest.raises(client.ApiException) as refused:
        k8s.batch.delete_namespaced_job("rv", ns, body=stale)
    assert refused.value.status == 409
    assert (
        f"ResourceVersion in precondition: {seen}, ResourceVersion in object meta: "
        in (status_of(refused.value)["message"])
    )
    for _attempt in range(20):  # the current version deletes it (its status may move in between)
        current = k8s.batch.read_namespaced_job("rv", ns).metadata.resource_version
        fresh = client.V1DeleteOptions(
            propagation_policy="Background", preconditions=client.V1Preconditions(resource_version=current)
        )
        try:
            k8s.batch.delete_namespaced_job("rv", ns, body=fresh)
            break
        except client.ApiException as exc:
            assert exc.status == 409
    assert not api.objects("Job")


def test_ttl_after_finished_deletes_the_job_and_its_pods(k8s, ns):
    k8s.batch.create_namespaced_job(ns, job_body("ttl", "true", ttl_seconds_after_finished=1))
    assert wait_for(lambda: job_condition(k8s, ns, "ttl")).type == "Complete"
    assert len(job_pods(k8s, ns, "ttl")) == 1
    wait_for(
        lambda: not k8s.batch.list_namespaced_job(ns, field_selector="metadata.name=ttl").items, what="ttl"
    )
    wait_for(lambda: job_pods(k8s, ns, "ttl") == [], what="pods gone")


def test_delete_precondition_uid_and_backdate(api, k8s, ns):
    k8s.batch.create_namespaced_job(ns, job_body("done", "true", ttl_seconds_after_finished=3600))
    assert wait_for(lambda: job_condition(k8s, ns, "done")).type == "Complete"
    job = k8s.batch.read_namespaced_job("done", ns)
    wrong = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid="0000"))
    with pytest.raises(client.ApiException) as refused:
        k8s.batch.delete_namespaced_job("done", ns, body=wrong)
    assert refused.value.status == 409 and "Precondition failed" in status_of(refused.value)["message"]

    api.backdate("Job", ns, "done", 7200)  # ended two hours ago: past its TTL of one hour
    moved = k8s.batch.read_namespaced_job("done", ns).status
    assert (job.status.completion_time - moved.completion_time).total_seconds() == 7200
    assert (job.status.start_time - moved.start_time).total_seconds() == 7200
    wait_for(lambda: not api.objects("Job") and job_pods(k8s, ns, "done") == [], what="the TTL to fire")


def test_scheduling_by_selector_taints_and_room_and_oom_mapping(k8s, ns):
    h100 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    unschedulable = {
        "0/2 nodes are available: 2 node(s) didn't match Pod's node affinity/selector.": pod_body(
            "nowhere", "true", nodeSelector={"nvidia.com/gpu.product": "NVIDIA-B200"}
        ),
        "0/2 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, "
        "1 node(s) had untolerated taint {nvidia.com/gpu: present}.": pod_body(
            "untolerated", "true", nodeSelector=h100
        ),
        "0/2 nodes are available: 2 Insufficient nvidia.com/gpu.": pod_body(
            "huge", "true", limits={"nvidia.com/gpu": "16"}, tolerations=[GPU_TOLERATION]
        ),
    }
    for body in unschedulable.values():
        k8s.core.create_namespaced_pod(ns, body)
    oom = {"test.gpu-portal/oom": "true"}
    k8s.core.create_namespaced_pod(
        ns,
        pod_body(
            "oom", "kill -KILL $BASHPID", annotations=oom, nodeSelector=h100, tolerations=[GPU_TOLERATION]
        ),
    )
    k8s.core.create_namespaced_pod(ns, pod_body("killed", "kill -KILL $BASHPID"))
    for message, body in unschedulable.items():
        name = body["metadata"]["name"]
        [scheduled] = wait_for(lambda n=name: k8s.core.read_namespaced_pod(n, ns).status.conditions)
        assert (scheduled.type, scheduled.status, scheduled.reason) == (
            "PodScheduled",
            "False",
            "Unschedulable",
        )
        assert scheduled.message == message
        assert k8s.core.read_namespaced_pod(name, ns).status.phase == "Pending"
        events = k8s.core.list_namespaced_event(ns, field_selector=f"involvedObject.name={name}").items
        assert [(e.reason, e.message) for e in events] == [("FailedScheduling", message)]
    for name, reason, node in (("oom", "OOMKilled", "gpu-1"), ("killed", "Error", "cpu-1")):
        done = wait_for(
            lambda n=name: [p for p in [k8s.core.read_namespaced_pod(n, ns)] if p.status.phase == "Failed"]
        )
        terminated = done[0].status.container_statuses[0].state.terminated
        assert (terminated.exit_code, terminated.reason, done[0].spec.node_name) == (137, reason, node)


def test_stop_ends_every_thread_and_process():
    baseline = threading.active_count()
    with FakeApiServer(token=TOKEN) as api:
        config = client.Configuration(host=api.url, api_key={"authorization": f"Bearer {TOKEN}"})
        with client.ApiClient(config) as api_client:
            k8s = SimpleNamespace(core=client.CoreV1Api(api_client), batch=client.BatchV1Api(api_client))
            k8s.batch.create_namespaced_job("default", job_body("long", "sleep 60 & echo $!; wait"))
            pod = wait_for(
                lambda: [p for p in job_pods(k8s, "default", "long") if p.status.phase == "Running"]
            )[0]
            pid = int(
                wait_for(lambda: k8s.core.read_namespaced_pod_log(pod.metadata.name, "default").strip())
            )
    wait_for(lambda: not alive(pid), timeout_s=2, what="process killed on stop")
    assert threading.active_count() == baseline
