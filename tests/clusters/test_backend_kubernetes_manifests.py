"""The Kubernetes backend's manifests and state mapping, as pure functions: no API server.

Every built-in object is validated against the Kubernetes schemas (kubernetes-validate, strict)
of each version in KUBERNETES_VERSIONS; Kueue's objects (CRDs) are checked by hand.
"""

from __future__ import annotations

import re
from dataclasses import replace

import kubernetes_validate
import pytest

from clusters.backends.base import BackendError, TenantLimits
from clusters.backends.kubernetes import KUBERNETES_VERSIONS
from clusters.backends.kubernetes import manifests as m
from clusters.backends.kubernetes.common import backend_id, job_name, parse_backend_id
from clusters.backends.kubernetes.kueue import local_queue_manifest, workload_priority_class_manifests
from clusters.backends.kubernetes.rbac import cluster_role_manifest
from clusters.backends.kubernetes.tenant import (
    limit_range_manifest,
    namespace_manifest,
    network_policy_manifest,
    priority_class_manifests,
    resource_quota_manifest,
    scratch_claim_manifest,
    tenant_manifests,
)
from tests.k8s_support import TOKEN, make_config, make_spec

LABEL_VALUE = re.compile(r"(?:[A-Za-z0-9](?:[A-Za-z0-9._-]{0,61}[A-Za-z0-9])?)?")
DNS_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")


LIMITS = TenantLimits(
    account="protein-lab",
    qos="portal-high",
    users=[],
    gpus_by_type={"h100": 8, "mi250x": 2},
    gpu_minutes=60_000,
    k8s_resources={"nvidia.com/gpu": 8, "amd.com/gpu": 2},
)


def built_in_manifests() -> dict[str, dict]:
    """Every built-in object the backend writes, by a readable id."""
    plain, kueue = make_config(), make_config(uses_kueue=True)
    multi = make_spec(nodes=3)
    found = {
        "namespace": namespace_manifest(LIMITS),
        "resourcequota": resource_quota_manifest(LIMITS, plain),
        "limitrange": limit_range_manifest(LIMITS),
        "networkpolicy": network_policy_manifest(LIMITS),
        "persistentvolumeclaim": scratch_claim_manifest(LIMITS, plain),
        "job-single": m.job_manifest(make_spec(), plain),
        "job-single-kueue": m.job_manifest(make_spec(), kueue),
        "job-indexed": m.job_manifest(multi, plain),
        "job-indexed-kueue": m.job_manifest(multi, kueue),
        "service-rendezvous": m.job_manifests(multi, plain, job_uid="5f1c7a52-1111-2222-3333-444455556666")[
            1
        ],
        "service-rendezvous-no-owner": m.job_manifests(multi, kueue)[1],
        "clusterrole": cluster_role_manifest(),
    }
    for pc in priority_class_manifests():
        found[f"priorityclass-{pc['metadata']['name']}"] = pc
    return found


MANIFESTS = built_in_manifests()


# ------------------------------------------------------------------ schemas --
def test_versions_are_shipped_by_kubernetes_validate():
    shipped = set(kubernetes_validate.utils.all_versions())
    assert (
        tuple(sorted(KUBERNETES_VERSIONS, key=lambda v: tuple(map(int, v.split("."))))) == KUBERNETES_VERSIONS
    )
    for version in KUBERNETES_VERSIONS:
        assert f"{version}.0" in shipped
    assert len(KUBERNETES_VERSIONS) >= 5


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("name", sorted(MANIFESTS))
def test_manifest_is_valid_for_every_version(name, version):
    assert kubernetes_validate.validate(MANIFESTS[name], version, strict=True) == version


