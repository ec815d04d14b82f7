"""TCO profiles as platform admins keep them: who sees them, the GPU-hours their clusters delivered
over the last year (the measured utilization), their figures (reports/tco.py), and the writes,
each audited: create, change, delete, and the example of published figures."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.db.models import Prefetch, Q, QuerySet
from django.utils import timezone

from clusters.models import Cluster, GpuModel
from jobs.costs import attempts_prefetch, pieces_of
from jobs.models import Job
from portal.core.errors import Conflict, Invalid
from portal.core.services import audit_record
from portal.core.staff import is_platform_admin
from reports import tco
from reports.models import CloudPrice, TcoProfile
from reports.tco import ONE

YEAR = timedelta(days=365)  # the measured year, as long as tco.HOURS_PER_YEAR
EXAMPLE_GPU_MODEL = "h100-80gb"
# What pieces_of reads of a job, and where it ran.
JOB_FIELDS = (
    "id", "gpu_model_id", "cluster_id", "state", "gpus", "device_fraction", "started_at", "gpu_hours",
    "reserved_gpu_hours", "attempt",
)  # fmt: skip
COST_FIELDS = (
    "nodes", "gpus_per_node", "node_price", "depreciation_years", "power_w_per_gpu",
    "electricity_per_kwh", "pue", "staff_per_year", "space_per_year",
)  # fmt: skip


# --- Reads


def tco_profiles_visible_to(*, user: AbstractBaseUser) -> QuerySet[TcoProfile]:
    """Every profile for platform admins, none for anyone else; with what a row shows."""
    if not is_platform_admin(user):
        return TcoProfile.objects.none()
    return TcoProfile.objects.select_related("cluster", "gpu_model", "updated_by").prefetch_related(
        Prefetch("cloud_prices", queryset=CloudPrice.objects.order_by("per_gpu_hour", "provider"))
    )


def _overlap(start: datetime, end: datetime, since: datetime, until: datetime) -> float:
    return max(0.0, (min(end, until) - max(start, since)).total_seconds())


def delivered_gpu_hours(*, profiles: list[TcoProfile], now: datetime) -> dict[int, Decimal]:
    """Each profile's delivered GPU-hours over the 365 days up to now: the charged,
    device-equivalent GPU-hours (jobs/costs.py) of jobs of its GPU model on its cluster (every
    cluster for the site's profile), a running job's so far; a run that began before the year
    counts for its part inside it. One query for all the profiles, one for the jobs' attempts."""
    since = now - YEAR
    delivered = {profile.pk: tco.ZERO for profile in profiles}
    if not profiles:
        return delivered
    jobs = (
        Job.objects.filter(gpu_model_id__in={profile.gpu_model_id for profile in profiles})
        .filter(
            Q(finished_at__gte=since)
            | Q(finished_at__isnull=True, started_at__isnull=False)
            | Q(finished_at__isnull=True, attempt__gt=1)
        )
        .only(*JOB_FIELDS)
        .prefetch_related(attempts_prefetch())
    )
    for job in jobs:
        hours = tco.ZERO
        for piece in pieces_of(job, now=now):
            whole = (piece.end - piece.start).total_seconds()
            if whole <= 0:
                continue
            inside = _overlap(piece.start, piece.end, since, now)
            share = ONE if inside >= whole else Decimal(inside) / Decimal(whole)
            hours += piece.gpu_hours * share
        if hours <= 0:
            continue
        for profile in profiles:
            same_place = profile.cluster_id is None or profile.cluster_id == job.cluster_id
            if profile.gpu_model_id == job.gpu_model_id and same_place:
                delivered[profile.pk] += hours
    return delivered


def costs_of(profile: TcoProfile) -> tco.Costs:
    return tco.Costs(**{name: getattr(profile, name) for name in COST_FIELDS})


@dataclass(frozen=True)
class ProfileFigures:
    """A profile and its figures: at the measured utilization, or at the caller's what-if."""

    profile: TcoProfile
    measured_utilization: Decimal
    overridden: bool
    figures: tco.Tco


def figures_of(
    profiles: list[TcoProfile], *, now: datetime | None = None, utilization: Decimal | None = None
) -> list[ProfileFigures]:
    """Each profile's figures (its cloud prices prefetched, as tco_profiles_visible_to does)."""
    delivered = delivered_gpu_hours(profiles=profiles, now=now or timezone.now())
    out = []
    for profile in profiles:
        costs = costs_of(profile)
        measured = tco.utilization_of(delivered[profile.pk], tco.gpu_hours_available(costs))
        clouds = [(price.provider, price.per_gpu_hour) for price in profile.cloud_prices.all()]
        used = measured if utilization is None else utilization
        figures = tco.tco(costs, utilization=used, clouds=clouds)
        out.append(ProfileFigures(profile, measured, utilization is not None, figures))
    return out


# --- Writes


def _check_place(*, cluster: Cluster | None, profile: TcoProfile | None = None) -> None:
    others = TcoProfile.objects.filter(cluster=cluster)
    if profile is not None:
        others = others.exclude(pk=profile.pk)
    if others.exists():
        where = f"cluster {cluster.slug}" if cluster is not None else "the whole site (no cluster)"
        raise Invalid({"cluster": f"A TCO profile for {where} exists already: change that one."})


def _check_prices(cloud_prices: list[dict]) -> None:
    providers = [price["provider"] for price in cloud_prices]
    if len(set(providers)) != len(providers):
        raise Invalid({"cloud_prices": "Each provider may appear once."})


def _saved(profile: TcoProfile, cluster: Cluster | None) -> None:
    try:
        with transaction.atomic():  # a savepoint: the race of two creates for one place
            profile.save()
    except IntegrityError:
        _check_place(cluster=cluster, profile=profile)
        raise


def _set_prices(profile: TcoProfile, cloud_prices: list[dict]) -> None:
    profile.cloud_prices.all().delete()
    CloudPrice.objects.bulk_create(
        CloudPrice(profile=profile, provider=price["provider"], per_gpu_hour=price["per_gpu_hour"])
        for price in cloud_prices
    )


def _audit_value(value):
    if isinstance(value, Cluster | GpuModel):
        return value.slug
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, list):  # cloud prices
        return [{"provider": p["provider"], "per_gpu_hour": str(p["per_gpu_hour"])} for p in value]
    return value


