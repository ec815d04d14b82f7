"""manage.py seed_site: a small site, read back through the public API with the tokens of the
--out file, agrees with the portal's own invariants (bench/seeding)."""

import itertools
import json
import stat
from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from rest_framework.test import APIClient

from bench.seeding.timelines import FAKE_BACKEND_ID_BASE
from clusters.models import GpuModel
from jobs.services.admission import jobs_admit_marked
from jobs.states import END_STATES, check_move
from tenants.models import Tenant
from tests.factories import ClusterFactory, PartitionFactory, TenantFactory, catalog_pair

pytestmark = pytest.mark.django_db

SMALL = ["--tenants", "5", "--users", "30", "--finished", "200", "--active", "20", "--tokens", "10"]
SUBMIT_ROLES = {"owner", "manager", "member"}


@pytest.fixture
def testbed_cluster(db):
    """The cluster and partitions register_testbed makes: the seed writes rows only and never
    asks Slurm, so the testbed itself need not answer."""
    assert connection.vendor == "postgresql", "seed_site writes with COPY: a PostgreSQL test"
    catalog_pair()
    cluster = ClusterFactory(slug="testbed", name="Slurm testbed", kind="slurm")
    for name, model in (("h100", "h100-80gb"), ("a100", "a100-80gb")):
        PartitionFactory(
            cluster=cluster, name=name, gpu_model=GpuModel.objects.get(slug=model), gpus_per_node=4, nodes=2,
            max_walltime_minutes=24 * 60, max_cpus_per_gpu=1, max_mem_per_gpu_mb=1000,
        )  # fmt: skip
    return cluster


def seed(out, *extra: str) -> dict:
    call_command("seed_site", *SMALL, "--out", str(out), *extra)
    return json.loads(out.read_text())


@pytest.fixture
def site(testbed_cluster, tmp_path) -> dict:
    return seed(tmp_path / "site.json")


