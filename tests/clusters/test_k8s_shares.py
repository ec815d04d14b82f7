"""GPU shares on Kubernetes (clusters/shares.py): what a job's pod asks for per vendor and share,
what a tenant's ResourceQuota and LimitRange bound, and that the API server counts them.

Whole devices go by their device plugin's resource, MIG instances by the NVIDIA device plugin's
mixed strategy (nvidia.com/mig-<profile>), slices by HAMi's resources under HAMi's scheduler;
shards are Slurm's and refused. Every manifest is validated against the Kubernetes schemas
(kubernetes-validate, strict) of each version in KUBERNETES_VERSIONS, as the other Kubernetes
tests do, and the quota is seen at work in the fake API server of tests/k8s_apiserver.
"""

from __future__ import annotations

import copy
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace

import kubernetes_validate
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from clusters import shares
from clusters.backends import backend_for, base
from clusters.backends.base import BackendError, JobSpec, TenantLimits
from clusters.backends.kubernetes import KUBERNETES_VERSIONS, KubernetesBackend
from clusters.backends.kubernetes import manifests as m
from clusters.backends.kubernetes.common import check_resource
from clusters.backends.kubernetes.tenant import keep_revoked, limit_range_manifest, resource_quota_manifest
from tests.k8s_apiserver import FakeApiServer
from tests.k8s_support import make_config, make_spec

# One job per vendor and share kind: the spec's fields, and the extended resources its pod asks
# for (requests = limits), as the vendors' device plugins and HAMi name them.
CASES = {
    "nvidia-whole": (
        dict(vendor="nvidia", k8s_resource="nvidia.com/gpu", k8s_product="NVIDIA-H200", gpus_per_node=4),
        {"nvidia.com/gpu": "4"},
    ),
    "nvidia-mig": (
        dict(
            vendor="nvidia",
            k8s_resource="nvidia.com/gpu",
            k8s_product="NVIDIA-H200",
            share="mig",
            mig_profile="3g.71gb",
            gpus_per_node=2,
        ),
        {"nvidia.com/mig-3g.71gb": "2"},
    ),
    "nvidia-slice": (
        dict(
            vendor="nvidia",
            k8s_resource="nvidia.com/gpu",
            k8s_product="NVIDIA-H200",
            share="slice",
            gpus_per_node=1,
            gpu_memory_mib=20_480,
            gpu_cores_pct=30,
        ),
        {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "20480", "nvidia.com/gpucores": "30"},
    ),
    "amd-whole": (
        dict(vendor="amd", k8s_resource="amd.com/gpu", k8s_product="AMD-Instinct-MI250X", gpus_per_node=2),
        {"amd.com/gpu": "2"},
    ),
    "hygon-whole": (
        dict(vendor="hygon", k8s_resource="hygon.com/dcunum", k8s_product="Z100", gpus_per_node=2),
        {"hygon.com/dcunum": "2"},
    ),
    "hygon-slice": (
        dict(
            vendor="hygon",
            k8s_resource="hygon.com/dcunum",
            k8s_product="Z100",
            share="slice",
            gpus_per_node=1,
            gpu_memory_mib=8_192,
            gpu_cores_pct=25,
        ),
        {"hygon.com/dcunum": "1", "hygon.com/dcumem": "8192", "hygon.com/dcucores": "25"},
    ),
    "cambricon-whole": (
        dict(vendor="cambricon", k8s_resource="cambricon.com/mlu", k8s_product="MLU370-X8", gpus_per_node=2),
        {"cambricon.com/mlu": "2"},
    ),
    "cambricon-slice": (  # HAMi counts Cambricon's slice memory in 256 MiB: 4096 MiB is 16
        dict(
            vendor="cambricon",
            k8s_resource="cambricon.com/mlu",
            k8s_product="MLU370-X8",
            share="slice",
            gpus_per_node=1,
            gpu_memory_mib=4_096,
            gpu_cores_pct=40,
        ),
        {
            "cambricon.com/vmlu": "1",
            "cambricon.com/mlu.smlu.vmemory": "16",
            "cambricon.com/mlu.smlu.vcore": "40",
        },
    ),
    "huawei-whole": (
        dict(
            vendor="huawei", k8s_resource="huawei.com/Ascend910B", k8s_product="Ascend910B", gpus_per_node=8
        ),
        {"huawei.com/Ascend910B": "8"},
    ),
    "huawei-slice": (  # HAMi picks the vNPU template by memory: Ascend slices have no compute figure
        dict(
            vendor="huawei",
            k8s_resource="huawei.com/Ascend910B",
            k8s_product="Ascend910B",
            share="slice",
            gpus_per_node=1,
            gpu_memory_mib=16_384,
        ),
        {"huawei.com/Ascend910B": "1", "huawei.com/Ascend910B-memory": "16384"},
    ),
}
PRODUCT_LABELS = {
    "nvidia": "nvidia.com/gpu.product",
    "amd": "amd.com/gpu.product-name",
    "hygon": "hygon.com/dcu.model",
    "cambricon": "cambricon.com/mlu.model",
    "huawei": "huawei.com/gpu.product",  # no labeller of its own in GPU_RESOURCES: the default
}


