"""Whatever a job's input holds, a tenant's pod stays in its tenant's namespace and gets no host
access: no other namespace, no hostPath or any volume but its own two emptyDirs, no privileged
container, privilege escalation or added capability, no host network, PID or IPC namespace, and
no service account (none named; the default one's token not mounted).

Hypothesis draws job specs from hostile pools (path tricks in namespaces, YAML and JSON injection
in scripts, names, labels and images, odd env names) mixed with arbitrary text; every spec is
either refused (BackendError) or gives manifests that hold all of the above and validate
against the Kubernetes schemas (strict) of the oldest and newest supported versions.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import kubernetes_validate
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from clusters.backends.base import BackendError, TenantLimits
from clusters.backends.kubernetes import KUBERNETES_VERSIONS
from clusters.backends.kubernetes import manifests as m
from clusters.backends.kubernetes.common import TIERS, check_namespace
from clusters.backends.kubernetes.tenant import tenant_manifests
from tests.k8s_support import make_config, make_spec

INJECTIONS = [
    "x\nhostNetwork: true",
    "---\napiVersion: v1\nkind: Pod\nspec:\n  hostPID: true\n  containers: [{privileged: true}]",
    '{"spec": {"hostIPC": true, "serviceAccountName": "admin"}}',
    '", "hostPath": {"path": "/"}, "x": "',
    "'; namespace: kube-system",
    "$(KUBERNETES_SERVICE_HOST)",
    "${HOME}",
    "$$(x)",
    "securityContext:\n  privileged: true\n  capabilities: {add: [SYS_ADMIN]}",
    "\x00",
    "\u202e\u0000evil",
    "a" * 300,
    "",
    " ",
]
ACCOUNTS = [
    "../kube-system", "kube-system", "kube-public", "default", "protein-lab/../kube-system",
    "protein-lab\nnamespace: kube-system", "Protein-Lab", "-lab", "lab-", "a" * 64, "", ".", "..",
    "protein-lab", "tenant-b", "x",
]  # fmt: skip
IMAGES = [
    "", "evil\nhostNetwork: true", "--privileged", "a b", "../../host", "registry.example.org/x:1",
    "docker.io/library/python:3.11-slim", "img@sha256:" + "a" * 64, '{"hostPID": true}', "x" * 300,
]  # fmt: skip
ENV_NAMES = [
    "OK", "HOME", "PATH", "PORTAL_RDZV_HOST", "JOB_COMPLETION_INDEX", "A-B", "1X", "A B", "A=B", "",
    "KUBERNETES_SERVICE_HOST", "LD_PRELOAD", "x\ny",
]  # fmt: skip

hostile_text = st.one_of(st.sampled_from(INJECTIONS), st.text(max_size=80))


# Fields the backend checks, each with hostile values; at most two per spec, so that many specs are
# accepted and checked whole. The other fields are data and always hostile.
CHECKED = {
    "token": st.one_of(st.sampled_from(["../x", "Pj-1", "a" * 41, "a/b", ""]), st.text(max_size=45)),
    "account": st.one_of(st.sampled_from(ACCOUNTS), st.from_regex(r"[a-z0-9-]{1,20}", fullmatch=True)),
    "qos": st.sampled_from([*TIERS, "system-cluster-critical", "", "portal-high\n"]),
    "k8s_resource": st.sampled_from(["amd.com/gpu", "hostPath", "../x", "nvidia.com/gpu\n"]),
    "k8s_product": hostile_text,
    "gpus_per_node": st.integers(-2, 9),
    "nodes": st.integers(-1, 4),
    "walltime_minutes": st.integers(-5, 100_000),
    "cpus_per_gpu": st.integers(0, 64),
    "mem_per_gpu_mb": st.integers(0, 512_000),
    "image": st.one_of(st.sampled_from(IMAGES), st.text(max_size=40)),
}
env_names = st.one_of(
    st.from_regex(r"[A-Z_][A-Z0-9_]{0,8}", fullmatch=True), st.sampled_from(ENV_NAMES), st.text(max_size=10)
)


@st.composite
def specs(draw) -> dict:
    fields = {
        name: draw(CHECKED[name]) for name in draw(st.sets(st.sampled_from(sorted(CHECKED)), max_size=2))
    }
    fields |= {name: draw(hostile_text) for name in ("name", "priority", "partition", "gpu_type")}
    fields["script"] = draw(st.one_of(hostile_text, hostile_text.map(lambda text: f"echo {text}\n")))
    fields["labels"] = draw(
        st.dictionaries(
            st.one_of(
                st.sampled_from(["tenant", "job", "scenario", "namespace", "hostNetwork"]),
                st.text(max_size=8),
            ),
            hostile_text,
            max_size=5,
        )
    )
    names = (
        st.sampled_from(["OK", "OTHER"]).flatmap(lambda _: env_names)
        if draw(st.booleans())
        else st.from_regex(r"[A-Z_][A-Z0-9_]{0,8}", fullmatch=True)
    )
    fields["env"] = draw(st.dictionaries(names, hostile_text, max_size=6))
    return fields


configs = st.fixed_dictionaries(
    {
        "uses_kueue": st.booleans(),
        "k8s_image": st.sampled_from(["docker.io/library/python:3.11-slim", *IMAGES]),
    }
)

POD_KEYS = {
    "restartPolicy", "priorityClassName", "automountServiceAccountToken", "enableServiceLinks", "nodeSelector",
    "tolerations", "securityContext", "containers", "volumes", "subdomain",
}  # fmt: skip
CONTAINER_KEYS = {
    "name", "image", "imagePullPolicy", "command", "workingDir", "env", "resources", "securityContext", "volumeMounts",
}  # fmt: skip
ALLOWED_VOLUMES = [{"name": "work", "emptyDir": {}}, {"name": "shm", "emptyDir": {"medium": "Memory"}}]
HOST_KEYS = {
    "hostPath",
    "hostNetwork",
    "hostPID",
    "hostIPC",
    "hostUsers",
    "hostPort",
    "hostAliases",
    "nodeName",
}
ACCOUNT_KEYS = {"serviceAccountName", "serviceAccount", "projected", "serviceAccountToken"}


def walk(node: Any, path: str = "") -> Iterator[tuple[str, str, Any]]:
    """(path, key, value) of every mapping entry in a manifest, at any depth."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield path, key, value
            yield from walk(value, f"{path}.{key}")
    elif isinstance(node, list):
        for index, item in enumerate(node):
            yield from walk(item, f"{path}[{index}]")


