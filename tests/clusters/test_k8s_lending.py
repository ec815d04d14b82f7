"""Lending on Kubernetes (docs/architecture/lending.md): what the backend writes for preemptible
jobs, jobs on borrowed GPUs and tenants in a cohort, and warn().

Every new built-in object (a Job whose pods have a grace and the scratch claim, the claim, the
portal-borrow PriorityClass) is validated against the Kubernetes schemas (kubernetes-validate,
strict) of each version in KUBERNETES_VERSIONS, as the other Kubernetes tests do; Kueue's objects
(ClusterQueue, ResourceFlavor, LocalQueue, WorkloadPriorityClass) against their CRDs' schema and
rules (tests/k8s_support.kueue_errors). Then through the official client against the fake API
server of tests/k8s_apiserver: a warned job's pod gets SIGTERM and its grace, saves a checkpoint
in the tenant's claim, its Job is gone at once, and the next attempt finds the checkpoint; a tenant
in a cohort gets its ClusterQueue with its limits, and loses it when it leaves.
"""

from __future__ import annotations

import copy
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace

import kubernetes_validate
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clusters.backends import backend_for, base
from clusters.backends.base import BackendError, ClusterConfig, JobRef, JobSpec, TenantLimits
from clusters.backends.kubernetes import KUBERNETES_VERSIONS, KubernetesBackend
from clusters.backends.kubernetes import manifests as m
from clusters.backends.kubernetes.kueue import (
    KUEUE_GROUP,
    KUEUE_VERSION,
    cluster_queue_manifest,
    local_queue_manifest,
    resource_flavor_manifest,
    workload_priority_class_manifests,
)
from clusters.backends.kubernetes.tenant import (
    priority_class_manifests,
    scratch_claim_manifest,
    tenant_manifests,
)
from tests.k8s_apiserver import FakeApiServer
from tests.k8s_support import kueue_errors, make_config, make_spec

LIMITS = TenantLimits(
    account="protein-lab",
    qos="portal-high",
    users=[],
    gpus_by_type={"h100": 8},
    gpu_minutes=60_000,
    k8s_resources={"nvidia.com/gpu": 8, "nvidia.com/mig-3g.71gb": 2},
    cohort="h100-pool",
    k8s_lending={"nvidia.com/gpu": 4},
    k8s_borrowing={"nvidia.com/gpu": 6, "nvidia.com/mig-1g.18gb": 2},
)
PREEMPTIBLE = {"preemptible": True, "grace_s": 300, "attempt": 3, "checkpoint_key": "job-42"}


def lending_manifests() -> dict[str, dict]:
    """Every new built-in object the backend writes, by a readable id."""
    plain, kueue = make_config(), make_config(uses_kueue=True)
    found = {
        "job-preemptible": m.job_manifest(make_spec(**PREEMPTIBLE), plain),
        "job-preemptible-kueue": m.job_manifest(make_spec(**PREEMPTIBLE), kueue),
        "job-preemptible-indexed": m.job_manifest(make_spec(nodes=3, **PREEMPTIBLE), plain),
        "job-borrowing": m.job_manifest(make_spec(borrowing=True, **PREEMPTIBLE), kueue),
        "job-preemptible-no-checkpoint": m.job_manifest(make_spec(preemptible=True, grace_s=0), plain),
        "persistentvolumeclaim": scratch_claim_manifest(LIMITS, plain),
        "persistentvolumeclaim-class": scratch_claim_manifest(
            LIMITS, make_config(k8s_scratch_gib=2048, k8s_scratch_storage_class="cephfs.csi.ceph.com")
        ),
    }
    (borrow,) = [pc for pc in priority_class_manifests() if pc["metadata"]["name"] == "portal-borrow"]
    return found | {"priorityclass-portal-borrow": borrow}


MANIFESTS = lending_manifests()


def pod_spec(job: dict) -> dict:
    return job["spec"]["template"]["spec"]


def container(job: dict) -> dict:
    (c,) = pod_spec(job)["containers"]
    return c


def env_of(job: dict) -> dict[str, str]:
    """The container's env as its process sees it: every value is literal (no $(VAR) in them)."""
    return {e["name"]: e["value"].replace("$$", "$") for e in container(job)["env"]}


