"""deploy/: the portal's own Kubernetes objects (docs/scaling.md) are valid for every Kubernetes
version the job manifests are validated for, and agree with the nginx config and the image."""

import re

import kubernetes_validate
import pytest
import yaml

from clusters.backends.kubernetes import KUBERNETES_VERSIONS
from tests.conftest import ROOT

DEPLOY = ROOT / "deploy"
OBJECTS = list(yaml.safe_load_all((DEPLOY / "kubernetes" / "portal.yaml").read_text()))
BY_ID = {f"{o['kind']}/{o['metadata']['name']}": o for o in OBJECTS}


def pod_specs():
    for obj in OBJECTS:
        if obj["kind"] in ("Deployment", "Job"):
            yield obj["metadata"]["name"], obj["spec"]["template"]["spec"]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("name", sorted(BY_ID))
def test_every_object_is_valid_for_every_version(name, version):
    assert kubernetes_validate.validate(BY_ID[name], version, strict=True) == version


def test_kustomize_makes_the_nginx_config_the_web_pods_mount_from_the_stacks_own_file():
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    assert kustomization["resources"] == ["kubernetes/portal.yaml"]
    (generated,) = kustomization["configMapGenerator"]
    key, _, path = generated["files"][0].partition("=")
    assert (DEPLOY / path) == DEPLOY / "nginx" / "portal.conf" and (DEPLOY / path).is_file()
    assert kustomization["generatorOptions"]["disableNameSuffixHash"] is True
    web = BY_ID["Deployment/portal-web"]["spec"]["template"]["spec"]
    assert {"name": "nginx-conf", "configMap": {"name": generated["name"]}} in web["volumes"]
    nginx = next(c for c in web["containers"] if c["name"] == "nginx")
    command = " ".join(nginx["args"])
    assert f"/etc/portal-nginx/{key}" in command
    # every token of the template is filled, as scripts/stack proxy-conf fills them
    tokens = set(re.findall(r"@([A-Z]+)@", (DEPLOY / path).read_text()))
    assert (
        tokens
        == set(re.findall(r"s#@([A-Z]+)@#", command))
        == {"LISTEN", "UPSTREAM", "STREAM", "DIR", "USER"}
    )


def test_the_pods_run_locked_down_as_the_images_numeric_user():
    assert "USER 10001" in (ROOT / "Dockerfile").read_text()
    for name, spec in pod_specs():
        assert spec["automountServiceAccountToken"] is False, name
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        for container in spec["containers"]:
            locked = container["securityContext"]
            assert locked["allowPrivilegeEscalation"] is False and locked["readOnlyRootFilesystem"] is True
            assert locked["capabilities"] == {"drop": ["ALL"]}, (name, container["name"])
            assert "memory" in container["resources"]["limits"], (name, container["name"])
            if container["image"].startswith("gpu-portal:"):
                assert locked["runAsUser"] == 10001, (name, container["name"])


def test_web_pods_run_the_worker_count_of_their_cores_and_beat_runs_once():
    web = BY_ID["Deployment/portal-web"]["spec"]["template"]["spec"]
    gunicorn = next(c for c in web["containers"] if c["name"] == "gunicorn")
    cores = int(gunicorn["resources"]["requests"]["cpu"])
    workers = int(gunicorn["command"][gunicorn["command"].index("--workers") + 1])
    assert workers == 2 * cores + 1  # scripts/stack's and gunicorn's own rule
    assert "127.0.0.1:8000" in gunicorn["command"]  # only the pod's nginx reaches it
    beat = BY_ID["Deployment/portal-beat"]["spec"]
    assert beat["replicas"] == 1 and beat["strategy"] == {"type": "Recreate"}
    config = BY_ID["ConfigMap/portal-config"]["data"]
    assert config["NUM_PROXIES"] == "1" and int(config["SHED_QUEUED_AFTER_MS"]) > 0
