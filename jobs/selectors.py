from datetime import date

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import F, QuerySet, Sum
from django.db.models.functions import TruncDate

from jobs.models import Job
from tenants.selectors import tenant_ids_visible_to


def jobs_visible_to(*, user: AbstractBaseUser) -> QuerySet[Job]:
    return Job.objects.filter(tenant_id__in=tenant_ids_visible_to(user=user)).select_related(
        "tenant", "scenario", "gpu_model", "cluster", "partition", "submitted_by"
    )


USAGE_KEYS = {
    "day": TruncDate("finished_at"),
    "user": F("submitted_by__username"),
    "gpu_model": F("gpu_model__slug"),
}


def usage_of(
    *, user: AbstractBaseUser, tenant_slug: str | None, start: date, end: date, group_by: str
) -> list[dict]:
    """GPU-hours of finished jobs the caller may see, by day, user or GPU model, in one query."""
    jobs = Job.objects.filter(
        tenant_id__in=tenant_ids_visible_to(user=user),
        finished_at__date__gte=start,
        finished_at__date__lte=end,
        gpu_hours__isnull=False,
    )
    if tenant_slug:
        jobs = jobs.filter(tenant__slug=tenant_slug)
    rows = (
        jobs.annotate(key=USAGE_KEYS[group_by])
        .values("key")
        .annotate(gpu_hours=Sum("gpu_hours"))
        .order_by("key")
    )
    return [{"key": str(row["key"]), "gpu_hours": float(row["gpu_hours"])} for row in rows]
