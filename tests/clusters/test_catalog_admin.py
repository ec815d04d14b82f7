"""The catalog in the admin console: cluster secrets are write-only (never rendered, kept when
left blank, replaced when typed, removed only by the explicit "clear" box)."""

import pytest
from django.test import Client

from clusters.models import Cluster, GpuModel, Scenario
from tests.factories import seed_catalog

pytestmark = pytest.mark.django_db


KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAAsecret-key-material\n-----END OPENSSH PRIVATE KEY-----\n"
SECRETS = {
    "ssh_private_key": KEY,
    "ssh_key_passphrase": "passphrase-secret-material",
    "k8s_token": "k8s-token-secret-material",
    "kubeconfig": "apiVersion: v1\nusers:\n- name: a\n  user: {token: kubeconfig-secret-material}\n",
}


@pytest.fixture(autouse=True)
def catalog():
    if not GpuModel.objects.exists():
        seed_catalog()


@pytest.fixture
def staff(admin_user) -> Client:
    client = Client()
    client.force_login(admin_user)
    return client


@pytest.fixture
def cluster() -> Cluster:
    return Cluster.objects.create(
        slug="hpc", name="HPC", kind="slurm", ssh_host="login.example.org", **SECRETS
    )


def change_url(cluster: Cluster) -> str:
    return f"/admin/clusters/cluster/{cluster.pk}/change/"


def form_data(cluster: Cluster, **changes) -> dict:
    """What the browser posts for the change form when nothing is typed into the secrets."""
    data = {
        "slug": cluster.slug,
        "name": cluster.name,
        "kind": cluster.kind,
        "enabled": "on",
        "ssh_host": cluster.ssh_host,
        "ssh_port": str(cluster.ssh_port),
        "ssh_user": "",
        "ssh_known_hosts": "",
        "ssh_private_key": "",
        "ssh_key_passphrase": "",
        "slurm_cluster_name": "",
        "scratch_root": cluster.scratch_root or "/shared/portal-jobs",
        "job_identity": cluster.job_identity,
        "tenant_identity_template": cluster.tenant_identity_template,
        "k8s_api_url": "",
        "k8s_ca_cert": "",
        "k8s_token": "",
        "kubeconfig": "",
        "k8s_scratch_gib": str(cluster.k8s_scratch_gib),
        "k8s_scratch_storage_class": cluster.k8s_scratch_storage_class,
        "local_gpus": "0",
        "partitions-TOTAL_FORMS": "0",
        "partitions-INITIAL_FORMS": "0",
        "partitions-MIN_NUM_FORMS": "0",
        "partitions-MAX_NUM_FORMS": "1000",
    }
    return data | changes


def test_change_page_never_shows_a_stored_secret(staff, cluster):
    page = staff.get(change_url(cluster)).content.decode()
    for secret in ("secret-key-material", "passphrase-secret", "k8s-token-secret", "kubeconfig-secret"):
        assert secret not in page
    assert page.count("Currently set.") == 4
    assert 'name="ssh_private_key_clear"' in page


def test_change_page_says_not_set_when_empty(staff):
    cluster = Cluster.objects.create(slug="k8s", name="K8s", kind="kubernetes")
    assert staff.get(change_url(cluster)).content.decode().count("Currently not set.") == 4


def test_saving_with_the_secret_fields_blank_keeps_them(staff, cluster):
    response = staff.post(change_url(cluster), form_data(cluster, name="HPC renamed"))
    assert response.status_code == 302, response.content.decode()[-2000:]
    cluster.refresh_from_db()
    assert cluster.name == "HPC renamed"
    assert {name: getattr(cluster, name) for name in SECRETS} == SECRETS


@pytest.mark.parametrize("field", list(SECRETS))
def test_typing_a_new_secret_replaces_it(staff, cluster, field):
    response = staff.post(change_url(cluster), form_data(cluster, **{field: "new-value"}))
    assert response.status_code == 302
    cluster.refresh_from_db()
    assert getattr(cluster, field) == "new-value"
    assert all(getattr(cluster, other) == value for other, value in SECRETS.items() if other != field)