def case_spec(case: str, **overrides) -> JobSpec:
    fields, _resources = CASES[case]
    return make_spec(**(fields | overrides))


def job_of(case: str, *, nodes: int = 1, **config) -> dict:
    return m.job_manifest(case_spec(case, nodes=nodes), make_config(**config))


def container(job: dict) -> dict:
    (c,) = job["spec"]["template"]["spec"]["containers"]
    return c


def extended(resources: dict) -> dict:
    return {name: value for name, value in resources.items() if "/" in name}


def as_whole(spec: JobSpec) -> JobSpec:
    return replace(spec, share="whole", mig_profile="", gpu_memory_mib=0, gpu_cores_pct=0)


def without_devices(job: dict) -> dict:
    """The Job with its container's extended resources and its pod's schedulerName left out."""
    job = copy.deepcopy(job)
    resources = container(job)["resources"]
    for kind in ("requests", "limits"):
        resources[kind] = {name: value for name, value in resources[kind].items() if "/" not in name}
    job["spec"]["template"]["spec"].pop("schedulerName", None)
    return job


def test_every_vendor_and_share_kind_is_covered():
    assert {fields["vendor"] for fields, _ in CASES.values()} == set(shares.VISIBLE_DEVICES)
    for vendor in shares.VISIBLE_DEVICES:
        kinds = {fields.get("share", "whole") for fields, _ in CASES.values() if fields["vendor"] == vendor}
        expected = {"whole"} | ({"mig"} if vendor == "nvidia" else set())
        expected |= {"slice"} if vendor in shares.SLICE_RESOURCES else set()
        assert kinds == expected, vendor


# ----------------------------------------------------------------- schemas --
@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_share_job_is_valid_for_every_version(case, version):
    for manifest in (
        job_of(case),
        job_of(case, uses_kueue=True),
        *m.job_manifests(
            case_spec(case, nodes=2), make_config(), job_uid="5f1c7a52-1111-2222-3333-444455556666"
        ),
    ):
        assert kubernetes_validate.validate(manifest, version, strict=True) == version


