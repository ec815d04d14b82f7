"""The price list as everyone signed in reads it: each row with the moment the next row of its
model and share takes over, and whether it is in force now."""

from datetime import datetime

from django.db.models import OuterRef, QuerySet, Subquery

from billing.models import Price, TierMultiplier


def price_list(*, gpu_model: str = "", share: str = "") -> QuerySet[Price]:
    """Every price, past ones included (a price is never rewritten), with `until`: the next
    price's start for the same model and share, or None while it is the last one."""
    following = Price.objects.filter(
        gpu_model_id=OuterRef("gpu_model_id"),
        share=OuterRef("share"),
        effective_from__gt=OuterRef("effective_from"),
    ).order_by("effective_from")
    rows = Price.objects.select_related("gpu_model").annotate(
        until=Subquery(following.values("effective_from")[:1])
    )
    if gpu_model:
        rows = rows.filter(gpu_model__slug=gpu_model)
    if share:
        rows = rows.filter(share=share)
    return rows


def multiplier_list() -> QuerySet[TierMultiplier]:
    following = TierMultiplier.objects.filter(
        tier=OuterRef("tier"), effective_from__gt=OuterRef("effective_from")
    ).order_by("effective_from")
    return TierMultiplier.objects.annotate(until=Subquery(following.values("effective_from")[:1]))


def in_force(row, now: datetime) -> bool:
    return row.effective_from <= now and (row.until is None or now < row.until)
