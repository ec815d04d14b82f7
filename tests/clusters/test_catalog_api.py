"""docs/api.md, Catalog: the seeded GPU models and scenarios, their ranking rules, and the read-only
endpoints gpu-models/, scenarios/ and clusters/."""

import importlib

import pytest
from django.apps import apps as django_apps

from clusters.models import Cluster, GpuModel, Scenario, ScenarioGpu
from tests.factories import ClusterFactory, PartitionFactory, seed_catalog

pytestmark = pytest.mark.django_db

seed_migration = importlib.import_module("clusters.migrations.0002_seed_catalog")
share_migration = importlib.import_module("clusters.migrations.0010_share_catalog")

SECRET_KEY_TEXT = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA-hunter2\n"
SECRET_TOKEN_TEXT = "eyJhbGciOiJSUzI1NiJ9.k8s-token-hunter3"
SECRET_KUBECONFIG_TEXT = "apiVersion: v1\nusers:\n- name: admin\n  user: {token: kubeconfig-hunter4}\n"


@pytest.fixture(autouse=True)
def catalog():
    """The seed, as the migration wrote it; a transactional test elsewhere may have flushed it."""
    if not GpuModel.objects.exists():
        seed_catalog()


def ranking(slug: str) -> list[GpuModel]:
    return [
        entry.gpu_model
        for entry in ScenarioGpu.objects.filter(scenario__slug=slug)
        .select_related("gpu_model")
        .order_by("rank")
    ]


def make_gpu_model(slug: str) -> GpuModel:
    return GpuModel.objects.create(
        slug=slug,
        vendor="nvidia",
        name=slug.upper(),
        memory_gb=24,
        fp64_tflops=1,
        fp32_tflops=30,
        fp16_tflops=120,
        memory_bandwidth_gbs=600,
        interconnect="PCIe 4.0 x16 (64 GB/s)",
        interconnect_gbs=64,
        ecc=True,
        cost_index=25,
        slurm_gres=slug,
        k8s_resource="nvidia.com/gpu",
        k8s_product=f"NVIDIA-{slug.upper()}",
    )


def make_cluster(slug: str, *, enabled: bool = True, partitions: int = 2) -> Cluster:
    cluster = ClusterFactory(
        slug=slug, kind="slurm", enabled=enabled, ssh_host="login.example.org", ssh_user="portal",
        ssh_private_key=SECRET_KEY_TEXT, k8s_token=SECRET_TOKEN_TEXT, kubeconfig=SECRET_KUBECONFIG_TEXT,
    )  # fmt: skip
    h100 = GpuModel.objects.get(slug="h100-80gb")
    for n in range(partitions):
        PartitionFactory(
            cluster=cluster, name=f"gpu{n}", gpu_model=h100, nodes=4, max_walltime_minutes=2880, gpus_free=5
        )
    return cluster


# --- The seed ------------------------------------------------------------------------------------


def test_seed_has_thirteen_gpu_models_and_three_scenarios():
    assert GpuModel.objects.count() == 13
    assert set(Scenario.objects.values_list("slug", flat=True)) == {
        "ai-training",
        "molecular-dynamics",
        "cfd",
    }
    assert dict(Scenario.objects.values_list("slug", "advisor")) == {
        "ai-training": "ai",
        "molecular-dynamics": "md",
        "cfd": "cfd",
    }