@pytest.mark.parametrize("field", list(SECRETS))
def test_the_clear_box_clears_a_secret(staff, cluster, field):
    response = staff.post(change_url(cluster), form_data(cluster, **{f"{field}_clear": "on"}))
    assert response.status_code == 302
    cluster.refresh_from_db()
    assert getattr(cluster, field) == ""
    assert all(getattr(cluster, other) == value for other, value in SECRETS.items() if other != field)


def test_a_new_value_and_clear_together_is_refused_without_echoing_it(staff, cluster):
    data = form_data(cluster, ssh_private_key="typed-new-key", ssh_private_key_clear="on", name="")
    response = staff.post(change_url(cluster), data)
    assert response.status_code == 200  # the form again, with errors
    page = response.content.decode()
    assert "not both" in page
    assert "typed-new-key" not in page and "secret-key-material" not in page
    cluster.refresh_from_db()
    assert cluster.ssh_private_key == KEY


def test_adding_a_cluster_with_a_key_stores_it(staff):
    data = form_data(Cluster(slug="new", name="New", kind="slurm", ssh_host="h"), ssh_private_key=KEY)
    response = staff.post("/admin/clusters/cluster/add/", data)
    assert response.status_code == 302, response.content.decode()[-2000:]
    assert Cluster.objects.get(slug="new").ssh_private_key == KEY


@pytest.mark.parametrize("model", ["gpumodel", "scenario", "partition", "cluster"])
def test_catalog_admin_pages_load(staff, cluster, model):
    assert staff.get(f"/admin/clusters/{model}/").status_code == 200
    assert staff.get(f"/admin/clusters/{model}/add/").status_code == 200


def test_scenario_change_page_shows_its_ranking(staff):
    scenario = Scenario.objects.get(slug="cfd")
    page = staff.get(f"/admin/clusters/scenario/{scenario.pk}/change/").content.decode()
    assert "TFLOP/s FP64" in page
    assert 'name="advisor"' in page


def partition_form(cluster: Cluster, model: GpuModel, **changes) -> dict:
    data = {
        "cluster": str(cluster.pk), "name": "shared", "gpu_model": str(model.pk), "gpus_per_node": "4",
        "nodes": "1", "max_walltime_minutes": "60", "gpus_free": "", "max_cpus_per_gpu": "",
        "max_mem_per_gpu_mb": "", "share_kinds": '["whole"]', "mig_profiles": "[]", "shards_per_gpu": "0",
    }  # fmt: skip
    return data | changes


@pytest.mark.parametrize(
    ("model", "changes", "field", "message"),
    [
        (
            "t4",
            {"share_kinds": '["whole", "mig"]'},
            "share_kinds",
            "T4 on a Slurm cluster offers: shard, whole.",
        ),
        (
            "h200",
            {"share_kinds": '["slice"]'},
            "share_kinds",
            "H200 on a Slurm cluster offers: mig, shard, whole.",
        ),
        (
            "h200",
            {"share_kinds": '["mig"]', "mig_profiles": '["3g.40gb"]'},
            "mig_profiles",
            "Profiles of H200:",
        ),
        ("h200", {"share_kinds": '["shard"]'}, "shards_per_gpu", "Set the shards per GPU exactly when"),
    ],
)
def test_a_partition_offers_only_what_its_model_and_scheduler_can_give(
    staff, cluster, model, changes, field, message
):
    gpu = GpuModel.objects.get(slug=model)
    response = staff.post("/admin/clusters/partition/add/", partition_form(cluster, gpu, **changes))
    assert response.status_code == 200  # the form again, with the error
    errors = response.context["adminform"].form.errors
    assert message in " ".join(errors[field]), errors
    assert not cluster.partitions.exists()


def test_a_partition_offering_mig_and_shards_is_saved(staff, cluster):
    gpu = GpuModel.objects.get(slug="h200")
    changes = {
        "share_kinds": '["whole", "mig", "shard"]',
        "mig_profiles": '["3g.71gb"]',
        "shards_per_gpu": "4",
    }
    response = staff.post("/admin/clusters/partition/add/", partition_form(cluster, gpu, **changes))
    assert response.status_code == 302, response.context["adminform"].form.errors
    partition = cluster.partitions.get()
    assert (partition.share_kinds, partition.mig_profiles, partition.shards_per_gpu) == (
        ["whole", "mig", "shard"], ["3g.71gb"], 4,
    )  # fmt: skip
