"""Every list of /api/v1 costs the same queries for a page of 1 row as for a page of 50, with 50
rows and more there: what a row shows is selected or prefetched with the page, never fetched
row by row. (Templates and usage are not paged; they cost the same at 1 row as at 50.)"""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from billing.pricing import midnight
from clusters.models import Cluster, GpuModel, Partition, Scenario, ScenarioGpu
from clusters.selectors import catalog_names_forget
from jobs.models import Job, JobState
from portal.core.services import audit_record
from portal.core.tokens import token_create
from tenants.models import QuotaGrant, QuotaRequest, Role
from tenants.services import membership_add
from tests.factories import ClusterFactory, PartitionFactory, QuotaGrantFactory, TenantFactory, UserFactory

pytestmark = pytest.mark.django_db

ROWS = 50
TODAY = timezone.localdate()


class Stack:
    """The rows behind each list, made for the tenant's owner to read."""

    def __init__(self, owner, tenant, catalog):
        self.owner, self.tenant = owner, tenant
        self.scenario, self.gpu_model = catalog
        self._grant = self._placement = None

    def grant(self) -> QuotaGrant:
        if self._grant is None:
            self._grant = QuotaGrantFactory(
                tenant=self.tenant, pair=(self.scenario, self.gpu_model), gpus=8, gpu_hours=1000
            )
        return self._grant

    def placement(self) -> tuple[Cluster, Partition]:
        if self._placement is None:
            cluster = ClusterFactory(slug="local", healthy=False)
            partition = PartitionFactory(cluster=cluster, gpu_model=self.gpu_model)
            self._placement = cluster, partition
        return self._placement

    def jobs(self, n: int, **fields) -> None:
        cluster, partition = self.placement()
        users = [UserFactory() for _ in range(3)]
        Job.objects.bulk_create(
            Job(
                tenant=self.tenant, submitted_by=users[i % 3], name=f"j{i}", scenario=self.scenario,
                gpu_model=self.gpu_model, grant=self.grant(), cluster=cluster, partition=partition, gpus=1,
                walltime_minutes=10, cpus_per_gpu=1, mem_per_gpu_mb=100, script="#!/bin/bash\n",
                reserved_gpu_hours=Decimal("0.17"), **fields,
            )
            for i in range(n)
        )  # fmt: skip

    def finished_jobs(self, n: int) -> None:
        self.jobs(n, state=JobState.COMPLETED, gpu_hours=Decimal("1.5"))
        # Spread over days, so that by day there is a row per day: each ran 1.5 h before noon.
        for i, job in enumerate(Job.objects.filter(state=JobState.COMPLETED).order_by("id")):
            noon = midnight(TODAY - timedelta(days=1 + i % 25)) + timedelta(hours=12)
            Job.objects.filter(pk=job.pk).update(started_at=noon - timedelta(hours=1.5), finished_at=noon)

    def fill(self, kind: str, n: int) -> None:
        owner, tenant = self.owner, self.tenant
        common = {"tenant": tenant, "scenario": self.scenario, "gpu_model": self.gpu_model, "gpus": 1}
        if kind == "jobs":
            self.jobs(n)
        elif kind == "usage":
            self.finished_jobs(n)
        elif kind == "quotas":
            QuotaGrant.objects.bulk_create(
                QuotaGrant(**common, gpu_hours=Decimal(1), starts_on=TODAY, ends_on=TODAY) for _ in range(n)
            )
        elif kind == "quota-requests":
            # Decided, each with its grant: every relation a row shows is there to be read.
            grants = QuotaGrant.objects.bulk_create(
                QuotaGrant(**common, gpu_hours=Decimal(1), starts_on=TODAY, ends_on=TODAY) for _ in range(n)
            )
            QuotaRequest.objects.bulk_create(
                QuotaRequest(
                    **common, gpu_hours=Decimal(1), starts_on=TODAY, ends_on=TODAY, justification="j",
                    requested_by=UserFactory(), decided_by=owner, grant=grant,
                )
                for grant in grants
            )  # fmt: skip
        elif kind == "tenants":
            for _ in range(n):
                membership_add(actor=None, tenant=TenantFactory(), user=owner, role=Role.VIEWER)
        elif kind == "members":
            for _ in range(n):
                membership_add(actor=None, tenant=tenant, user=UserFactory(), role=Role.MEMBER)
        elif kind == "audit":
            for _ in range(n):
                audit_record(actor=owner, action="test", target=tenant, tenant=tenant)
        elif kind == "tokens":
            for i in range(n):
                token_create(user=owner, name=f"t{i}")
        elif kind == "gpu-models":
            GpuModel.objects.bulk_create(gpu_model(f"gpu-{i:03}") for i in range(n))
        elif kind == "scenarios":
            gpus = list(GpuModel.objects.all()[:3])
            for i in range(n):
                scenario = Scenario.objects.create(
                    slug=f"scenario-{i:03}", name=f"S{i}", description="d", default_walltime_minutes=60
                )
                ScenarioGpu.objects.bulk_create(
                    ScenarioGpu(scenario=scenario, gpu_model=gpu, rank=rank, reason="r")
                    for rank, gpu in enumerate(gpus, start=1)
                )
        elif kind == "clusters":
            for i in range(n):
                cluster = ClusterFactory(slug=f"cluster-{i:03}", name=f"C{i}", local_gpus=4, healthy=False)
                Partition.objects.bulk_create(
                    Partition(
                        cluster=cluster, name=f"p{p}", gpu_model=self.gpu_model, gpus_per_node=4, nodes=1,
                        max_walltime_minutes=60,
                    )
                    for p in range(3)
                )  # fmt: skip


