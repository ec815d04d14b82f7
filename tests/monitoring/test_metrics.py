"""/metrics: who may read it, and what it says of requests, jobs, tenants, grants and the queue."""

from datetime import date, timedelta
from decimal import Decimal

import pytest
from django.test import override_settings
from django.urls import resolve
from django.utils import timezone

from billing.models import Budget, BudgetNotice, BudgetPeriod
from jobs.models import JobState
from tests.factories import ClusterFactory, JobFactory, PartitionFactory, QuotaGrantFactory, TenantFactory
from tests.monitoring_support import TOKEN, samples, scrape, value

pytestmark = pytest.mark.django_db


@override_settings(METRICS_TOKEN=None)
def test_metrics_are_off_without_a_token_setting(client):
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer anything").status_code == 404


@override_settings(METRICS_TOKEN=TOKEN)
@pytest.mark.parametrize("header", [None, "Bearer wrong", f"Basic {TOKEN}", f"Bearer {TOKEN}x", "Bearer "])
def test_metrics_refuse_a_caller_without_the_token(client, header):
    extra = {"HTTP_AUTHORIZATION": header} if header is not None else {}
    response = client.get("/metrics", **extra)
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert b"portal_" not in response.content


@override_settings(METRICS_TOKEN=TOKEN)
def test_requests_are_counted_per_route_pattern_never_per_path(client, admin_user):
    client.force_login(admin_user)
    before = scrape(client)
    for job_id in (101, 202, 303):
        assert client.get(f"/api/v1/jobs/{job_id}/").status_code == 404
    client.get("/no/such/page/12345")
    text = scrape(client)
    route = resolve("/api/v1/jobs/1/").route  # the pattern, as DRF's router wrote it
    assert "<pk>" in route
    key = {"route": route, "method": "GET", "status": "404"}
    count = value(text, "portal_http_request_duration_seconds_count", **key)
    assert count - (value(before, "portal_http_request_duration_seconds_count", **key) or 0) == 3
    # The 200 ms edge exists, so that histogram_quantile can tell the SLA's P99 apart.
    assert value(text, "portal_http_request_duration_seconds_bucket", le="0.2", **key) is not None
    routes = {dict(labels).get("route") for name, labels in samples(text) if name.startswith("portal_http")}
    assert "unmatched" in routes
    assert not any(str(job_id) in route for route in routes for job_id in (101, 202, 303, 12345))


@override_settings(METRICS_TOKEN=TOKEN)
def test_throttled_and_failed_requests_are_counted(client, settings):
    before = scrape(client)
    # The login lockout answers 429: six wrong passwords from one address for one name.
    for _ in range(settings.LOGIN_FAILURE_LIMIT + 1):
        client.post("/accounts/login/", {"username": "nobody-here", "password": "wrong"})
    text = scrape(client)
    key = {"route": "accounts/login/", "status": "429"}
    assert (
        value(text, "portal_http_requests_throttled_total", **key)
        - (value(before, "portal_http_requests_throttled_total", **key) or 0)
        >= 1
    )


@override_settings(METRICS_TOKEN=TOKEN)
def test_jobs_by_state_per_cluster_and_cluster_health(client, catalog):
    up = ClusterFactory(slug="gpu-a", healthy=True)
    down = ClusterFactory(slug="gpu-b", healthy=False)
    grant = QuotaGrantFactory(pair=catalog, gpus=8, gpu_hours=1000)
    part_a = PartitionFactory(cluster=up, gpu_model=catalog[1])
    part_b = PartitionFactory(cluster=down, gpu_model=catalog[1])
    for state, partition, n in [
        (JobState.RUNNING, part_a, 3), (JobState.PENDING, part_a, 2), (JobState.QUEUED, part_b, 1),
        (JobState.COMPLETED, part_a, 5),
    ]:  # fmt: skip
        JobFactory.create_batch(n, grant=grant, partition=partition, state=state)
    text = scrape(client)
    assert value(text, "portal_jobs", cluster="gpu-a", state="RUNNING") == 3
    assert value(text, "portal_jobs", cluster="gpu-a", state="PENDING") == 2
    assert value(text, "portal_jobs", cluster="gpu-a", state="QUEUED") == 0
    assert value(text, "portal_jobs", cluster="gpu-b", state="QUEUED") == 1
    assert value(text, "portal_jobs", cluster="gpu-a", state="COMPLETED") is None  # ends: a counter
    assert value(text, "portal_cluster_up", cluster="gpu-a", kind="local") == 1
    assert value(text, "portal_cluster_up", cluster="gpu-b", kind="local") == 0