def test_tenant_manifests_are_all_checked():
    """Every object apply_tenant writes is either schema-validated above or a Kueue CRD below."""
    kinds = [x["kind"] for x in tenant_manifests(LIMITS, make_config(uses_kueue=True))]
    assert kinds == [
        *["PriorityClass"] * 5,  # the four tiers and portal-borrow
        *["WorkloadPriorityClass"] * 5,
        "Namespace",
        "ResourceQuota",
        "LimitRange",
        "NetworkPolicy",
        "PersistentVolumeClaim",
        "LocalQueue",
    ]
    plain = [x["kind"] for x in tenant_manifests(LIMITS, make_config())]
    assert "LocalQueue" not in plain and "WorkloadPriorityClass" not in plain
    no_scratch = [x["kind"] for x in tenant_manifests(LIMITS, make_config(k8s_scratch_gib=0))]
    assert "PersistentVolumeClaim" not in no_scratch
    in_cohort = replace(LIMITS, cohort="h100-pool")
    cohort_kinds = [x["kind"] for x in tenant_manifests(in_cohort, make_config(uses_kueue=True))]
    assert cohort_kinds == [*kinds[:10], "ResourceFlavor", "ClusterQueue", *kinds[10:]]
    checked = {x["kind"] for x in MANIFESTS.values()}
    # the Kueue CRDs: by hand here and against their schemas in test_k8s_lending.py
    assert set(cohort_kinds) - checked == {
        "LocalQueue",
        "WorkloadPriorityClass",
        "ResourceFlavor",
        "ClusterQueue",
    }


def test_a_broken_manifest_is_refused_by_the_validator():
    """The validation above can fail: a typo'd field and a wrong type are caught."""
    job = m.job_manifest(make_spec(), make_config())
    job["spec"]["backofLimit"] = 0
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, KUBERNETES_VERSIONS[-1], strict=True)
    job = m.job_manifest(make_spec(), make_config())
    job["spec"]["activeDeadlineSeconds"] = "5400"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, KUBERNETES_VERSIONS[0], strict=True)


def test_local_queue_shape():
    lq = local_queue_manifest(LIMITS, make_config(uses_kueue=True, k8s_kueue_cluster_queue="gpu-pool"))
    assert lq == {
        "apiVersion": "kueue.x-k8s.io/v1beta1",
        "kind": "LocalQueue",
        "metadata": {
            "name": "portal",
            "namespace": "protein-lab",
            "labels": {"app.kubernetes.io/managed-by": "gpu-portal"},
        },
        "spec": {"clusterQueue": "gpu-pool"},
    }
    with pytest.raises(BackendError):
        local_queue_manifest(LIMITS, make_config(k8s_kueue_cluster_queue="Not A Name"))


def test_workload_priority_classes_shape():
    wpcs = workload_priority_class_manifests()
    assert [w["metadata"]["name"] for w in wpcs] == [
        "portal-low",
        "portal-normal",
        "portal-high",
        "portal-critical",
        "portal-borrow",
    ]
    for wpc in wpcs:
        assert set(wpc) == {"apiVersion", "kind", "metadata", "value", "description"}
        assert wpc["apiVersion"] == "kueue.x-k8s.io/v1beta1" and wpc["kind"] == "WorkloadPriorityClass"
        assert isinstance(wpc["value"], int) and DNS_LABEL.fullmatch(wpc["metadata"]["name"])
    values = [w["value"] for w in wpcs]
    assert values[:4] == sorted(values[:4]) and values[4] < values[0]  # jobs on borrowed GPUs lowest
    assert values == [pc["value"] for pc in priority_class_manifests()]


# ------------------------------------------------------------------- tenant --
def test_namespace_is_labelled_with_the_tenant():
    labels = MANIFESTS["namespace"]["metadata"]["labels"]
    assert MANIFESTS["namespace"]["metadata"]["name"] == "protein-lab"
    assert labels["gpu-portal/tenant"] == "protein-lab"
    assert labels["app.kubernetes.io/managed-by"] == "gpu-portal"
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"


def test_resource_quota_from_grants():
    hard = MANIFESTS["resourcequota"]["spec"]["hard"]
    assert hard == {
        "requests.amd.com/gpu": "2",
        "requests.cambricon.com/mlu": "0",  # no grant: none
        "requests.hygon.com/dcunum": "0",
        "requests.nvidia.com/gpu": "8",
        "count/jobs.batch": "500",
    }
    none = resource_quota_manifest(replace(LIMITS, k8s_resources={}), make_config(k8s_max_jobs_per_tenant=20))
    assert set(none["spec"]["hard"].values()) == {"0", "20"}


def test_limit_range_caps_gpus_per_container_and_defaults_to_none():
    (item,) = MANIFESTS["limitrange"]["spec"]["limits"]
    assert item["type"] == "Container"
    assert item["max"]["nvidia.com/gpu"] == "8" and item["max"]["amd.com/gpu"] == "2"
    assert item["max"]["cambricon.com/mlu"] == "0"
    assert set(item["default"].values()) == set(item["defaultRequest"].values()) == {"0"}