# ---------------------------------------------------------------- schemas --
@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("name", sorted(MANIFESTS))
def test_lending_manifest_is_valid_for_every_version(name, version):
    assert kubernetes_validate.validate(MANIFESTS[name], version, strict=True) == version


def kueue_objects() -> dict[str, dict]:
    kueue = make_config(uses_kueue=True, k8s_kueue_cluster_queue="gpu-pool")
    slices = replace(
        LIMITS, k8s_resources={"nvidia.com/gpu": 3, "cambricon.com/vmlu": 2, "hygon.com/dcunum": 1}
    )
    return {
        "clusterqueue": cluster_queue_manifest(LIMITS),
        "clusterqueue-slices": cluster_queue_manifest(slices),
        "clusterqueue-nothing-granted": cluster_queue_manifest(replace(LIMITS, k8s_resources={})),
        "resourceflavor": resource_flavor_manifest(),
        "localqueue-cohort": local_queue_manifest(LIMITS, kueue),
        "localqueue-shared": local_queue_manifest(replace(LIMITS, cohort=""), kueue),
        **{f"wpc-{w['metadata']['name']}": w for w in workload_priority_class_manifests()},
    }


@pytest.mark.parametrize(("name", "manifest"), sorted(kueue_objects().items()))
def test_kueue_object_is_valid_for_its_crd(name, manifest):
    assert kueue_errors(manifest) == []


def test_the_kueue_check_catches_what_kueue_refuses():
    """The CRD check above can fail: each of these is refused by Kueue's API server."""
    good = cluster_queue_manifest(LIMITS)

    def broken(change: Callable[[dict], None]) -> list[str]:
        manifest = copy.deepcopy(good)
        change(manifest)
        return kueue_errors(manifest)

    group = ("spec", "resourceGroups", 0)

    def at(manifest: dict, *path) -> dict:
        for key in path:
            manifest = manifest[key]
        return manifest

    assert broken(lambda x: x["spec"].update(borrowFromCohort={}))  # an unknown field
    assert broken(lambda x: x["spec"].update(cohort="H100 Pool"))
    assert broken(lambda x: x["spec"]["preemption"].update(reclaimWithinCohort="Sometimes"))
    assert broken(
        lambda x: x["spec"]["preemption"].update(
            reclaimWithinCohort="Never", borrowWithinCohort={"policy": "LowerPriority"}
        )
    )
    assert broken(lambda x: at(x, *group)["coveredResources"].reverse())  # out of the flavor's order
    assert broken(lambda x: at(x, *group, "flavors", 0, "resources", 0).update(lendingLimit="99"))
    assert broken(lambda x: at(x, *group, "flavors", 0, "resources", 0).update(nominalQuota="eight"))
    assert broken(lambda x: x["spec"].pop("cohort"))  # limits without a cohort
    assert broken(lambda x: x["spec"]["resourceGroups"].append(copy.deepcopy(at(x, *group))))
    assert broken(lambda x: x["metadata"].update(name="Portal_Protein"))
    lq = local_queue_manifest(LIMITS, make_config(uses_kueue=True))
    assert kueue_errors(lq | {"metadata": {"name": "portal"}})  # a LocalQueue is namespaced


def test_tenant_manifests_with_a_cohort_are_all_checked():
    """Every object apply_tenant writes for a tenant in a cohort: schema-validated, here or in
    test_backend_kubernetes_manifests.py, or one of Kueue's checked above."""
    written = tenant_manifests(LIMITS, make_config(uses_kueue=True))
    for manifest in written:
        if manifest["apiVersion"].startswith(KUEUE_GROUP):
            assert kueue_errors(manifest) == [], manifest["kind"]
        else:
            assert kubernetes_validate.validate(manifest, KUBERNETES_VERSIONS[-1], strict=True)


