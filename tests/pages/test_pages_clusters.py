"""The Clusters page /t/<slug>/clusters/: each enabled cluster with its health and partitions,
the partitions the tenant's grants cover, the GPU models' figures; no secret column is read; the
same queries for 1 and 5 clusters; and in a real browser, through the Clusters tab, in English
and Chinese."""

import os
from datetime import timedelta
from html.parser import HTMLParser

from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from playwright.sync_api import expect

from clusters.models import Cluster, GpuModel
from tests.browser import browser_page, log_in, screenshot
from tests.factories import ClusterFactory, PartitionFactory, QuotaGrantFactory

# Playwright's sync API runs an event loop in this thread; the ORM calls happen before it.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

URL = "/t/protein-lab/clusters/"
TODAY = timezone.localdate()
SECRETS = {
    "ssh_private_key": "-----BEGIN OPENSSH PRIVATE KEY----- very-secret-key-material",
    "k8s_token": "k8s-bearer-token-secret",
    "kubeconfig": "apiVersion: v1 # kubeconfig-secret",
    "k8s_ca_cert": "-----BEGIN CERTIFICATE----- ca-cert-body",
}


class _Rows(HTMLParser):
    """The text of each cell of each table row that has an id, by that id."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: dict[str, list[str]] = {}
        self._row: str | None = None
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "tr" and dict(attrs).get("id"):
            self._row = dict(attrs)["id"]
            self.rows[self._row] = []
        elif tag == "td" and self._row:
            self._cell = []

    def handle_endtag(self, tag):
        if tag == "td" and self._cell is not None:
            self.rows[self._row].append(" ".join("".join(self._cell).split()))
            self._cell = None
        elif tag == "tr":
            self._row = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def rows_of(page: str) -> dict[str, list[str]]:
    parser = _Rows()
    parser.feed(page)
    return parser.rows


def gpu_model(slug: str = "test-a40", name: str = "Test A40") -> GpuModel:
    return GpuModel.objects.create(
        slug=slug, vendor="nvidia", name=name, memory_gb=48, fp64_tflops=0.6, fp32_tflops=37.4,
        fp16_tflops=149.5, memory_bandwidth_gbs=696, interconnect="PCIe 4.0", interconnect_gbs=64, ecc=True,
        cost_index=40, slurm_gres="a40", k8s_resource="nvidia.com/gpu", k8s_product="NVIDIA-A40",
    )  # fmt: skip


def slurm_cluster(slug: str = "hpc", *, model: GpuModel, **fields) -> Cluster:
    cluster = ClusterFactory(
        slug=slug, name=slug.upper(), kind="slurm", ssh_host="login.example.org", ssh_user="portal",
        **(SECRETS | fields),
    )  # fmt: skip
    PartitionFactory(
        cluster=cluster, name="gpu", gpu_model=model, nodes=4, gpus_free=12, max_walltime_minutes=2 * 24 * 60
    )
    PartitionFactory(cluster=cluster, name="debug", gpu_model=model, gpus_per_node=2, max_walltime_minutes=90)
    return cluster


def test_an_outsider_gets_404_and_an_anonymous_caller_the_login_page(web, client, outsider, tenant):
    assert web(outsider).get(URL).status_code == 404
    client.logout()
    response = client.get(URL)
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")


def test_each_partition_shows_its_gpu_model_sizes_free_and_total_gpus_and_walltime(web, viewer, catalog):
    model = gpu_model()
    slurm_cluster(model=model)
    page = web(viewer).get(URL).content.decode()
    rows = rows_of(page)
    assert rows["partition-hpc-gpu"][:7] == ["gpu", "Test A40", "8", "4", "12", "32", "2 d"]
    # Not yet inventoried: the free GPUs are said to be unknown, not shown as 0.
    assert rows["partition-hpc-debug"][:7] == [
        "debug",
        "Test A40",
        "2",
        "1",
        "not known yet",
        "2",
        "1 h 30 min",
    ]
    assert "Slurm" in page and "Healthy" in page and "Not checked yet." in page


def test_a_disabled_cluster_is_not_shown(web, member, catalog):
    slurm_cluster("retired", model=gpu_model(), enabled=False)
    page = web(member).get(URL).content.decode()
    assert "partition-retired-gpu" not in page and "No cluster is available yet." in page


def test_an_unhealthy_cluster_says_so_in_words_and_when_it_was_checked(web, member, admin_user, catalog):
    slurm_cluster(
        model=gpu_model(), healthy=False, health_detail="sinfo failed: Connection refused",
        health_checked_at=timezone.now() - timedelta(minutes=5),
    )  # fmt: skip
    page = web(member).get(URL).content.decode()
    assert 'data-healthy="false"' in page and "Unhealthy" in page
    assert "did not answer its last check" in page and "Last checked 5\xa0minutes ago." in page
    # The backend's own words are the platform admins' (they name hosts, users and paths).
    assert "sinfo failed" not in page
    assert "sinfo failed: Connection refused" in web(admin_user).get(URL).content.decode()


# What backends have written as a cluster's health detail: hosts, addresses, users, paths.
LEAKY_DETAILS = [
    "[Errno None] Unable to connect to port 22 on login.hpc.example.org",
    "ssh portal@10.1.2.3: Authentication failed.",
    "state directory not writable: [Errno 13] Permission denied: '/srv/portal/var/local-cluster/local'",
    "HTTPSConnectionPool(host='k8s-api.internal', port=6443): Max retries exceeded with url: /api/v1/nodes",
    "Server 'gpu-login-7' not found in known_hosts",
]


def test_no_host_user_or_path_of_a_health_detail_reaches_a_tenant_member(web, member, admin_user, catalog):
    model = gpu_model()
    for n, detail in enumerate(LEAKY_DETAILS):
        slurm_cluster(
            f"c{n}", model=model, healthy=False, health_detail=detail, health_checked_at=timezone.now()
        )
    words = ["login.hpc.example.org", "10.1.2.3", "portal@", "/srv/portal", "k8s-api.internal", "gpu-login-7",
             "known_hosts", "Errno", "/api/v1/nodes"]  # fmt: skip
    page = web(member).get(URL).content.decode()
    leaked = [word for word in words if word in page]
    assert leaked == []
    api = web(member).get("/api/v1/clusters/?page_size=200").content.decode()
    assert [word for word in words if word in api] == []
    dashboard = web(member).get("/t/protein-lab/").content.decode()
    assert [word for word in words if word in dashboard] == []
    admin_page = web(admin_user).get(URL).content.decode()
    assert all(detail.replace("'", "&#x27;") in admin_page for detail in LEAKY_DETAILS)


def test_staff_without_the_platform_admin_grant_see_no_health_detail(web, member, catalog):
    """is_staff alone is console entry, nothing more (the roles helper's rule)."""
    from tests.factories import UserFactory

    staff = UserFactory(username="support", is_staff=True)
    slurm_cluster(model=gpu_model(), healthy=False, health_detail="sinfo on login.example.org failed",
                  health_checked_at=timezone.now())  # fmt: skip
    page = web(staff).get(URL).content.decode()
    assert "login.example.org" not in page


def test_partitions_of_a_gpu_model_the_teams_current_grants_cover_are_marked(
    web, member, tenant, other_tenant, catalog, grant, local_partition
):
    a40 = gpu_model()
    slurm_cluster(model=a40)
    # An ended grant of this team and a current one of another team cover nothing here.
    for owner, ends_on in ((tenant, TODAY - timedelta(days=1)), (other_tenant, TODAY + timedelta(days=9))):
        QuotaGrantFactory(
            tenant=owner,
            gpu_model=a40,
            gpus=1,
            gpu_hours=10,
            starts_on=TODAY - timedelta(days=20),
            ends_on=ends_on,
        )
    rows = rows_of(web(member).get(URL).content.decode())
    assert rows["partition-local-local"][1] == catalog[1].name  # the grant's model: H100
    assert rows["partition-local-local"][-1] == "✓ Your team's grants cover this"
    assert rows["partition-hpc-gpu"][-1] == "" and rows["partition-hpc-debug"][-1] == ""


def test_the_gpu_models_table_lists_each_models_figures(web, member, catalog):
    gpu_model()
    rows = rows_of(web(member).get(URL).content.decode())
    assert rows["gpu-test-a40"][:7] == ["Test A40", "NVIDIA", "48", "0.6", "149.5", "696", "Whole device"]
    assert f"gpu-{catalog[1].slug}" in rows
    h200 = rows["gpu-h200"]  # the catalog's shares: kinds, MIG profiles with their part of a device, sources
    assert (
        h200[6]
        == "Whole device, MIG instance, Shared slice (memory and compute caps), Slurm shard (shared, no isolation)"
    )
    assert h200[7].startswith("1g.18gb (0.1428), 1g.35gb (0.25), 2g.35gb (0.2857), 3g.71gb (0.5)")
    assert h200[8].startswith("4 sources") and "Multi-Instance GPU User Guide" in h200[8]
    assert rows["gpu-ascend-910b"][1] == "Huawei Ascend"


def test_no_secret_is_read_from_the_database_nor_shown(web, member, catalog):
    slurm_cluster(
        model=gpu_model(), healthy=False, health_detail="host key mismatch", health_checked_at=timezone.now()
    )
    with CaptureQueriesContext(connection) as queries:
        page = web(member).get(URL).content.decode()
    assert "did not answer its last check" in page
    for secret in [*SECRETS.values(), "login.example.org"]:
        assert secret not in page
    sql = " ".join(q["sql"] for q in queries.captured_queries)
    for column in [*Cluster.SECRET_FIELDS, "k8s_ca_cert", "ssh_host", "health_detail"]:
        assert column not in sql


def test_the_page_costs_the_same_queries_for_one_cluster_as_for_five(web, member, catalog, grant):
    client = web(member)
    slurm_cluster("c1", model=gpu_model())
    with CaptureQueriesContext(connection) as one:
        assert client.get(URL).status_code == 200
    model = gpu_model("test-l4", "Test L4")
    for n in range(2, 6):
        slurm_cluster(f"c{n}", model=model)
    with CaptureQueriesContext(connection) as five:
        page = client.get(URL).content.decode()
    assert all(f'id="partition-c{n}-gpu"' in page for n in range(1, 6))
    assert len(five) == len(one), [q["sql"] for q in five.captured_queries]


def test_the_clusters_tab_is_in_every_tenant_page_and_current_on_this_one(web, member, catalog):
    client = web(member)
    assert f'<a href="{URL}" aria-current="page">Clusters</a>' in client.get(URL).content.decode()
    assert f'<a href="{URL}">Clusters</a>' in client.get("/t/protein-lab/").content.decode()


def test_member_opens_the_clusters_tab_and_switches_it_to_chinese(
    live_server, member, grant, local_partition
):
    hpc = slurm_cluster(
        model=gpu_model(), healthy=False, health_detail="sinfo failed: Connection refused",
        health_checked_at=timezone.now() - timedelta(hours=2),
    )  # fmt: skip
    PartitionFactory(
        cluster=hpc, name="shared", gpu_model=GpuModel.objects.get(slug="h200"), gpus_per_node=2,
        share_kinds=["whole", "mig", "shard"], mig_profiles=["3g.71gb", "1g.18gb"], shards_per_gpu=4,
    )  # fmt: skip
    base = live_server.url
    with browser_page() as page:
        log_in(page, base, "member")
        page.get_by_role("link", name="Clusters", exact=True).click()
        page.wait_for_url(f"{base}{URL}")
        expect(page.get_by_role("link", name="Clusters", exact=True)).to_have_attribute(
            "aria-current", "page"
        )
        expect(page.get_by_role("heading", level=1)).to_have_text("Clusters")
        expect(page.locator("#partition-local-local")).to_contain_text("Your team's grants cover this")
        hpc = page.get_by_role("region", name="HPC Slurm")
        expect(hpc.locator("[data-healthy=false]")).to_have_text("✗ Unhealthy")
        expect(hpc).to_contain_text("did not answer its last check")
        expect(hpc).not_to_contain_text("sinfo failed")
        expect(page.get_by_role("table", name="Partitions of HPC")).to_be_visible()
        expect(page.locator("#partition-hpc-gpu td.gpus-total")).to_have_text("32")
        expect(page.locator("#partition-hpc-shared td.shares")).to_have_text(
            "Whole device · MIG 3g.71gb, 1g.18gb · 4 shards per GPU (no isolation)"
        )
        expect(page.locator("#gpu-h200 .mig-profile[data-fraction='0.5']")).to_have_text("3g.71gb (0.5)")
        screenshot(page, "clusters")

        page.get_by_label("Language").select_option("zh-hans")
        page.get_by_role("button", name="Apply", exact=True).click()
        expect(page.locator("html")).to_have_attribute("lang", "zh-hans")
        expect(page).to_have_url(f"{base}{URL}")  # the switch keeps the page
        expect(page.locator(".tabs a[aria-current=page]")).to_have_attribute("href", URL)
        expect(page.get_by_role("link", name="仪表盘")).to_be_visible()  # a tab base.html had already
        expect(page.locator("#partition-hpc-gpu td.gpus-total")).to_have_text("32")
        screenshot(page, "clusters-zh-hans")