def test_priority_class_per_tier():
    classes = {
        k.removeprefix("priorityclass-"): v for k, v in MANIFESTS.items() if k.startswith("priorityclass-")
    }
    names = ["portal-borrow", "portal-low", "portal-normal", "portal-high", "portal-critical"]
    assert sorted(classes) == sorted(names)
    values = [classes[name]["value"] for name in names]
    assert values == sorted(values) and max(values) < 1_000_000_000  # below the system classes
    assert values[0] > 0  # above pods that name no class (0): borrowed GPUs go to them last
    assert not any(pc["globalDefault"] for pc in classes.values())
    assert (
        classes["portal-low"]["preemptionPolicy"] == classes["portal-borrow"]["preemptionPolicy"] == "Never"
    )
    assert classes["portal-normal"]["preemptionPolicy"] == "PreemptLowerPriority"


def test_network_policy_denies_other_namespaces():
    spec = MANIFESTS["networkpolicy"]["spec"]
    assert spec == {
        "podSelector": {},
        "policyTypes": ["Ingress"],
        "ingress": [{"from": [{"podSelector": {}}]}],
    }


@pytest.mark.parametrize("account", ["default", "kube-system", "Bad_Name", "a" * 64, "", "-x"])
def test_reserved_or_invalid_namespaces_are_refused(account):
    with pytest.raises(BackendError):
        namespace_manifest(replace(LIMITS, account=account))


def test_unknown_tier_and_bad_resource_are_refused():
    with pytest.raises(BackendError):
        tenant_manifests(replace(LIMITS, qos="portal-gold"), make_config())
    with pytest.raises(BackendError):
        resource_quota_manifest(replace(LIMITS, k8s_resources={"gpu; rm -rf /": 1}), make_config())
    with pytest.raises(BackendError):
        resource_quota_manifest(replace(LIMITS, k8s_resources={"nvidia.com/gpu": -1}), make_config())


# ---------------------------------------------------------------------- job --
def pod_spec(job: dict) -> dict:
    return job["spec"]["template"]["spec"]


def container(job: dict) -> dict:
    (c,) = pod_spec(job)["containers"]
    return c


def expand(text: str, env: dict[str, str]) -> str:
    """What the kubelet makes of a command or env value: "$$" → "$", "$(NAME)" → NAME's value
    when NAME is defined before, anything else unchanged (Kubernetes' expansion rules)."""
    return re.sub(r"\$(\$|\(([^)]*)\))", lambda g: "$" if g[1] == "$" else env.get(g[2], g[0]), text)


def env_of(job: dict) -> dict[str, str]:
    """The container's environment as the process sees it."""
    env: dict[str, str] = {}
    for entry in container(job)["env"]:
        env[entry["name"]] = expand(entry["value"], env)
    return env


def script_of(job: dict) -> list[str]:
    """The container's command as the process receives it."""
    return [expand(arg, env_of(job)) for arg in container(job)["command"]]


def test_names_come_from_the_token():
    job = MANIFESTS["job-single"]
    assert job["metadata"]["name"] == f"pj-{TOKEN}" and DNS_LABEL.fullmatch(job["metadata"]["name"])
    assert job["metadata"]["namespace"] == "protein-lab"
    assert backend_id("protein-lab", f"pj-{TOKEN}") == f"protein-lab/pj-{TOKEN}"
    assert parse_backend_id(f"protein-lab/pj-{TOKEN}") == ("protein-lab", f"pj-{TOKEN}")
    for bad in ["12345", "protein-lab/other", "kube-system/pj-abc", "a/b/pj-x", f"protein-lab/pj-{TOKEN}/x"]:
        with pytest.raises(BackendError):
            parse_backend_id(bad)
    for bad in ["", "ABC", "a-b", "x" * 41, "../x"]:
        with pytest.raises(BackendError):
            job_name(bad)