@override_settings(METRICS_TOKEN=TOKEN)
def test_gpus_and_gpu_hours_per_tenant_and_grant(client, catalog):
    lab = TenantFactory(slug="lab-x")
    idle = TenantFactory(slug="lab-y")
    grant = QuotaGrantFactory(
        tenant=lab, pair=catalog, gpus=8, gpu_hours=200, gpu_hours_used=Decimal("181.5"),
        gpu_hours_reserved=Decimal("4"),
    )  # fmt: skip
    QuotaGrantFactory(tenant=lab, pair=catalog, gpus=2, gpu_hours=50, starts_on=date(2020, 1, 1), days=10)
    partition = PartitionFactory(gpu_model=catalog[1])
    JobFactory(grant=grant, partition=partition, gpus=3, holds_gpus=True, state=JobState.RUNNING)
    JobFactory(grant=grant, partition=partition, gpus=2, holds_gpus=False, state=JobState.QUEUED)
    text = scrape(client)
    key = {"tenant": "lab-x", "scenario": catalog[0].slug, "gpu_model": catalog[1].slug}
    assert value(text, "portal_tenant_gpus_in_use", tenant="lab-x") == 3
    assert value(text, "portal_tenant_gpus_in_use", tenant=idle.slug) == 0
    assert value(text, "portal_grant_gpus", **key) == 8  # the ended grant is not summed in
    assert value(text, "portal_grant_gpu_hours", **key) == 200
    assert value(text, "portal_grant_gpu_hours_used", **key) == 181.5
    assert value(text, "portal_grant_gpu_hours_reserved", **key) == 4


@override_settings(METRICS_TOKEN=TOKEN)
def test_each_budgets_highest_threshold_of_its_period(client, catalog):
    """From the notices the budgets' check recorded: this month's, not last month's; a grant's
    budget while its grant lasts."""
    lab, other = TenantFactory(slug="lab-x"), TenantFactory(slug="lab-y")
    monthly = Budget.objects.create(tenant=lab, period=BudgetPeriod.MONTH, amount=Decimal(100))
    this_month = timezone.localdate().replace(day=1)
    last_month = (this_month - timedelta(days=1)).replace(day=1)
    for start, threshold in ((last_month, 100), (this_month, 50), (this_month, 80)):
        BudgetNotice.objects.create(budget=monthly, period_start=start, threshold=threshold, spent=Decimal(0))
    grant = QuotaGrantFactory(tenant=other, pair=catalog, gpus=1, gpu_hours=10)
    Budget.objects.create(tenant=other, period=BudgetPeriod.GRANT, grant=grant, amount=Decimal(5))
    text = scrape(client)
    assert value(text, "portal_budget_threshold_percent", tenant="lab-x", period="month", grant="") == 80
    assert (
        value(text, "portal_budget_threshold_percent", tenant="lab-y", period="grant", grant=str(grant.pk))
        == 0
    )


@override_settings(METRICS_TOKEN=TOKEN)
def test_queue_depth_is_read_from_the_broker_at_scrape_time(client):
    from portal.celery import app
    from portal.core.tasks import ping

    app.control.purge()
    assert value(scrape(client), "portal_celery_queue_messages", queue="celery") == 0
    for _ in range(3):
        ping.delay()  # no worker runs: they wait in Redis
    try:
        assert value(scrape(client), "portal_celery_queue_messages", queue="celery") == 3
    finally:
        app.control.purge()


@override_settings(METRICS_TOKEN=TOKEN, CELERY_BROKER_URL="redis://127.0.0.1:1/0")
def test_a_broker_that_cannot_be_read_leaves_a_gap_not_a_zero(client, settings):
    from portal.celery import app

    TenantFactory(slug="still-read")
    before = value(scrape(client), "portal_scrape_errors_total", source="broker") or 0
    app.conf.broker_url = "redis://127.0.0.1:1/0"
    app.conf.broker_connection_retry = False
    app.conf.broker_connection_max_retries = 0
    try:
        text = scrape(client)
    finally:
        app.conf.broker_url = settings.REDIS_URL
        app.conf.broker_connection_retry = True
        app.conf.broker_connection_max_retries = 100
    assert value(text, "portal_celery_queue_messages", queue="celery") is None
    assert value(text, "portal_scrape_errors_total", source="broker") == before + 1
    assert value(text, "portal_tenant_gpus_in_use", tenant="still-read") == 0  # the database's stay
