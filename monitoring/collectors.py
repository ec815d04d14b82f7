"""What /metrics reads at scrape time, from the database and the broker: the state of things
now, rather than counts of events (those are monitoring.metrics's). A few small aggregate
queries per scrape (docs/architecture.md, Metrics; bench/metrics_scrape.py prints the cost on
the seeded site).

A source that cannot be read (the broker down) leaves its metrics out of that scrape and counts
portal_scrape_errors_total{source}: Prometheus shows a gap, never a made-up zero."""

from __future__ import annotations

import logging
from decimal import Decimal

from django.db.models import Count, Max, Sum
from django.utils import timezone
from kombu.exceptions import ChannelError
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from billing.models import Budget, BudgetNotice
from clusters.breaker import breakers_cooling
from clusters.models import Cluster
from jobs.models import Job, JobState
from jobs.states import END_STATES
from tenants.models import QuotaGrant, Tenant, TenantState

log = logging.getLogger(__name__)

WAITING_AND_ACTIVE = [state for state in JobState.values if state not in END_STATES]
_errors: dict[str, int] = {}  # source → failed reads, in this process


def queue_depths() -> dict[str, int]:
    """Messages waiting in each of the worker's queues, as the broker counts them (kombu's
    passive declare: LLEN on Redis, a directory listing on the filesystem broker)."""
    from portal.celery import app

    depths = {}
    with app.connection_for_read() as connection:
        channel = connection.default_channel
        for name in sorted(app.amqp.queues) or [app.conf.task_default_queue]:
            try:
                depths[name] = channel.queue_declare(queue=name, passive=True).message_count
            except ChannelError:  # NOT_FOUND: no message was ever sent to it, so none waits
                depths[name] = 0
    return depths


class PortalCollector:
    """The scrape-time families. Registered on the registry /metrics builds for each scrape."""

    def collect(self):
        yield from self._guarded("broker", self._queues)
        yield from self._guarded("database", self._clusters_and_jobs)
        yield from self._guarded("database", self._tenants)
        yield from self._guarded("database", self._budgets)
        errors = CounterMetricFamily(
            "portal_scrape_errors", "Sources /metrics could not read, in this process.", labels=["source"]
        )
        for source, count in sorted(_errors.items()):
            errors.add_metric([source], count)
        yield errors

    def _guarded(self, source: str, read):
        try:
            families = list(read())
        except Exception as exc:
            log.warning("metrics: %s could not be read: %s", source, exc)
            _errors[source] = _errors.get(source, 0) + 1
            return []
        return families

    def _queues(self):
        depth = GaugeMetricFamily(
            "portal_celery_queue_messages", "Messages waiting in a Celery queue.", labels=["queue"]
        )
        for name, count in queue_depths().items():
            depth.add_metric([name], count)
        yield depth

    def _clusters_and_jobs(self):
        clusters = list(Cluster.objects.filter(enabled=True).values_list("pk", "slug", "kind", "healthy"))
        cooling = breakers_cooling(cluster_ids={pk for pk, *_ in clusters}) if clusters else set()
        up = GaugeMetricFamily(
            "portal_cluster_up",
            "1 when the cluster answered its last contact and its circuit breaker is closed.",
            labels=["cluster", "kind"],
        )
        for pk, slug, kind, healthy in clusters:
            up.add_metric([slug, kind], 1.0 if healthy and pk not in cooling else 0.0)
        yield up
        jobs = GaugeMetricFamily(
            "portal_jobs",
            "Jobs not yet ended, per cluster and state (ended ones: portal_jobs_ended_total).",
            labels=["cluster", "state"],
        )
        rows = (
            Job.objects.filter(state__in=WAITING_AND_ACTIVE)
            .values_list("cluster__slug", "state")
            .annotate(n=Count("pk"))
            .order_by()
        )
        counts = {(cluster, state): n for cluster, state, n in rows}
        for _pk, slug, _kind, _healthy in clusters:
            for state in WAITING_AND_ACTIVE:  # every state, 0 included: a rate() needs the series
                jobs.add_metric([slug, state], counts.pop((slug, state), 0))
        for (slug, state), n in sorted(counts.items()):  # a disabled cluster's jobs still count
            jobs.add_metric([slug, state], n)
        yield jobs

    def _tenants(self):
        today = timezone.localdate()
        in_use = dict(
            Job.objects.filter(holds_gpus=True).values_list("tenant__slug").annotate(n=Sum("gpus")).order_by()
        )
        grants = (
            QuotaGrant.objects.active_on(today)
            .values_list("tenant__slug", "scenario__slug", "gpu_model__slug")
            .annotate(
                gpus=Sum("gpus"),
                hours=Sum("gpu_hours"),
                used=Sum("gpu_hours_used"),
                reserved=Sum("gpu_hours_reserved"),
            )
            .order_by()
        )
        labels = ["tenant", "scenario", "gpu_model"]
        granted_gpus = GaugeMetricFamily(
            "portal_grant_gpus", "GPUs at once an active grant allows.", labels=labels
        )
        granted_hours = GaugeMetricFamily(
            "portal_grant_gpu_hours", "GPU-hours an active grant gives.", labels=labels
        )
        used_hours = GaugeMetricFamily(
            "portal_grant_gpu_hours_used", "GPU-hours finished jobs used of an active grant.", labels=labels
        )
        reserved_hours = GaugeMetricFamily(
            "portal_grant_gpu_hours_reserved",
            "GPU-hours waiting and running jobs hold of an active grant (GPUs × walltime).",
            labels=labels,
        )
        for tenant, scenario, model, gpus, hours, used, reserved in grants:
            key = [tenant, scenario, model]
            granted_gpus.add_metric(key, gpus)
            granted_hours.add_metric(key, float(hours or Decimal(0)))
            used_hours.add_metric(key, float(used or Decimal(0)))
            reserved_hours.add_metric(key, float(reserved or Decimal(0)))
        gpus = GaugeMetricFamily(
            "portal_tenant_gpus_in_use", "GPUs the tenant's jobs hold now.", labels=["tenant"]
        )
        active = Tenant.objects.exclude(state=TenantState.SUSPENDED).values_list("slug", flat=True)
        for slug in active:
            gpus.add_metric([slug], in_use.pop(slug, 0))
        for slug, n in sorted(in_use.items()):
            gpus.add_metric([slug], n)
        yield from (gpus, granted_gpus, granted_hours, used_hours, reserved_hours)

    def _budgets(self):
        """Each budget's highest threshold told in its current period (billing.BudgetNotice, which
        the budgets' check records): 0, 50, 80 or 100. Read from the notices, two queries, rather
        than priced at each scrape; the alert rules BudgetNearlySpent and BudgetSpent read it."""
        today = timezone.localdate()
        budgets = list(Budget.objects.select_related("tenant", "grant"))
        reached = {
            (budget_id, start): top
            for budget_id, start, top in BudgetNotice.objects.values_list("budget_id", "period_start")
            .annotate(top=Max("threshold"))
            .order_by()
        }
        threshold = GaugeMetricFamily(
            "portal_budget_threshold_percent",
            "The highest share of a budget (50, 80, 100; 0: none yet) its period has passed.",
            labels=["tenant", "period", "grant"],
        )
        for budget in budgets:
            if budget.grant_id is None:
                start, grant = today.replace(day=1), ""
            elif budget.grant.ends_on < today:
                continue  # a grant's budget ends with its grant
            else:
                start, grant = budget.grant.starts_on, str(budget.grant_id)
            threshold.add_metric(
                [budget.tenant.slug, budget.period, grant], reached.get((budget.pk, start), 0)
            )
        yield threshold