# ---------------------------------------------------------------- job shape --
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_pod_asks_for_its_share_by_the_vendors_names(case):
    fields, expected = CASES[case]
    job = job_of(case)
    resources = container(job)["resources"]
    assert extended(resources["requests"]) == extended(resources["limits"]) == expected
    assert resources["requests"] == resources["limits"]  # extended resources cannot be overcommitted
    units = fields["gpus_per_node"]
    assert (
        resources["limits"]["cpu"] == str(6 * units)
        and resources["limits"]["memory"] == f"{32_000 * units}Mi"
    )
    pod = job["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {PRODUCT_LABELS[fields["vendor"]]: fields["k8s_product"]}
    assert pod["tolerations"] == [
        {"key": fields["k8s_resource"], "operator": "Exists", "effect": "NoSchedule"}
    ]
    if fields.get("share") == "slice":
        assert pod["schedulerName"] == shares.HAMI_SCHEDULER == "hami-scheduler"
    else:
        assert "schedulerName" not in pod


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_share_changes_only_the_devices_and_the_scheduler(case):
    """Everything the pod isolation test holds of a whole-device job holds of every share: the
    manifests differ in the container's extended resources and a slice's schedulerName only."""
    assert without_devices(job_of(case)) == without_devices(
        m.job_manifest(as_whole(case_spec(case)), make_config())
    )


def test_a_multinode_mig_job_asks_per_pod():
    job = job_of("nvidia-mig", nodes=3)
    assert job["spec"]["completionMode"] == "Indexed" and job["spec"]["parallelism"] == 3
    assert extended(container(job)["resources"]["limits"]) == {"nvidia.com/mig-3g.71gb": "2"}


@pytest.mark.parametrize(
    ("overrides", "why"),
    [
        ({"share": "shard"}, "Slurm's gres/shard"),
        ({"share": "half"}, "is not one of whole, mig, slice"),
        ({"vendor": "intel"}, "is not one of nvidia"),
        ({"share": "mig", "mig_profile": "3g.71gb", "vendor": "amd"}, "MIG instances are NVIDIA's"),
        ({"share": "mig", "mig_profile": ""}, "is not <g>g.<memory>gb"),
        ({"share": "mig", "mig_profile": "3g.71gb\nhostNetwork: true"}, "is not <g>g.<memory>gb"),
        ({"share": "mig", "mig_profile": "../gpu"}, "is not <g>g.<memory>gb"),
        ({"share": "mig", "mig_profile": "1g.18gb+me"}, "is not <g>g.<memory>gb"),
        ({"share": "slice", "gpus_per_node": 1, "gpu_memory_mib": 1024, "vendor": "amd"}, "no shared slices"),
        (
            {"share": "slice", "gpus_per_node": 2, "gpu_memory_mib": 1024, "gpu_cores_pct": 10},
            "one shared device",
        ),
        ({"share": "slice", "gpus_per_node": 1, "gpu_memory_mib": 0, "gpu_cores_pct": 10}, "slice memory"),
        (
            {"share": "slice", "gpus_per_node": 1, "gpu_memory_mib": 1024, "gpu_cores_pct": 0},
            "compute percentage",
        ),
        ({"share": "slice", "gpus_per_node": 1, "gpu_memory_mib": 1024, "gpu_cores_pct": 101}, "at most 100"),
        (
            {
                "share": "slice",
                "gpus_per_node": 1,
                "gpu_memory_mib": 1000,
                "gpu_cores_pct": 10,
                "vendor": "cambricon",
            },
            "steps of 256 MiB",
        ),
    ],
)
def test_a_share_kubernetes_cannot_give_is_refused(overrides, why):
    with pytest.raises(BackendError, match=why):
        m.job_manifest(make_spec(**overrides), make_config())


HOSTILE = ["", "x\nhostNetwork: true", '{"hostPID": true}', "../kube-system", "$(HOME)", "\x00", "a" * 300]


HOSTILE_FIELDS = {
    "share": st.one_of(st.sampled_from(["whole", "mig", "slice", "shard", *HOSTILE]), st.text(max_size=12)),
    "vendor": st.one_of(st.sampled_from([*shares.VISIBLE_DEVICES, *HOSTILE]), st.text(max_size=12)),
    "mig_profile": st.one_of(
        st.sampled_from(["3g.71gb", "1g.18gb", "1g.18gb+me", *HOSTILE]), st.text(max_size=20)
    ),
    "gpu_memory_mib": st.integers(-1, 300_000),
    "gpu_cores_pct": st.integers(-1, 150),
    "gpus_per_node": st.integers(-1, 9),
}


@st.composite
def share_specs(draw) -> JobSpec:
    """A case's job with at most two of its share fields drawn from hostile pools."""
    case = draw(st.sampled_from(sorted(CASES)))
    names = draw(st.sets(st.sampled_from(sorted(HOSTILE_FIELDS)), max_size=2))
    return case_spec(case, **{name: draw(HOSTILE_FIELDS[name]) for name in names})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=share_specs())
def test_no_share_input_gets_past_the_checks(spec):
    """Whatever the share fields hold, the job is refused, or its pod asks for extended resources
    by valid names in whole, positive numbers, and differs from a whole-device job in those alone."""
    try:
        job = m.job_manifest(spec, make_config())
    except BackendError:
        event("refused")
        return
    event(f"accepted {spec.share}")
    devices = extended(container(job)["resources"]["limits"])
    assert devices == extended(container(job)["resources"]["requests"])
    for name, quantity in devices.items():
        assert check_resource(name) == name and quantity.isdigit() and int(quantity) >= 1
    pod = job["spec"]["template"]["spec"]
    assert pod.get("schedulerName", shares.HAMI_SCHEDULER) == shares.HAMI_SCHEDULER
    assert without_devices(job) == without_devices(m.job_manifest(as_whole(spec), make_config()))
    assert kubernetes_validate.validate(job, KUBERNETES_VERSIONS[-1], strict=True)