def api(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return client


def all_pages(client: APIClient, url: str) -> list[dict]:
    rows, pages = [], 0
    while url and pages < 50:
        response = client.get(url)
        assert response.status_code == 200, response.content
        rows += response.json()["results"]
        url, pages = response.json()["next"], pages + 1
    return rows


def user_with_one_tenant(site: dict) -> tuple[dict, str]:
    user = next(u for u in site["users"] if len(u["tenants"]) == 1)
    return user, user["tenants"][0]["slug"]


def test_out_file_is_private_and_each_token_signs_in_as_its_user(site, tmp_path):
    assert stat.S_IMODE((tmp_path / "site.json").stat().st_mode) == 0o600
    assert [p["name"] for p in site["partitions"]] == ["a100", "h100"]
    assert site["cluster"] == "testbed" and len(site["users"]) == 10
    for user in site["users"]:
        me = api(user["token"]).get("/api/v1/me/")
        assert me.status_code == 200
        assert me.json()["username"] == user["username"]
        assert sorted((t["slug"], t["role"]) for t in me.json()["tenants"]) == sorted(
            (t["slug"], t["role"]) for t in user["tenants"]
        )
        assert any(t["role"] in SUBMIT_ROLES for t in user["tenants"])
        assert {t["slug"] for t in user["tenants"]} <= set(site["tenants"])


def test_running_jobs_listed_are_the_tenant_s_own(site):
    user, slug = user_with_one_tenant(site)
    running = all_pages(api(user["token"]), "/api/v1/jobs/?state=RUNNING&page_size=200")
    assert {job["tenant"] for job in running} <= {slug}
    assert all(
        job["state"] == "RUNNING" and job["started_at"] and job["finished_at"] is None for job in running
    )
    assert len(running) == Tenant.objects.get(slug=slug).jobs.filter(state="RUNNING").count()


def test_active_jobs_are_pending_or_running_with_a_fake_scheduler_id(site, admin_user, client_for):
    client = client_for(admin_user)
    assert all_pages(client, "/api/v1/jobs/?state=QUEUED&state=SUBMITTING&state=CANCELLING") == []
    active = all_pages(client, "/api/v1/jobs/?state=PENDING&state=RUNNING&page_size=200")
    assert len(active) == 20
    for job in active:
        assert int(job["backend_id"]) > FAKE_BACKEND_ID_BASE
        assert job["partition"] == "h100", "active jobs keep off the bench partition (a100)"
    assert len({job["backend_id"] for job in active}) == 20


def test_events_of_each_job_are_its_state_moves_in_order(site):
    user, slug = user_with_one_tenant(site)
    client = api(user["token"])
    jobs = all_pages(client, f"/api/v1/jobs/?tenant={slug}&page_size=200")
    assert jobs
    for job in jobs:
        events = client.get(f"/api/v1/jobs/{job['id']}/events/").json()
        states = [e["to_state"] for e in events]
        assert states[0] == "QUEUED" and states[-1] == job["state"]
        assert [e["from_state"] for e in events] == ["", *states[:-1]]
        for before, after in itertools.pairwise(states):
            check_move(before, after)
        assert [e["at"] for e in events] == sorted(e["at"] for e in events)
        if job["state"] == "COMPLETED":
            assert states == ["QUEUED", "SUBMITTING", "PENDING", "RUNNING", "COMPLETED"]
            assert events[3]["at"] == job["started_at"]


def test_grant_ledgers_are_the_sums_of_their_jobs(site, admin_user, client_for):
    client = client_for(admin_user)
    jobs = all_pages(client, "/api/v1/jobs/?page_size=200")
    assert len(jobs) == 220
    for slug in site["tenants"]:
        grants = all_pages(client, f"/api/v1/quotas/?tenant={slug}")
        assert grants and all(g["active"] for g in grants)
        for grant in grants:
            mine = [j for j in jobs if (j["tenant"], j["scenario"], j["gpu_model"]) == (slug, grant["scenario"],
                                                                                       grant["gpu_model"])]  # fmt: skip
            active = [j for j in mine if j["state"] not in END_STATES]
            ended = [j for j in mine if j["state"] in END_STATES]
            assert grant["gpus_in_use"] == sum(j["gpus"] for j in active) <= grant["gpus"]
            reserved = sum(Decimal(str(j["gpu_hours_reserved"])) for j in active)
            used = sum(
                min(Decimal(str(j["gpu_hours"])), Decimal(str(j["gpu_hours_reserved"]))) for j in ended
            )
            assert Decimal(str(grant["gpu_hours_reserved"])) == reserved
            assert Decimal(str(grant["gpu_hours_used"])) == used
            assert Decimal(str(grant["gpu_hours_remaining"])) > 0


def test_another_tenant_s_job_answers_404(site, admin_user, client_for):
    user, slug = user_with_one_tenant(site)
    others = all_pages(client_for(admin_user), "/api/v1/jobs/?page_size=200")
    other = next(job for job in others if job["tenant"] != slug)
    client = api(user["token"])
    assert client.get(f"/api/v1/jobs/{other['id']}/").status_code == 404
    assert client.get(f"/api/v1/jobs/{other['id']}/events/").status_code == 404


def test_a_job_on_the_bench_target_is_admitted_by_the_first_pass(site):
    user, slug = next(
        (u, t["slug"]) for u in site["users"] for t in u["tenants"] if t["role"] in SUBMIT_ROLES
    )
    target = site["tenants"][slug]
    body = {
        "tenant": slug, "scenario": target["scenario"], "gpu_model": target["gpu_model"], "gpus": 4,
        "walltime_minutes": 60, "name": "loadbench", "cluster": site["cluster"], "partition": target["partition"],
        "script": "#!/bin/bash\nhostname\n",
    }  # fmt: skip
    response = api(user["token"]).post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 201, response.content
    job = Tenant.objects.get(slug=slug).jobs.get(pk=response.json()["id"])
    assert jobs_admit_marked(partition_id=job.partition_id) == [job.pk]  # what the admit task runs
    job.refresh_from_db()
    assert (job.state, job.holds_gpus, job.reason) == ("QUEUED", True, "")  # admitted: GPUs taken
    assert str(job.grant_id) == target["grant"]


def test_a_second_seed_is_refused_and_reset_replaces_only_the_seed(site, tmp_path):
    kept = TenantFactory(slug="protein-lab")
    with pytest.raises(CommandError, match="--reset"):
        seed(tmp_path / "again.json")
    assert not (tmp_path / "again.json").exists()
    assert Tenant.objects.filter(slug__startswith="seed-").count() == 5
    old_token = site["users"][0]["token"]
    fresh = seed(tmp_path / "again.json", "--reset", "--tenants", "3", "--users", "12", "--tokens", "4")
    assert Tenant.objects.filter(slug__startswith="seed-").count() == 3
    assert get_user_model().objects.filter(username__startswith="seed-u").count() == 12
    assert Tenant.objects.filter(pk=kept.pk).exists()
    assert api(old_token).get("/api/v1/me/").status_code == 401
    assert api(fresh["users"][0]["token"]).get("/api/v1/me/").status_code == 200
    assert all_pages(api(fresh["users"][0]["token"]), "/api/v1/jobs/?page_size=200")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tenants", "0"], "--tenants must be from 1"),
        (["--users", "3"], "--users (3) must be at least --tenants (5)"),
        (["--tokens", "31"], "--tokens must be from 0 to --users (30)"),
        (["--tokens", "30"], "seeded users may submit jobs"),  # viewers get none: refused after planning
        (["--finished", "-1"], "--finished must be from 0"),
        (["--cluster", "nowhere"], "register_testbed"),
        (["--bench-partition", "v100"], "no partition 'v100'; it has a100, h100"),
    ],
)
def test_bad_arguments_are_refused_with_the_reason(testbed_cluster, tmp_path, args, message):
    with pytest.raises(CommandError) as refused:
        seed(tmp_path / "site.json", *args)
    assert message in str(refused.value)
    assert not Tenant.objects.filter(slug__startswith="seed-").exists()
    assert list(tmp_path.iterdir()) == []