def test_labels_on_job_and_pods():
    job = MANIFESTS["job-single"]
    expected = {
        "app.kubernetes.io/managed-by": "gpu-portal",
        "gpu-portal/token": TOKEN,
        "gpu-portal/tenant": "protein-lab",
        "gpu-portal/job": "42",
        "gpu-portal/scenario": "ai-training",
    }
    assert job["metadata"]["labels"] == expected
    assert job["spec"]["template"]["metadata"]["labels"] == expected
    assert job["metadata"]["annotations"]["gpu-portal/name"] == "train resnet"
    odd = m.job_manifest(
        make_spec(labels={"tenant": "x" * 80, "job": "7", "scenario": "cfd/fea (beta)"}), make_config()
    )
    for value in odd["metadata"]["labels"].values():
        assert LABEL_VALUE.fullmatch(value) and len(value) <= 63
    assert odd["metadata"]["labels"]["gpu-portal/scenario"] == "cfd-fea-beta"


@pytest.mark.parametrize(
    ("resource", "product_label"),
    [
        ("nvidia.com/gpu", "nvidia.com/gpu.product"),
        ("amd.com/gpu", "amd.com/gpu.product-name"),
        ("cambricon.com/mlu", "cambricon.com/mlu.model"),
        ("hygon.com/dcunum", "hygon.com/dcu.model"),
    ],
)
def test_gpu_limit_node_selector_and_toleration_by_vendor(resource, product_label):
    job = m.job_manifest(
        make_spec(k8s_resource=resource, k8s_product="Model-X_1.0", gpus_per_node=2), make_config()
    )
    resources = container(job)["resources"]
    assert resources["limits"][resource] == resources["requests"][resource] == "2"
    assert resources["limits"]["cpu"] == "12" and resources["limits"]["memory"] == "64000Mi"
    assert [k for k in resources["limits"] if "/" in k] == [resource]
    assert pod_spec(job)["nodeSelector"] == {product_label: "Model-X_1.0"}
    assert pod_spec(job)["tolerations"] == [{"key": resource, "operator": "Exists", "effect": "NoSchedule"}]
    assert kubernetes_validate.validate(job, KUBERNETES_VERSIONS[-1], strict=True)


def test_job_limits_and_policies():
    job = MANIFESTS["job-single"]
    spec = job["spec"]
    assert spec["activeDeadlineSeconds"] == 90 * 60
    assert spec["backoffLimit"] == 0
    assert spec["ttlSecondsAfterFinished"] == 86_400
    assert spec["completions"] == spec["parallelism"] == 1
    assert "completionMode" not in spec and "suspend" not in spec
    assert pod_spec(job)["restartPolicy"] == "Never"
    assert pod_spec(job)["priorityClassName"] == "portal-high"
    assert pod_spec(job)["automountServiceAccountToken"] is False
    ttl = m.job_manifest(make_spec(), make_config(k8s_job_ttl_s=600))
    assert ttl["spec"]["ttlSecondsAfterFinished"] == 600


def test_security_context_is_non_root_and_drops_everything():
    job = MANIFESTS["job-single"]
    pod, c = pod_spec(job)["securityContext"], container(job)["securityContext"]
    assert pod["runAsNonRoot"] is True and pod["runAsUser"] != 0
    assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
    assert c["runAsNonRoot"] is True
    assert c["allowPrivilegeEscalation"] is False
    assert c["privileged"] is False
    assert c["capabilities"] == {"drop": ["ALL"]}
    assert c["seccompProfile"] == {"type": "RuntimeDefault"}


def test_the_script_runs_in_the_container_image():
    job = MANIFESTS["job-single"]
    assert script_of(job) == ["/bin/bash", "-c", make_spec().script]
    assert container(job)["image"] == "docker.io/library/python:3.11-slim"
    custom = m.job_manifest(make_spec(image="nvcr.io/nvidia/pytorch:24.05-py3"), make_config())
    assert container(custom)["image"] == "nvcr.io/nvidia/pytorch:24.05-py3"
    own = m.job_manifest(make_spec(), make_config(k8s_image="registry.local/portal/base:1"))
    assert container(own)["image"] == "registry.local/portal/base:1"
    for bad in ["bad image", "x\n", "-flag"]:
        with pytest.raises(BackendError):
            m.job_manifest(make_spec(image=bad), make_config())


INJECTIONS = {
    "SEMI": "a; rm -rf /",
    "SUBST": "$(cat /etc/passwd)",
    "BACKTICK": "`id`",
    "NEWLINE": "line1\nexport EVIL=1\nline3",
    "QUOTES": 'it\'s "quoted" \\ done',
    "DOLLAR": "${HOME}",
}