@transaction.atomic
def tco_profile_create(
    *,
    actor: AbstractBaseUser,
    name: str,
    gpu_model: GpuModel,
    cluster: Cluster | None = None,
    cloud_prices: list[dict] = (),
    **costs,
) -> TcoProfile:
    """A profile for a cluster, or for the whole site (no cluster): one of each at most.
    Raises Invalid naming `cluster` when its place has one, `cloud_prices` for a provider twice."""
    cloud_prices = list(cloud_prices)
    fields = {"name": name, "cluster": cluster, "gpu_model": gpu_model, **costs, "cloud_prices": cloud_prices}
    _check_place(cluster=cluster)
    _check_prices(cloud_prices)
    profile = TcoProfile(name=name, cluster=cluster, gpu_model=gpu_model, updated_by=actor, **costs)
    _saved(profile, cluster)
    _set_prices(profile, cloud_prices)
    audit_record(actor=actor, action="tco_profile.create", target=profile,
                 data={key: _audit_value(value) for key, value in fields.items()})  # fmt: skip
    return profile


@transaction.atomic
def tco_profile_change(*, actor: AbstractBaseUser, profile: TcoProfile, **fields) -> TcoProfile:
    """Any of the profile's fields; `cloud_prices`, when given, replaces all of its prices.
    The audit record holds each changed field as [old, new]."""
    profile = TcoProfile.objects.select_for_update().get(pk=profile.pk)
    prices = fields.pop("cloud_prices", None)
    if "cluster" in fields:
        _check_place(cluster=fields["cluster"], profile=profile)
    changed = {}
    for name, value in fields.items():
        old = getattr(profile, name)
        if old != value:
            changed[name] = [_audit_value(old), _audit_value(value)]
            setattr(profile, name, value)
    if prices is not None:
        _check_prices(prices)
        old_prices = [
            {"provider": p.provider, "per_gpu_hour": p.per_gpu_hour} for p in profile.cloud_prices.all()
        ]
        key = [(p["provider"], p["per_gpu_hour"]) for p in prices]
        if sorted(key) != sorted((p["provider"], p["per_gpu_hour"]) for p in old_prices):
            changed["cloud_prices"] = [_audit_value(old_prices), _audit_value(prices)]
            _set_prices(profile, prices)
    profile.updated_by = actor
    _saved(profile, profile.cluster)
    if changed:
        audit_record(actor=actor, action="tco_profile.change", target=profile, data=changed)
    return TcoProfile.objects.get(pk=profile.pk)


@transaction.atomic
def tco_profile_delete(*, actor: AbstractBaseUser, profile: TcoProfile) -> None:
    """The profile and its cloud prices go; the audit record keeps its name and place."""
    audit_record(actor=actor, action="tco_profile.delete", target=profile,
                 data={"name": profile.name, "cluster": getattr(profile.cluster, "slug", None)})  # fmt: skip
    profile.delete()


def tco_example_load(*, actor: AbstractBaseUser | None, rate: Decimal | None = None) -> TcoProfile:
    """The example of published figures (reports/tco.py) as the site's profile, for H100 80GB,
    in the site's currency: its US-dollar amounts times `rate` (site currency per US dollar).
    `rate` is needed unless the site's currency is USD. Raises Invalid naming `rate` without it,
    Conflict when the site has its profile already."""
    if rate is None:
        if settings.PORTAL_CURRENCY != tco.EXAMPLE_CURRENCY:
            raise Invalid({"rate": f"Give how many {settings.PORTAL_CURRENCY} one US dollar is worth."})
        rate = tco.ONE
    if rate <= 0:
        raise Invalid({"rate": "Must be more than 0."})
    gpu_model = GpuModel.objects.filter(slug=EXAMPLE_GPU_MODEL).first()
    if gpu_model is None:
        raise Invalid({"gpu_model": f"The catalog has no GPU model {EXAMPLE_GPU_MODEL}."})
    if TcoProfile.objects.filter(cluster=None).exists():
        raise Conflict("The site has its TCO profile already: delete it first to load the example.")
    figures, clouds = tco.example_in(rate)
    prices = [{"provider": provider, "per_gpu_hour": price} for provider, price in clouds]
    return tco_profile_create(actor=actor, gpu_model=gpu_model, cluster=None, cloud_prices=prices, **figures)