# --------------------------------------------------------------------- job --
def test_a_preemptible_job_gets_its_grace_and_the_sigterm_contract():
    job = MANIFESTS["job-preemptible"]
    pod = pod_spec(job)
    assert pod["terminationGracePeriodSeconds"] == 300
    env = env_of(job)
    assert (env["PORTAL_PREEMPT_SIGNAL"], env["PORTAL_ATTEMPT"]) == ("TERM", "3")
    assert env["PORTAL_CHECKPOINT_DIR"] == "/scratch/checkpoints/job-42"
    assert {"name": "scratch", "persistentVolumeClaim": {"claimName": "portal-scratch"}} in pod["volumes"]
    assert {"name": "scratch", "mountPath": "/scratch"} in container(job)["volumeMounts"]
    # the script runs unchanged, as the container's main process, once its directory is made
    command = [arg.replace("$$", "$") for arg in container(job)["command"]]
    assert command == ["/bin/bash", "-c", m.CHECKPOINT_START, "portal-job", make_spec().script]
    assert m.CHECKPOINT_START.endswith('exec /bin/bash -c "$1"')
    assert pod["priorityClassName"] == "portal-high"


def test_the_isolation_of_a_preemptible_job_is_intact():
    """What test_k8s_pod_isolation.py holds of every pod, and one volume more: the tenant's own claim."""
    plain = m.job_manifest(make_spec(), make_config())
    for key in ("job-preemptible", "job-preemptible-kueue", "job-preemptible-indexed", "job-borrowing"):
        job = MANIFESTS[key]
        pod, c = pod_spec(job), container(job)
        assert pod["securityContext"] == pod_spec(plain)["securityContext"]
        assert c["securityContext"] == container(plain)["securityContext"]
        assert pod["automountServiceAccountToken"] is False and "serviceAccountName" not in pod
        assert set(pod) - set(pod_spec(plain)) <= {"terminationGracePeriodSeconds", "subdomain"}
        claim = {"name": "scratch", "persistentVolumeClaim": {"claimName": "portal-scratch"}}
        assert pod["volumes"] == [*pod_spec(plain)["volumes"], claim]  # its own tenant's claim, no other
        assert job["metadata"]["namespace"] == "protein-lab"


def test_a_job_without_checkpoints_keeps_its_volumes_and_command():
    job = m.job_manifest(make_spec(), make_config())
    assert "terminationGracePeriodSeconds" not in pod_spec(job)  # Kubernetes' default, 30 s
    assert [v["name"] for v in pod_spec(job)["volumes"]] == ["work", "shm"]
    assert container(job)["command"] == ["/bin/bash", "-c", m.literal(make_spec().script)]
    env = env_of(job)
    assert (env["PORTAL_ATTEMPT"], env["PORTAL_PREEMPT_SIGNAL"]) == ("1", "TERM")
    assert "PORTAL_CHECKPOINT_DIR" not in env
    no_checkpoint = MANIFESTS["job-preemptible-no-checkpoint"]
    assert pod_spec(no_checkpoint)["terminationGracePeriodSeconds"] == 0
    assert [v["name"] for v in pod_spec(no_checkpoint)["volumes"]] == ["work", "shm"]


def test_the_contracts_variables_are_the_backends():
    own = {"PORTAL_ATTEMPT": "99", "PORTAL_CHECKPOINT_DIR": "/etc", "PORTAL_PREEMPT_SIGNAL": "KILL"}
    job = m.job_manifest(make_spec(env=own | {"OK": "1"}, **PREEMPTIBLE), make_config())
    names = [e["name"] for e in container(job)["env"]]
    assert all(names.count(name) == 1 for name in own)
    env = env_of(job)
    assert (env["PORTAL_ATTEMPT"], env["PORTAL_CHECKPOINT_DIR"], env["OK"]) == (
        "3",
        "/scratch/checkpoints/job-42",
        "1",
    )