@pytest.mark.parametrize(
    ("slug", "field", "value"),
    [
        ("h100-80gb", "memory_gb", 80),
        ("h100-80gb", "fp64_tflops", 34),
        ("h100-80gb", "fp16_tflops", 989),
        ("h100-80gb", "memory_bandwidth_gbs", 3350),
        ("h100-80gb", "cost_index", 100),
        ("h100-80gb", "slurm_gres", "h100"),
        ("h100-80gb", "k8s_product", "NVIDIA-H100-80GB-HBM3"),
        ("h200", "memory_gb", 141),
        ("h200", "memory_bandwidth_gbs", 4800),
        ("a100-80gb", "slurm_gres", "a100"),
        ("a100-80gb", "memory_bandwidth_gbs", 2039),
        ("a100-40gb", "memory_gb", 40),
        ("v100s", "fp64_tflops", 8.2),
        ("t4", "memory_gb", 16),
        ("l40s", "memory_gb", 48),
        ("mi250x", "vendor", "amd"),
        ("mi250x", "k8s_resource", "amd.com/gpu"),
        ("mlu370-x8", "k8s_resource", "cambricon.com/mlu"),
        ("mlu370-x8", "fp64_tflops", 0),
        ("dcu-z100", "k8s_resource", "hygon.com/dcunum"),
        ("dcu-z100", "vendor", "hygon"),
    ],
)
def test_seed_figures_follow_the_datasheets(slug, field, value):
    assert getattr(GpuModel.objects.get(slug=slug), field) == value


def test_seed_figures_are_consistent_across_models():
    gpu = {g.slug: g for g in GpuModel.objects.all()}
    assert gpu["v100s"].fp64_tflops > gpu["t4"].fp64_tflops * 10  # V100S: full-rate FP64; T4: 1/32
    assert gpu["h200"].memory_gb > gpu["h100-80gb"].memory_gb == gpu["a100-80gb"].memory_gb == 80
    assert all(g.fp16_tflops > g.fp32_tflops >= g.fp64_tflops for g in gpu.values())
    assert all(g.slurm_gres == g.slurm_gres.lower() and g.cost_index > 0 for g in gpu.values())
    assert {g.k8s_resource for g in gpu.values()} == {
        "nvidia.com/gpu",
        "amd.com/gpu",
        "cambricon.com/mlu",
        "hygon.com/dcunum",
        "huawei.com/Ascend910B",
    }


def test_every_scenario_ranks_every_model_with_a_reason_in_figures():
    for scenario in Scenario.objects.all():
        entries = list(scenario.ranking.order_by("rank"))
        assert [e.rank for e in entries] == list(range(1, 14))
        assert all(any(ch.isdigit() for ch in e.reason) for e in entries if "No FP64" not in e.reason)
        assert scenario.default_walltime_minutes > 0 and scenario.description
    ai = Scenario.objects.get(slug="ai-training")
    assert {"NCCL_DEBUG", "NCCL_IB_DISABLE", "NCCL_SOCKET_IFNAME", "PYTORCH_CUDA_ALLOC_CONF"} <= set(ai.env)
    assert "OMP_NUM_THREADS" in Scenario.objects.get(slug="cfd").env


def test_ai_ranks_only_80gb_models_above_smaller_ones():
    memory = [g.memory_gb >= 80 for g in ranking("ai-training")]
    assert memory == sorted(memory, reverse=True)
    assert [g.slug for g in ranking("ai-training")][:3] == ["h200", "h100-80gb", "a100-80gb"]


def test_cfd_ranks_ecc_models_first_then_by_fp64():
    ranked = ranking("cfd")
    keys = [(not g.ecc, -g.fp64_tflops) for g in ranked]
    assert keys == sorted(keys)
    assert ranked[-1].slug == "mlu370-x8"  # no FP64 units, no ECC stated
    slugs = [g.slug for g in ranked]
    assert slugs.index("v100s") < slugs.index("t4")


def test_md_ranks_by_throughput_per_cost():
    scores = [
        (g.fp32_tflops * g.memory_bandwidth_gbs) ** 0.5 / g.cost_index for g in ranking("molecular-dynamics")
    ]
    assert scores == sorted(scores, reverse=True)
    slugs = [g.slug for g in ranking("molecular-dynamics")]
    assert slugs.index("a40") < slugs.index("a100-80gb")  # cheap bandwidth beats fast but dear