def test_env_values_arrive_as_data():
    job = m.job_manifest(make_spec(env=INJECTIONS), make_config())
    env = env_of(job)
    for name, value in INJECTIONS.items():
        assert env[name] == value  # verbatim: an env entry, never part of a shell string
        assert {"name": name, "value": m.literal(value)} in container(job)["env"]
    assert script_of(job) == ["/bin/bash", "-c", make_spec().script]
    for value in INJECTIONS.values():
        assert value not in container(job)["command"][2]


def test_kubernetes_expansion_leaves_script_and_values_alone():
    """Kubernetes expands $(VAR) and $$ in command and env values: the backend doubles every $,
    so that the shell gets the script and the values exactly as written."""
    script = 'echo "$$ $(HOME) $(OMP_NUM_THREADS) ${X} $((1+1)) $"\n'
    env = {"OMP_NUM_THREADS": "8", "REF": "$(OMP_NUM_THREADS)", "PIDS": "$$$$"}
    job = m.job_manifest(make_spec(script=script, env=env), make_config())
    assert script_of(job)[2] == script
    assert env_of(job)["REF"] == "$(OMP_NUM_THREADS)" and env_of(job)["PIDS"] == "$$$$"
    assert m.literal("a$b$$") == "a$$b$$$$"
    assert kubernetes_validate.validate(job, KUBERNETES_VERSIONS[-1], strict=True)


@pytest.mark.parametrize("name", ["1ABC", "A-B", "A B", "X;Y", "$(id)", "", "A\nB", "PATH="])
def test_bad_env_name_is_refused(name):
    with pytest.raises(BackendError):
        m.job_manifest(make_spec(env={name: "1"}), make_config())


def test_env_nul_is_refused_and_reserved_names_are_the_backends():
    with pytest.raises(BackendError):
        m.job_manifest(make_spec(env={"X": "a\x00b"}), make_config())
    job = m.job_manifest(make_spec(nodes=2, env={"PORTAL_RDZV_HOST": "evil.example.org"}), make_config())
    names = [e["name"] for e in container(job)["env"]]
    assert names.count("PORTAL_RDZV_HOST") == 1
    assert env_of(job)["PORTAL_RDZV_HOST"] == f"pj-{TOKEN}-0.pj-{TOKEN}.protein-lab.svc"


def test_indexed_job_with_headless_service():
    job, service = MANIFESTS["job-indexed"], MANIFESTS["service-rendezvous"]
    name = f"pj-{TOKEN}"
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 3
    assert job["spec"]["backoffLimit"] == 0
    assert pod_spec(job)["subdomain"] == name
    assert env_of(job)["PORTAL_RDZV_HOST"] == f"{name}-0.{name}.protein-lab.svc"
    assert service["metadata"]["name"] == name and service["metadata"]["namespace"] == "protein-lab"
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    selector = service["spec"]["selector"]
    assert all(job["spec"]["template"]["metadata"]["labels"][k] == v for k, v in selector.items())
    (owner,) = service["metadata"]["ownerReferences"]
    assert owner["kind"] == "Job" and owner["name"] == name and owner["uid"]
    assert len(m.job_manifests(make_spec(), make_config())) == 1
    assert "PORTAL_RDZV_HOST" not in env_of(MANIFESTS["job-single"])


def test_kueue_labels_and_suspend():
    for key in ("job-single-kueue", "job-indexed-kueue"):
        job = MANIFESTS[key]
        assert job["spec"]["suspend"] is True
        assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "portal"
        assert job["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == "portal-high"
        assert not any(k.startswith("kueue.x-k8s.io/") for k in job["spec"]["template"]["metadata"]["labels"])
    assert not any(
        k.startswith("kueue.x-k8s.io/")
        for k in MANIFESTS["service-rendezvous-no-owner"]["metadata"]["labels"]
    )
    assert "ownerReferences" not in MANIFESTS["service-rendezvous-no-owner"]["metadata"]


@pytest.mark.parametrize(
    "overrides",
    [
        {"gpus_per_node": 0},
        {"nodes": 0},
        {"walltime_minutes": 0},
        {"walltime_minutes": True},
        {"qos": "portal-gold"},
        {"k8s_resource": "gpu"},
        {"k8s_product": "bad product"},
        {"script": "  "},
        {"token": "NOT-HEX"},
    ],
)
def test_bad_specs_are_refused(overrides):
    with pytest.raises(BackendError):
        m.job_manifest(make_spec(**overrides), make_config())
