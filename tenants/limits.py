"""The schedulers' view of a tenant: its account or namespace and its limits."""

import logging
from decimal import Decimal

from django.db import transaction
from django.utils import timezone
from kombu.exceptions import OperationalError

from clusters.backends.base import TenantLimits
from clusters.models import Cluster, IdentityCheck
from clusters.services import backend_of
from clusters.shares import ShareKind, k8s_quota_resources
from tenants.models import CohortMember, QuotaGrant, Tenant, TenantState
from tenants.selectors import tenant_identities

log = logging.getLogger("tenants.limits")


def tenant_limits(*, tenant: Tenant, cluster: Cluster) -> TenantLimits:
    """The tenant's limits on one cluster, from its active grants for the GPU models there:
    concurrent units per GRES type (GrpTRES; a MIG profile is its own type, as AutoDetect=nvml
    names it, shards are gres/shard), per Kubernetes resource (clusters/shares.py), and the
    GPU-minutes granted (GrpTRESMins).

    Granted, not remaining: Slurm counts the account's usage itself (and lets it decay), so a
    limit of the remaining minutes would count every finished job twice and hold back jobs the
    portal's own ledger has admitted. The ledger is the exact limit; Slurm's is the backstop.
    Slurm counts a MIG instance's minute as a GPU-minute, so a MIG grant's device-equivalent
    hours are divided by its profile's fraction there; shards have no minutes limit of their
    own in Slurm (the ledger holds them)."""
    today = timezone.localdate()
    models_here = set(cluster.partitions.values_list("gpu_model_id", flat=True))
    gpus_by_type: dict[str, int] = {}
    k8s: dict[str, int] = {}
    shards = 0
    minutes = Decimal(0)
    grants = QuotaGrant.objects.active_on(today).filter(tenant=tenant)
    grants = grants.select_related("gpu_model")
    if tenant.state == TenantState.ACTIVE:
        for grant in grants:
            if grant.gpu_model_id not in models_here:
                continue
            model = grant.gpu_model
            if grant.share == ShareKind.SHARD:
                shards += grant.gpus
            elif grant.share == ShareKind.SLICE:
                # Slurm gives no slices: they count on Kubernetes alone (HAMi's count of shared
                # devices), never as Slurm GPUs or GPU-minutes
                for name, count in k8s_quota_resources(
                    vendor=model.vendor, resource=model.k8s_resource, kind=grant.share, units=grant.gpus
                ).items():
                    k8s[name] = k8s.get(name, 0) + count
            else:
                gpu_type = grant.mig_profile if grant.share == ShareKind.MIG else model.slurm_gres
                gpus_by_type[gpu_type] = gpus_by_type.get(gpu_type, 0) + grant.gpus
                profile = model.mig_profile(grant.mig_profile) if grant.share == ShareKind.MIG else None
                minutes += grant.gpu_hours * 60 / (profile.fraction if profile else 1)
                for name, count in k8s_quota_resources(
                    vendor=model.vendor,
                    resource=model.k8s_resource,
                    kind=grant.share,
                    units=grant.gpus,
                    mig_profile=grant.mig_profile,
                ).items():
                    k8s[name] = k8s.get(name, 0) + count
    cohort, lending, borrowing = _cohort_limits(tenant, models_here, gpus_by_type, k8s)
    return TenantLimits(
        cohort=cohort,
        k8s_lending=lending,
        k8s_borrowing=borrowing,
        account=tenant.slug,
        qos=f"portal-{tenant.tier}",
        # the identities its jobs run as: never the service user, which keeps no association here
        users=tenant_identities(cluster=cluster, tenant=tenant),
        gpus_by_type=gpus_by_type,
        gpu_minutes=int(minutes),
        k8s_resources=k8s,
        shards=shards,
    )


def _cohort_limits(
    tenant: Tenant, models_here: set[int], gpus_by_type: dict[str, int], k8s: dict[str, int]
) -> tuple[str, dict[str, int], dict[str, int]]:
    """A tenant that may borrow whole GPUs of a model here holds that many more at once in the
    scheduler's limits (GrpTRES, ResourceQuota): the portal's ledger decides each loan, and the
    scheduler's limit is its backstop, which must let a borrowed job run. Returns, for Kueue's
    ClusterQueue, the tenant's cohort here (the first, by slug) and its lending and borrowing
    limits per resource."""
    cohort, lending, borrowing = "", {}, {}
    if tenant.state != TenantState.ACTIVE:
        return cohort, lending, borrowing
    places = CohortMember.objects.filter(tenant=tenant, cohort__gpu_model_id__in=models_here)
    for place in places.select_related("cohort__gpu_model").order_by("cohort__slug"):
        model = place.cohort.gpu_model
        if place.borrowing_limit:
            gpus_by_type[model.slurm_gres] = gpus_by_type.get(model.slurm_gres, 0) + place.borrowing_limit
            k8s[model.k8s_resource] = k8s.get(model.k8s_resource, 0) + place.borrowing_limit
        cohort = cohort or place.cohort.slug
        lending[model.k8s_resource] = lending.get(model.k8s_resource, 0) + place.lending_limit
        borrowing[model.k8s_resource] = borrowing.get(model.k8s_resource, 0) + place.borrowing_limit
    return cohort, lending, borrowing


def tenant_apply(*, tenant_id: int, cluster_id: int) -> TenantLimits:
    """Create or update the tenant's account and limits on one cluster. Idempotent."""
    tenant = Tenant.objects.get(pk=tenant_id)
    cluster = Cluster.objects.get(pk=cluster_id)
    limits = tenant_limits(tenant=tenant, cluster=cluster)
    backend = backend_of(cluster)
    backend.apply_tenant(limits)
    identities_record(cluster=cluster, problems=backend.identities_check(limits.users))
    return limits


def identities_record(*, cluster: Cluster, problems: dict[str, str]) -> None:
    """Keep what a check found of each identity (the tenant's page shows the problems)."""
    now = timezone.now()
    for username, problem in problems.items():
        IdentityCheck.objects.update_or_create(
            cluster=cluster, username=username, defaults={"problem": problem[:300], "checked_at": now}
        )


def tenant_limits_follow(*, tenant_id: int) -> None:
    """After commit, the tenant's limits applied again on every enabled cluster
    (tenants.tasks.apply_tenant): its grants, tier or state changed. A broker that is down costs
    only the message: apply-tenants applies every tenant's limits again within the hour."""
    from tenants.tasks import apply_tenant  # tasks import this module

    def send() -> None:
        try:
            # ignore_result: nobody waits for it, and outside a worker Celery would first subscribe
            # to the result backend, which blocks for seconds while Redis is down.
            apply_tenant.apply_async(kwargs={"tenant_id": tenant_id}, ignore_result=True)
        except OperationalError as exc:
            log.warning(
                "broker unreachable, apply_tenant(tenant_id=%s) left to apply-tenants: %s", tenant_id, exc
            )

    transaction.on_commit(send)