def test_reverse_migration_removes_the_seed_and_forward_restores_it():
    share_migration.backward(django_apps, None)
    seed_migration.unseed(django_apps, None)
    assert not GpuModel.objects.exists()
    assert not Scenario.objects.filter(slug__in=["ai-training", "molecular-dynamics", "cfd"]).exists()
    seed_migration.seed(django_apps, None)
    seed_migration.seed(django_apps, None)  # a re-seed updates in place
    assert GpuModel.objects.count() == 12
    assert ScenarioGpu.objects.count() == 36
    share_migration.forward(django_apps, None)
    share_migration.forward(django_apps, None)  # and so does the shares' migration
    assert GpuModel.objects.count() == 13
    assert ScenarioGpu.objects.count() == 39
    assert GpuModel.objects.get(slug="h200").share_kinds == ["whole", "mig", "slice", "shard"]


# --- Endpoints -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path", ["/api/v1/gpu-models/", "/api/v1/scenarios/", "/api/v1/scenarios/cfd/", "/api/v1/clusters/"]
)
def test_catalog_needs_authentication(anon_client, path):
    response = anon_client.get(path)
    assert response.status_code == 401
    assert response.json()["code"] == "not_authenticated"


@pytest.mark.parametrize("persona", ["admin_user", "owner", "member", "viewer", "outsider"])
def test_any_signed_in_user_reads_the_catalog(client_for, request, persona):
    client = client_for(request.getfixturevalue(persona))
    for path in ("/api/v1/gpu-models/", "/api/v1/scenarios/", "/api/v1/clusters/"):
        assert client.get(path).status_code == 200


def test_gpu_models_carry_exactly_the_api_fields(client_for, member):
    body = client_for(member).get("/api/v1/gpu-models/?page_size=200").json()
    assert set(body) == {"next", "previous", "results"}
    assert len(body["results"]) == 13
    h100 = next(g for g in body["results"] if g["slug"] == "h100-80gb")
    assert set(h100) == {
        "slug",
        "vendor",
        "name",
        "memory_gb",
        "fp64_tflops",
        "fp32_tflops",
        "fp16_tflops",
        "memory_bandwidth_gbs",
        "interconnect",
        "ecc",
        "slurm_gres",
        "k8s_resource",
        "k8s_product",
        "share_kinds",
        "mig_profiles",
        "sources",
    }
    assert h100["memory_gb"] == 80 and h100["slurm_gres"] == "h100"
    assert [g["slug"] for g in body["results"]] == sorted(g["slug"] for g in body["results"])


def test_gpu_models_page_by_slug(client_for, member):
    client = client_for(member)
    first = client.get("/api/v1/gpu-models/?page_size=5").json()
    second = client.get(first["next"]).json()
    slugs = [g["slug"] for g in first["results"] + second["results"]]
    assert slugs == sorted(GpuModel.objects.values_list("slug", flat=True))[:10]


def test_scenario_detail_lists_its_ranking_by_slug(client_for, viewer):
    body = client_for(viewer).get("/api/v1/scenarios/ai-training/").json()
    assert set(body) == {
        "slug",
        "name",
        "description",
        "default_walltime_minutes",
        "env",
        "advisor",
        "gpu_models",
    }
    assert body["advisor"] == "ai"
    assert body["gpu_models"][0] == {
        "gpu_model": "h200",
        "rank": 1,
        "reason": ScenarioGpu.objects.get(scenario__slug="ai-training", rank=1).reason,
    }
    assert [e["rank"] for e in body["gpu_models"]] == list(range(1, 14))


def test_unknown_scenario_is_404(client_for, member):
    response = client_for(member).get("/api/v1/scenarios/no-such-thing/")
    assert response.status_code == 404
    assert response.json()["code"] == "not_found"