# ------------------------------------------------------------------ tenant --
def quota_resources(*grants: dict) -> dict[str, int]:
    """TenantLimits.k8s_resources as tenants/limits.py fills it: shares.k8s_quota_resources per grant."""
    found: dict[str, int] = {}
    for grant in grants:
        for name, units in shares.k8s_quota_resources(**grant).items():
            found[name] = found.get(name, 0) + units
    return found


GRANTS = [
    dict(vendor="nvidia", resource="nvidia.com/gpu", kind="whole", units=4),
    dict(vendor="nvidia", resource="nvidia.com/gpu", kind="mig", units=2, mig_profile="3g.71gb"),
    dict(vendor="nvidia", resource="nvidia.com/gpu", kind="mig", units=7, mig_profile="1g.18gb"),
    dict(vendor="nvidia", resource="nvidia.com/gpu", kind="slice", units=3),
    dict(vendor="cambricon", resource="cambricon.com/mlu", kind="slice", units=3),
    dict(vendor="huawei", resource="huawei.com/Ascend910B", kind="whole", units=8),
    dict(vendor="hygon", resource="hygon.com/dcunum", kind="slice", units=2),
]
LIMITS = TenantLimits(
    account="protein-lab",
    qos="portal-high",
    users=[],
    gpus_by_type={},
    gpu_minutes=60_000,
    k8s_resources=quota_resources(*GRANTS),
)


def test_the_quota_bounds_every_granted_share_and_keeps_the_known_devices_at_zero():
    hard = resource_quota_manifest(LIMITS, make_config())["spec"]["hard"]
    assert hard == {
        "requests.amd.com/gpu": "0",  # no grant: none
        "requests.cambricon.com/mlu": "0",
        "requests.cambricon.com/vmlu": "3",
        "requests.huawei.com/Ascend910B": "8",
        "requests.hygon.com/dcunum": "2",
        "requests.nvidia.com/gpu": "7",  # 4 whole devices and 3 shared ones
        "requests.nvidia.com/mig-1g.18gb": "7",
        "requests.nvidia.com/mig-3g.71gb": "2",
        "count/jobs.batch": "500",
    }
    assert not any(key.startswith("limits.") for key in hard)  # extended resources: requests. only
    (item,) = limit_range_manifest(LIMITS)["spec"]["limits"]
    granted = {
        key.removeprefix("requests."): value for key, value in hard.items() if key.startswith("requests.")
    }
    assert item["max"] == granted
    assert set(item["default"]) == set(item["defaultRequest"]) == set(item["max"])
    assert set(item["default"].values()) == set(item["defaultRequest"].values()) == {"0"}


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_quota_and_limit_range_of_shares_are_valid_for_every_version(version):
    for manifest in (resource_quota_manifest(LIMITS, make_config()), limit_range_manifest(LIMITS)):
        assert kubernetes_validate.validate(manifest, version, strict=True) == version


@pytest.mark.parametrize("case", sorted(CASES))
def test_what_a_pod_asks_for_is_what_the_quota_counts(case):
    """The quota's resource of a share (k8s_quota_resources) is among what its pod requests, one unit
    per unit: a grant of N units admits N units of jobs, no more."""
    fields, _expected = CASES[case]
    units = fields["gpus_per_node"]
    counted = shares.k8s_quota_resources(
        vendor=fields["vendor"],
        resource=fields["k8s_resource"],
        kind=fields.get("share", "whole"),
        units=units,
        mig_profile=fields.get("mig_profile", ""),
    )
    requests = container(job_of(case))["resources"]["requests"]
    assert {name: str(count) for name, count in counted.items()}.items() <= requests.items()