def gpu_model(slug: str) -> GpuModel:
    return GpuModel(
        slug=slug, vendor="nvidia", name=slug.upper(), memory_gb=24, fp64_tflops=1, fp32_tflops=30,
        fp16_tflops=120, memory_bandwidth_gbs=600, interconnect="PCIe", interconnect_gbs=64, ecc=True,
        cost_index=25, slurm_gres=slug, k8s_resource="nvidia.com/gpu", k8s_product=slug.upper(),
    )  # fmt: skip


PAGED = {
    "jobs": "/api/v1/jobs/",
    "quotas": "/api/v1/quotas/",
    "quota-requests": "/api/v1/quota-requests/",
    "tenants": "/api/v1/tenants/",
    "members": "/api/v1/tenants/protein-lab/members/",
    "audit": "/api/v1/audit/",
    "tokens": "/api/v1/auth/tokens/",
    "gpu-models": "/api/v1/gpu-models/",
    "scenarios": "/api/v1/scenarios/",
    "clusters": "/api/v1/clusters/",
}


@pytest.fixture
def stack(owner, tenant, catalog):
    return Stack(owner, tenant, catalog)


@pytest.fixture
def client(client_for, owner):
    client = client_for(owner)
    client.get("/api/v1/me/")  # a token's first use writes last_used; measure the steady state
    return client


def queries_of(client, url: str) -> tuple[list[str], dict]:
    catalog_names_forget()  # each request reads the catalog's names, as the first one would
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url)
    assert response.status_code == 200, response.content
    return [q["sql"] for q in captured.captured_queries], response.json()


@pytest.mark.parametrize("kind", sorted(PAGED))
def test_a_page_of_1_and_a_page_of_50_cost_the_same_queries(stack, client, kind):
    stack.fill(kind, ROWS + 1)
    one, first = queries_of(client, f"{PAGED[kind]}?page_size=1")
    fifty, page = queries_of(client, f"{PAGED[kind]}?page_size=50")
    assert len(first["results"]) == 1 and len(page["results"]) == 50 and page["next"]
    assert len(one) == len(fifty), "\n".join(fifty)


def test_templates_cost_the_same_queries_whatever_the_page_size(client):
    one, first = queries_of(client, "/api/v1/templates/?page_size=1")
    fifty, page = queries_of(client, "/api/v1/templates/?page_size=50")
    assert first == page and first["results"]
    assert len(one) == len(fifty)


@pytest.mark.parametrize("group_by", ["day", "user", "gpu_model"])
def test_usage_costs_the_same_queries_at_1_and_50_jobs(stack, client, group_by):
    url = f"/api/v1/usage/?group_by={group_by}"
    stack.fill("usage", 1)
    one, few = queries_of(client, url)
    stack.fill("usage", ROWS - 1)
    fifty, many = queries_of(client, url)
    assert sum(row["gpu_hours"] for row in few["results"]) == 1.5
    assert sum(row["gpu_hours"] for row in many["results"]) == 1.5 * ROWS
    assert len(one) == len(fifty), "\n".join(fifty)