def test_clusters_list_enabled_ones_with_their_partitions(client_for, member):
    make_cluster("alpha")
    make_cluster("retired", enabled=False)
    body = client_for(member).get("/api/v1/clusters/").json()
    assert [c["slug"] for c in body["results"]] == ["alpha"]
    alpha = body["results"][0]
    assert set(alpha) == {"slug", "name", "kind", "healthy", "partitions"}
    assert alpha["partitions"][0] == {
        "name": "gpu0",
        "gpu_model": "h100-80gb",
        "gpus_per_node": 8,
        "nodes": 4,
        "gpus_total": 32,
        "gpus_free": 5,
        "max_walltime_minutes": 2880,
        "share_kinds": ["whole"],
        "mig_profiles": [],
        "shards_per_gpu": 0,
    }
    assert client_for(member).get("/api/v1/clusters/retired/").status_code == 404


def test_clusters_never_return_secrets_or_connection_settings(client_for, admin_user):
    make_cluster("alpha")
    client = client_for(admin_user)
    for path in ("/api/v1/clusters/", "/api/v1/clusters/alpha/"):
        raw = client.get(path).content.decode()
        for text in ("hunter2", "hunter3", "hunter4", "PRIVATE KEY", "login.example.org"):
            assert text not in raw
        for field in (*Cluster.SECRET_FIELDS, "ssh_host", "ssh_user", "k8s_api_url", "k8s_ca_cert"):
            assert f'"{field}"' not in raw


def test_catalog_is_read_only(client_for, admin_user):
    client = client_for(admin_user)
    assert client.post("/api/v1/gpu-models/", {"slug": "x"}).status_code == 405
    assert client.delete("/api/v1/scenarios/cfd/").status_code == 405
    assert client.patch("/api/v1/clusters/alpha/", {}).status_code in (404, 405)


# --- Query counts: the same budget at 1 and at 20 rows ------------------------------------------

# Token lookup, then one query per list (plus one per prefetched relation).
AUTH_QUERIES = 1


@pytest.mark.parametrize("rows", [1, 20])
def test_gpu_models_list_query_count(client_for, member, django_assert_num_queries, rows):
    ScenarioGpu.objects.all().delete()
    GpuModel.objects.all().delete()
    for n in range(rows):
        make_gpu_model(f"gpu-{n:02}")
    client = client_for(member)
    client.get("/api/v1/gpu-models/")  # the token's first use writes last_used; later ones don't
    with django_assert_num_queries(AUTH_QUERIES + 1):
        body = client.get("/api/v1/gpu-models/?page_size=50").json()
    assert len(body["results"]) == rows


@pytest.mark.parametrize("rows", [1, 20])
def test_scenarios_list_query_count(client_for, member, django_assert_num_queries, rows):
    Scenario.objects.all().delete()
    gpus = list(GpuModel.objects.all()[:3])
    for n in range(rows):
        scenario = Scenario.objects.create(
            slug=f"scenario-{n:02}", name=f"S{n}", description="d", default_walltime_minutes=60
        )
        for rank, gpu in enumerate(gpus, start=1):
            ScenarioGpu.objects.create(scenario=scenario, gpu_model=gpu, rank=rank, reason="r")
    client = client_for(member)
    client.get("/api/v1/gpu-models/")
    with django_assert_num_queries(AUTH_QUERIES + 2):
        body = client.get("/api/v1/scenarios/?page_size=50").json()
    assert len(body["results"]) == rows
    assert all(len(s["gpu_models"]) == 3 for s in body["results"])


@pytest.mark.parametrize("rows", [1, 20])
def test_clusters_list_query_count(client_for, member, django_assert_num_queries, rows):
    for n in range(rows):
        make_cluster(f"cluster-{n:02}", partitions=3)
    make_cluster("retired", enabled=False)
    client = client_for(member)
    client.get("/api/v1/gpu-models/")
    with django_assert_num_queries(AUTH_QUERIES + 2):
        body = client.get("/api/v1/clusters/?page_size=50").json()
    assert len(body["results"]) == rows
    assert all(len(c["partitions"]) == 3 for c in body["results"])