def test_a_job_on_borrowed_gpus_has_the_lowest_priority():
    job = MANIFESTS["job-borrowing"]
    assert pod_spec(job)["priorityClassName"] == "portal-borrow"
    assert job["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == "portal-borrow"
    values = {pc["metadata"]["name"]: pc for pc in priority_class_manifests()}
    assert values["portal-borrow"]["value"] < min(
        v["value"] for k, v in values.items() if k != "portal-borrow"
    )
    assert values["portal-borrow"]["preemptionPolicy"] == "Never"


@pytest.mark.parametrize(
    "overrides",
    [
        {"checkpoint_key": "../x"},
        {"checkpoint_key": ".."},
        {"checkpoint_key": "."},
        {"checkpoint_key": "a/b"},
        {"checkpoint_key": "a..b"},
        {"checkpoint_key": "x" * 129},
        {"checkpoint_key": "a\nb"},
        {"checkpoint_key": "$(HOME)"},
        {"grace_s": -1},
        {"grace_s": True},
        {"grace_s": "300"},
        {"attempt": 0},
    ],
    ids=repr,
)
def test_bad_lending_fields_are_refused(overrides):
    with pytest.raises(BackendError):
        m.job_manifest(make_spec(**(PREEMPTIBLE | overrides)), make_config())


def test_a_checkpoint_needs_the_clusters_scratch():
    with pytest.raises(BackendError, match="no scratch volume"):
        m.job_manifest(make_spec(**PREEMPTIBLE), make_config(k8s_scratch_gib=0))
    job = m.job_manifest(make_spec(preemptible=True, grace_s=60), make_config(k8s_scratch_gib=0))
    assert pod_spec(job)["terminationGracePeriodSeconds"] == 60  # no checkpoint key: runs without one


# ------------------------------------------------------------------ tenant --
def test_scratch_claim_shape():
    assert MANIFESTS["persistentvolumeclaim"] == {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": "portal-scratch",
            "namespace": "protein-lab",
            "labels": {"app.kubernetes.io/managed-by": "gpu-portal"},
        },
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "volumeMode": "Filesystem",
            "resources": {"requests": {"storage": "100Gi"}},
        },
    }
    spec = MANIFESTS["persistentvolumeclaim-class"]["spec"]
    assert (spec["storageClassName"], spec["resources"]["requests"]["storage"]) == (
        "cephfs.csi.ceph.com",
        "2048Gi",
    )
    for bad in (
        {"k8s_scratch_storage_class": "Fast SSD"},
        {"k8s_scratch_gib": -1},
        {"k8s_scratch_gib": True},
    ):
        with pytest.raises(BackendError):
            tenant_manifests(LIMITS, make_config(**bad))