def assert_isolated(manifests: list[dict], account: str) -> None:
    assert check_namespace(account) == account  # refused before this point otherwise
    for manifest in manifests:
        for path, key, value in walk(manifest):
            if key == "namespace":
                assert value == account, f"{path}: namespace {value!r}"
            assert key not in HOST_KEYS, f"{path}.{key}"
            assert key not in ACCOUNT_KEYS, f"{path}.{key}"
            if key == "privileged":
                assert value is False, path
            if key == "allowPrivilegeEscalation":
                assert value is False, path
            if key == "capabilities":
                assert value == {"drop": ["ALL"]}, path
        if manifest["kind"] == "Service":
            assert manifest["metadata"]["namespace"] == account
            assert manifest["spec"]["clusterIP"] == "None" and "type" not in manifest["spec"]
            assert "externalIPs" not in manifest["spec"]
            continue
        assert manifest["kind"] == "Job" and manifest["metadata"]["namespace"] == account
        pod = manifest["spec"]["template"]["spec"]
        assert set(pod) <= POD_KEYS, set(pod) - POD_KEYS  # no initContainers, hostNetwork, nodeName…
        assert pod["automountServiceAccountToken"] is False
        assert pod["volumes"] == ALLOWED_VOLUMES
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
        (container,) = pod["containers"]
        assert set(container) <= CONTAINER_KEYS, set(container) - CONTAINER_KEYS
        assert container["securityContext"] == {
            "runAsNonRoot": True,
            "privileged": False,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        }
        assert {mount["name"] for mount in container["volumeMounts"]} == {"work", "shm"}
        for version in (KUBERNETES_VERSIONS[0], KUBERNETES_VERSIONS[-1]):
            assert kubernetes_validate.validate(manifest, version, strict=True) == version
    for manifest in manifests[1:]:
        assert kubernetes_validate.validate(manifest, KUBERNETES_VERSIONS[-1], strict=True)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fields=specs(), config_fields=configs)
def test_no_job_input_gets_a_pod_out_of_its_namespace_or_onto_the_host(fields, config_fields):
    spec = make_spec(**fields)
    try:
        manifests = m.job_manifests(
            spec, make_config(**config_fields), job_uid="5f1c7a52-1111-2222-3333-444455556666"
        )
    except BackendError:
        event("refused")
        return  # refused: nothing is written
    event("accepted")
    assert_isolated(manifests, spec.account)


@settings(max_examples=200, deadline=None)
@given(account=st.one_of(st.sampled_from(ACCOUNTS), st.text(max_size=70)), qos=st.sampled_from([*TIERS, "x"]))
def test_no_tenant_input_names_another_namespace_or_lifts_pod_security(account, qos):
    limits = TenantLimits(account=account, qos=qos, users=[], gpus_by_type={}, gpu_minutes=0)
    try:
        manifests = tenant_manifests(limits, make_config(uses_kueue=True))
    except BackendError:
        return
    namespaced = [x for x in manifests if x["kind"] not in {"PriorityClass", "WorkloadPriorityClass"}]
    assert {x["metadata"].get("namespace", x["metadata"]["name"]) for x in namespaced} == {account}
    (namespace,) = [x for x in manifests if x["kind"] == "Namespace"]
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert not account.startswith("kube-") and account != "default"


@pytest.mark.parametrize(
    "fields",
    [
        {"account": "../kube-system"},
        {"account": "kube-system"},
        {"account": "default"},
        {"account": "protein-lab/../kube-system"},
        {"account": "protein-lab\nnamespace: kube-system"},
        {"token": "../x"},
        {"image": "evil\nhostNetwork: true"},
        {"image": '{"hostPID": true}'},
        {"image": "a b"},
        {"k8s_resource": "hostPath"},
        {"k8s_product": "x\nhostNetwork: true"},
        {"qos": "system-cluster-critical"},
        {"env": {"A\nhostPID": "1"}},
        {"env": {"A": "x\x00y"}},
    ],
    ids=lambda fields: repr(fields)[:50],
)
def test_hostile_inputs_are_refused(fields):
    with pytest.raises(BackendError):
        m.job_manifests(make_spec(**fields), make_config())


@pytest.mark.parametrize("text", INJECTIONS[:9])
def test_injection_in_script_name_env_and_labels_stays_data(text):
    """Accepted, and inert: each lands in one string field and changes nothing around it."""
    spec = make_spec(script=f"echo {text}", name=text, env={"X": text}, labels={"job": text, "tenant": text})
    manifests = m.job_manifests(spec, make_config())
    assert_isolated(manifests, spec.account)
    container = manifests[0]["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][:2] == ["/bin/bash", "-c"] and len(container["command"]) == 3
    assert {"name": "X", "value": m.literal(text)} in container["env"]
    assert manifests[0]["metadata"]["annotations"][m.ANNOTATION_NAME] == text[:253]