def test_an_ended_grant_leaves_a_zero_not_a_gap():
    before = replace(LIMITS, k8s_resources={"nvidia.com/mig-3g.71gb": 2, "cambricon.com/vmlu": 1})
    after = replace(LIMITS, k8s_resources={"nvidia.com/gpu": 4})
    current_quota = resource_quota_manifest(before, make_config())
    current_quota["spec"]["hard"]["requests.cpu"] = "64"  # not an accelerator: not kept
    quota = keep_revoked(resource_quota_manifest(after, make_config()), current_quota)
    assert quota["spec"]["hard"]["requests.nvidia.com/mig-3g.71gb"] == "0"
    assert quota["spec"]["hard"]["requests.cambricon.com/vmlu"] == "0"
    assert (
        quota["spec"]["hard"]["requests.nvidia.com/gpu"] == "4"
        and "requests.cpu" not in quota["spec"]["hard"]
    )
    limit_range = keep_revoked(limit_range_manifest(after), limit_range_manifest(before))
    (item,) = limit_range["spec"]["limits"]
    for field in ("max", "default", "defaultRequest"):
        assert item[field]["nvidia.com/mig-3g.71gb"] == item[field]["cambricon.com/vmlu"] == "0"
    assert item["max"]["nvidia.com/gpu"] == "4"
    same = resource_quota_manifest(after, make_config())
    assert keep_revoked(same, same) == same  # nothing ended: nothing added
    for manifest in (quota, limit_range):
        assert kubernetes_validate.validate(manifest, KUBERNETES_VERSIONS[-1], strict=True)


# ------------------------------------------------- against the API server --
API_TOKEN = "fake-api-token-shares"
H200 = "NVIDIA-H200"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
H200_MEMORY_MIB = shares.device_memory_mib(141)
NODES = [
    {  # MIG in the mixed strategy: two 3g.71gb instances per device
        "name": "h200-mig",
        "labels": {"nvidia.com/gpu.product": H200, "nvidia.com/mig.strategy": "mixed"},
        "capacity": {"nvidia.com/mig-3g.71gb": "4", "cpu": "64", "memory": "512Gi", "pods": "110"},
        "taints": [GPU_TAINT],
    },
    {  # HAMi: shared devices, their memory and cores (its scheduler's accounting, here the fake's)
        "name": "h200-hami",
        "labels": {"nvidia.com/gpu.product": H200},
        "capacity": {
            "nvidia.com/gpu": "40",
            "nvidia.com/gpumem": str(4 * H200_MEMORY_MIB),
            "nvidia.com/gpucores": "400",
            "cpu": "64",
            "memory": "512Gi",
            "pods": "110",
        },
        "taints": [GPU_TAINT],
    },
]
DEADLINE_S = 30


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer(token=API_TOKEN, nodes=NODES) as server:
        yield server
        assert server.cluster.errors == []


@pytest.fixture
def backend(api) -> KubernetesBackend:
    backend = backend_for(
        make_config(slug=f"fake-{uuid.uuid4().hex[:8]}", k8s_api_url=api.url, k8s_token=API_TOKEN)
    )
    assert isinstance(backend, KubernetesBackend)
    return backend


def tenant(k8s_resources: dict[str, int] | None = None) -> TenantLimits:
    return TenantLimits(
        account="protein-lab",
        qos="portal-normal",
        users=[],
        gpus_by_type={},
        gpu_minutes=6_000,
        k8s_resources=k8s_resources or {},
    )


def api_spec(case: str, script: str = "sleep 30", **overrides) -> JobSpec:
    values = {"token": uuid.uuid4().hex, "script": script, "qos": "portal-normal", "cpus_per_gpu": 1}
    values |= {"mem_per_gpu_mb": 1000, "k8s_product": H200, "env": {}}
    return case_spec(case, **(values | overrides))


def wait_for(
    backend: KubernetesBackend, backend_id: str, done: Callable[[base.JobStatus], bool]
) -> base.JobStatus:
    deadline, status = time.monotonic() + DEADLINE_S, None
    while time.monotonic() < deadline:
        status = backend.poll([backend_id]).get(backend_id)
        if status is not None and done(status):
            return status
        time.sleep(0.1)
    raise AssertionError(f"{backend_id}: still {status} after {DEADLINE_S}s")


def running(status: base.JobStatus) -> bool:
    return status.state == base.JobState.RUNNING


def over_quota(status: base.JobStatus) -> bool:
    return status.reason == "ExceededQuota"


def pods_of(api: FakeApiServer, backend_id: str) -> list[dict]:
    token = backend_id.split("/pj-")[1]
    return [p for p in api.objects("Pod") if p["metadata"]["labels"].get("gpu-portal/token") == token]