def test_cluster_queue_shape():
    queue = cluster_queue_manifest(replace(LIMITS, k8s_lending={"nvidia.com/gpu": 12}))
    assert queue["metadata"] == {
        "name": "portal-protein-lab",
        "labels": {"app.kubernetes.io/managed-by": "gpu-portal", "gpu-portal/tenant": "protein-lab"},
    }
    spec = queue["spec"]
    assert spec["cohort"] == "h100-pool"
    assert spec["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "protein-lab"}}
    assert spec["preemption"] == {
        "reclaimWithinCohort": "Any",
        "borrowWithinCohort": {"policy": "Never"},
        "withinClusterQueue": "LowerPriority",
    }
    (group,) = spec["resourceGroups"]
    (flavor,) = group["flavors"]
    assert flavor["name"] == "gpu-portal" == resource_flavor_manifest()["metadata"]["name"]
    quotas = {
        q["name"]: (q["nominalQuota"], q["lendingLimit"], q["borrowingLimit"]) for q in flavor["resources"]
    }
    assert quotas["nvidia.com/gpu"] == ("8", "8", "6")  # lends at most what it holds
    assert quotas["nvidia.com/mig-3g.71gb"] == ("2", "0", "0")  # neither lent nor borrowed
    assert quotas["nvidia.com/mig-1g.18gb"] == ("0", "0", "2")  # borrowed without a grant of its own
    assert quotas["amd.com/gpu"] == ("0", "0", "0")
    assert quotas["cpu"] == ("1M", "0", "0") and quotas["memory"] == ("1Pi", "0", "0")
    assert quotas["nvidia.com/gpumem"] == quotas["nvidia.com/gpucores"] == ("1G", "0", "0")
    # what a job's pod asks for is covered: Kueue admits no workload asking for anything else
    for case in ({}, {"share": "slice", "gpus_per_node": 1, "gpu_memory_mib": 2048, "gpu_cores_pct": 20}):
        resources = container(m.job_manifest(make_spec(**case), make_config()))["resources"]["requests"]
        assert set(resources) <= set(group["coveredResources"])


def test_the_local_queue_feeds_the_tenants_cluster_queue_in_a_cohort():
    kueue = make_config(uses_kueue=True, k8s_kueue_cluster_queue="gpu-pool")
    assert local_queue_manifest(LIMITS, kueue)["spec"] == {"clusterQueue": "portal-protein-lab"}
    assert local_queue_manifest(replace(LIMITS, cohort=""), kueue)["spec"] == {"clusterQueue": "gpu-pool"}
    plain = [x["kind"] for x in tenant_manifests(LIMITS, make_config())]  # no Kueue: no queue at all
    assert not {"ClusterQueue", "ResourceFlavor", "LocalQueue"} & set(plain)


@pytest.mark.parametrize(
    "overrides",
    [
        {"cohort": "H100_Pool"},
        {"cohort": "x" * 254},
        {"k8s_lending": {"gpu": 1}},
        {"k8s_borrowing": {"nvidia.com/gpu": -1}},
        {"k8s_lending": {"nvidia.com/gpu": "4"}},
        {"k8s_borrowing": {"cpu": 4}},
    ],
    ids=repr,
)
def test_bad_cohort_limits_are_refused(overrides):
    with pytest.raises(BackendError):
        tenant_manifests(replace(LIMITS, **overrides), make_config(uses_kueue=True))


resources = st.sampled_from(
    ["nvidia.com/gpu", "amd.com/gpu", "nvidia.com/mig-3g.71gb", "cambricon.com/vmlu", "hygon.com/dcunum"]
)
counts = st.dictionaries(resources, st.integers(0, 64), max_size=5)


@settings(max_examples=200, deadline=None)
@given(granted=counts, lending=counts, borrowing=counts)
def test_any_grants_and_limits_give_a_cluster_queue_kueue_accepts(granted, lending, borrowing):
    limits = replace(LIMITS, k8s_resources=granted, k8s_lending=lending, k8s_borrowing=borrowing)
    queue = cluster_queue_manifest(limits)
    assert kueue_errors(queue) == []
    (flavor,) = queue["spec"]["resourceGroups"][0]["flavors"]
    for quota in flavor["resources"]:
        if quota["name"] in {*granted, *lending, *borrowing}:
            held = granted.get(quota["name"], 0)
            assert quota["nominalQuota"] == str(held)
            assert quota["lendingLimit"] == str(min(lending.get(quota["name"], 0), held))
            assert quota["borrowingLimit"] == str(borrowing.get(quota["name"], 0))


# ------------------------------------------------------- against the API --
API_TOKEN = "fake-api-token-lending"
H100 = "NVIDIA-H100-80GB-HBM3"
NODE = {
    "name": "gpu-1",
    "labels": {"nvidia.com/gpu.product": H100},
    "capacity": {"nvidia.com/gpu": "8", "cpu": "128", "memory": "1024Gi", "pods": "110"},
    "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
}
DEADLINE_S = 30


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer(token=API_TOKEN, nodes=[NODE]) as server:
        yield server
        assert server.cluster.errors == []


def cluster(api: FakeApiServer, **overrides) -> KubernetesBackend:
    values = {"slug": f"fake-{uuid.uuid4().hex[:8]}", "kind": "kubernetes", "k8s_api_url": api.url}
    backend = backend_for(ClusterConfig(**(values | {"k8s_token": API_TOKEN} | overrides)))
    assert isinstance(backend, KubernetesBackend)
    return backend


def tenant(**overrides) -> TenantLimits:
    values = {"cohort": "", "k8s_lending": {}, "k8s_borrowing": {}, "k8s_resources": {"nvidia.com/gpu": 8}}
    return replace(LIMITS, qos="portal-normal", **(values | overrides))


def job(script: str, **overrides) -> JobSpec:
    values = {"token": uuid.uuid4().hex, "qos": "portal-normal", "partition": H100, "k8s_product": H100}
    values |= {"gpus_per_node": 1, "cpus_per_gpu": 1, "mem_per_gpu_mb": 1000, "env": {}, "script": script}
    return make_spec(**(values | overrides))


def wait_until(probe: Callable[[], object], what: str) -> object:
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        if found := probe():
            return found
        time.sleep(0.05)
    raise AssertionError(f"{what}: not after {DEADLINE_S}s")


def state_of(backend: KubernetesBackend, backend_id: str) -> base.JobStatus | None:
    return backend.poll([backend_id]).get(backend_id)


# A job that saves its step in its checkpoint directory when it gets SIGTERM (which takes it half a
# second), and starts from the step it finds there.
CHECKPOINTING = """\
echo "attempt $PORTAL_ATTEMPT, warned by SIG$PORTAL_PREEMPT_SIGNAL"
step=$(cat "$PORTAL_CHECKPOINT_DIR/step" 2>/dev/null || echo 0)
echo "from step $step"
trap 'echo "$step" > "$PORTAL_CHECKPOINT_DIR/step"; sleep 0.5; echo "saved step $step"; exit 0' TERM
while [ "$step" -lt 1000000 ]; do step=$((step + 1)); sleep 0.05; done
"""


def test_warn_gives_the_pod_sigterm_and_its_grace_and_the_job_is_gone(api):
    backend = cluster(api)
    backend.apply_tenant(tenant())
    first = job(CHECKPOINTING, preemptible=True, grace_s=2, attempt=1, checkpoint_key="train-7")
    backend_id = backend.submit(first)
    ref = JobRef(backend_id, first.token, "protein-lab")
    wait_until(
        lambda: "from step 0" in backend.log_tail(ref, lines=5, max_bytes=1000).lines, "first attempt runs"
    )
    time.sleep(0.3)  # a few steps
    (pod,) = api.objects("Pod")
    assert pod["spec"]["terminationGracePeriodSeconds"] == 2

    before = len(api.requests)
    backend.warn(backend_id, grace_s=2)
    (delete,) = [r for r in api.requests[before:] if r[0] != "GET"]
    assert delete[0] == "DELETE" and delete[1].endswith(f"/jobs/pj-{first.token}")
    assert (delete[2]["propagationPolicy"], delete[2]["gracePeriodSeconds"]) == ("Background", "2")
    assert api.objects("Job") == [] and backend.poll([backend_id]) == {}  # gone at once: the attempt ended
    (terminating,) = wait_until(
        lambda: [p for p in api.objects("Pod") if p["metadata"].get("deletionTimestamp")],
        "the pod terminating",
    )
    assert terminating["metadata"]["deletionGracePeriodSeconds"] == 2
    wait_until(lambda: api.objects("Pod") == [], "the pod gone once it saved")
    backend.warn(backend_id, grace_s=2)  # again: gone, no error
    backend.cancel(backend_id)  # the portal's cancel once the grace is out: nothing left, no error

    second = replace(first, token=uuid.uuid4().hex, attempt=2, script=CHECKPOINTING.replace("1000000", "0"))
    second_id = backend.submit(second)
    assert wait_until(
        lambda: (s := state_of(backend, second_id)) and s.state in base.END_STATES and s, "2nd"
    ).state == (base.JobState.COMPLETED)
    lines = backend.log_tail(JobRef(second_id, second.token, "protein-lab"), lines=5, max_bytes=1000).lines
    assert lines[0] == "attempt 2, warned by SIGTERM"
    saved = int(lines[1].removeprefix("from step "))
    assert saved > 0  # the checkpoint outlived the first attempt's pod, in the tenant's claim


def test_warn_leaves_alone_what_is_not_running(api):
    backend = cluster(api)
    backend.apply_tenant(tenant())
    done_id = backend.submit(job("echo done", preemptible=True, grace_s=1))
    wait_until(lambda: (s := state_of(backend, done_id)) and s.state == base.JobState.COMPLETED, "completed")
    backend.warn(done_id, grace_s=1)
    assert state_of(backend, done_id).state == base.JobState.COMPLETED  # never taken for a preempted one

    cancelled = job("trap 'sleep 1; exit 143' TERM; sleep 30 & wait", preemptible=True, grace_s=2)
    cancelled_id = backend.submit(cancelled)
    wait_until(lambda: (s := state_of(backend, cancelled_id)) and s.state == base.JobState.RUNNING, "running")
    backend.cancel(cancelled_id)
    before = len(api.requests)
    backend.warn(cancelled_id, grace_s=1)
    assert [r[0] for r in api.requests[before:]] == ["GET"]  # being deleted: left to its cancel

    kueue = cluster(api, uses_kueue=True)
    suspended_id = kueue.submit(job("echo never", preemptible=True, grace_s=1))
    kueue.warn(suspended_id, grace_s=1)
    assert state_of(kueue, suspended_id).raw_state == "Suspended"  # Kueue has not admitted it

    kueue.warn(f"protein-lab/pj-{uuid.uuid4().hex}", grace_s=1)  # no such Job: no error
    with pytest.raises(BackendError):
        backend.warn("kube-system/pj-0123", grace_s=1)
    with pytest.raises(BackendError):
        backend.warn(done_id, grace_s=-1)


def test_a_checkpointing_job_waits_for_its_tenants_claim(api):
    cluster(api, k8s_scratch_gib=0).apply_tenant(tenant())  # no claim written
    assert api.objects("PersistentVolumeClaim") == []
    backend = cluster(api)
    backend_id = backend.submit(job("echo hi", preemptible=True, grace_s=1, checkpoint_key="k"))
    status = wait_until(
        lambda: (s := state_of(backend, backend_id)) and s.reason == "Unschedulable" and s, "pending"
    )
    assert status.state == base.JobState.PENDING
    backend.apply_tenant(tenant())  # the claim now: the job runs
    wait_until(
        lambda: (s := state_of(backend, backend_id)) and s.state == base.JobState.COMPLETED, "completed"
    )


def test_apply_tenant_with_a_cohort_writes_its_cluster_queue_with_the_limits(api):
    backend = cluster(api, uses_kueue=True, k8s_kueue_cluster_queue="gpu-pool")
    lender = tenant(
        cohort="h100-pool", k8s_lending={"nvidia.com/gpu": 4}, k8s_borrowing={"nvidia.com/gpu": 2}
    )
    backend.apply_tenant(lender)
    (flavor,) = api.objects("ResourceFlavor")
    assert flavor["metadata"]["name"] == "gpu-portal"
    (queue,) = api.objects("ClusterQueue")
    assert kueue_errors(queue) == []
    assert queue["metadata"]["name"] == "portal-protein-lab" and queue["spec"]["cohort"] == "h100-pool"
    (group,) = queue["spec"]["resourceGroups"]
    quotas = {q["name"]: q for q in group["flavors"][0]["resources"]}
    assert quotas["nvidia.com/gpu"] == {
        "name": "nvidia.com/gpu",
        "nominalQuota": "8",
        "borrowingLimit": "2",
        "lendingLimit": "4",
    }
    assert queue["spec"]["preemption"]["reclaimWithinCohort"] == "Any"
    (local,) = api.objects("LocalQueue")
    assert (local["metadata"]["namespace"], local["spec"]) == (
        "protein-lab",
        {"clusterQueue": "portal-protein-lab"},
    )

    before = len(api.requests)
    backend.apply_tenant(lender)
    # the same limits: reads only (and the WorkloadPriorityClasses tried: the fake serves none)
    assert [r for r in api.requests[before:] if r[0] != "GET" and "workloadpriorityclasses" not in r[1]] == []

    before = len(api.requests)
    backend.apply_tenant(replace(lender, k8s_lending={"nvidia.com/gpu": 6}))  # the admin lends more
    written = [r for r in api.requests[before:] if r[0] != "GET" and "workloadpriorityclasses" not in r[1]]
    assert [(r[0], r[1].rsplit("/", 2)[1]) for r in written] == [("PUT", "clusterqueues")]
    (queue,) = api.objects("ClusterQueue")
    assert {q["name"]: q for q in queue["spec"]["resourceGroups"][0]["flavors"][0]["resources"]}[
        "nvidia.com/gpu"
    ]["lendingLimit"] == "6"

    backend.apply_tenant(tenant())  # out of the cohort: back on the shared queue, its own one gone
    assert api.objects("ClusterQueue") == []
    assert [q["spec"] for q in api.objects("LocalQueue")] == [{"clusterQueue": "gpu-pool"}]
    backend.apply_tenant(lender)  # and in again
    assert [q["spec"] for q in api.objects("LocalQueue")] == [{"clusterQueue": "portal-protein-lab"}]
    assert len(api.objects("ClusterQueue")) == 1


def test_a_cluster_queue_the_portal_did_not_make_is_left_alone(api):
    backend = cluster(api, uses_kueue=True)
    path = f"/apis/{KUEUE_GROUP}/{KUEUE_VERSION}/clusterqueues"
    admins = {"metadata": {"name": "portal-protein-lab"}, "spec": {"cohort": "theirs"}}
    backend.api.request("create", "POST", path, body=admins)
    backend.apply_tenant(tenant())  # in no cohort: a ClusterQueue of its name that is not the portal's stays
    assert [q["spec"] for q in api.objects("ClusterQueue")] == [{"cohort": "theirs"}]