def test_a_quota_of_one_mig_instance_admits_one_job_and_refuses_the_second(api, backend):
    mig = {"nvidia.com/mig-3g.71gb": 1}
    backend.apply_tenant(tenant(mig))
    (quota,) = api.objects("ResourceQuota")
    assert quota["spec"]["hard"]["requests.nvidia.com/mig-3g.71gb"] == "1"

    first = backend.submit(api_spec("nvidia-mig", gpus_per_node=1))
    assert wait_for(backend, first, running).state == base.JobState.RUNNING
    (pod,) = pods_of(api, first)
    assert pod["spec"]["nodeName"] == "h200-mig"
    assert extended(pod["spec"]["containers"][0]["resources"]["requests"]) == {"nvidia.com/mig-3g.71gb": "1"}

    second = backend.submit(api_spec("nvidia-mig", gpus_per_node=1))
    status = wait_for(backend, second, over_quota)
    assert (status.state, status.raw_state) == (base.JobState.PENDING, "FailedCreate")
    assert pods_of(api, second) == []
    refused = [e for e in api.objects("Event") if e["reason"] == "FailedCreate"]
    assert refused and refused[0]["involvedObject"]["name"] == second.split("/")[1]
    assert refused[0]["message"].endswith(
        "is forbidden: exceeded quota: gpu-portal, requested: requests.nvidia.com/mig-3g.71gb=1, "
        "used: requests.nvidia.com/mig-3g.71gb=1, limited: requests.nvidia.com/mig-3g.71gb=1"
    )
    # the node had room for both: the quota alone held the second back, until the first ended
    backend.cancel(first)
    assert wait_for(backend, second, running).state == base.JobState.RUNNING
    backend.cancel(second)


def test_a_mig_grant_that_ended_stays_at_zero_in_the_cluster(api, backend):
    backend.apply_tenant(tenant({"nvidia.com/mig-3g.71gb": 2, "nvidia.com/gpu": 1}))
    backend.apply_tenant(tenant({"nvidia.com/gpu": 1}))  # the MIG grant ended
    (quota,) = api.objects("ResourceQuota")
    assert quota["spec"]["hard"]["requests.nvidia.com/mig-3g.71gb"] == "0"
    assert quota["spec"]["hard"]["requests.nvidia.com/gpu"] == "1"
    (limit_range,) = api.objects("LimitRange")
    assert limit_range["spec"]["limits"][0]["max"]["nvidia.com/mig-3g.71gb"] == "0"
    before = len(api.requests)
    backend.apply_tenant(tenant({"nvidia.com/gpu": 1}))
    assert [r for r in api.requests[before:] if r[0] != "GET"] == []  # a second run only reads
    refused = backend.submit(api_spec("nvidia-mig", gpus_per_node=1))
    assert wait_for(backend, refused, over_quota).state == base.JobState.PENDING
    backend.cancel(refused)


def test_a_slice_runs_under_hamis_scheduler_and_counts_as_one_shared_device(api, backend):
    backend.apply_tenant(tenant({"nvidia.com/gpu": 1}))
    first = backend.submit(api_spec("nvidia-slice"))
    assert wait_for(backend, first, running).state == base.JobState.RUNNING
    (pod,) = pods_of(api, first)
    assert pod["spec"]["schedulerName"] == "hami-scheduler" and pod["spec"]["nodeName"] == "h200-hami"
    assert extended(pod["spec"]["containers"][0]["resources"]["limits"]) == CASES["nvidia-slice"][1]
    second = backend.submit(api_spec("nvidia-slice"))
    wait_for(backend, second, over_quota)
    (event,) = [e for e in api.objects("Event") if e["reason"] == "FailedCreate"]
    assert "requested: requests.nvidia.com/gpu=1, used: requests.nvidia.com/gpu=1" in event["message"]
    backend.cancel(first)
    backend.cancel(second)


def test_every_share_is_accepted_by_the_api_server(api, backend):
    """The API server's validation (integers, requests equal to limits) takes every vendor's job."""
    backend.apply_tenant(tenant())
    for case in sorted(CASES):
        backend_id = backend.submit(api_spec(case, script="true", k8s_product=CASES[case][0]["k8s_product"]))
        assert backend_id.startswith("protein-lab/pj-")
    assert len(api.objects("Job")) == len(CASES)


def test_a_shard_never_reaches_the_api(api, backend):
    backend.apply_tenant(tenant())
    before = len(api.requests)
    with pytest.raises(BackendError, match="Slurm's gres/shard"):
        backend.submit(api_spec("nvidia-whole", share="shard", gpus_per_node=1))
    assert api.requests[before:] == []
