"""Changes to the price list: a price or multiplier is added for now or later, never for the
past, and withdrawn only before it comes into force, so that no cost already incurred changes."""

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone
from django.utils.translation import gettext as _

from billing.models import Price, TierMultiplier
from portal.core.services import audit_record

# A price added "now" from a form reaches the database a moment later: this much is still now.
NOW_SLACK_S = 60


def not_in_the_past(effective_from) -> None:
    if effective_from < timezone.now() - timezone.timedelta(seconds=NOW_SLACK_S):
        raise ValidationError(
            {"effective_from": _("A price comes into force now or later: the past is never re-priced.")}
        )


@transaction.atomic
def price_add(*, actor, price: Price) -> Price:
    not_in_the_past(price.effective_from)
    price.created_by = actor if actor is not None and actor.is_authenticated else None
    price.full_clean()
    price.save()
    audit_record(
        actor=actor,
        action="price.add",
        target=price,
        data={
            "gpu_model": price.gpu_model.slug,
            "share": price.share,
            "per_gpu_hour": str(price.per_gpu_hour),
            "effective_from": price.effective_from.isoformat(),
        },
    )
    return price


@transaction.atomic
def multiplier_add(*, actor, multiplier: TierMultiplier) -> TierMultiplier:
    not_in_the_past(multiplier.effective_from)
    multiplier.full_clean()
    multiplier.save()
    audit_record(
        actor=actor,
        action="tier_multiplier.add",
        target=multiplier,
        data={
            "tier": multiplier.tier,
            "multiplier": str(multiplier.multiplier),
            "effective_from": multiplier.effective_from.isoformat(),
        },
    )
    return multiplier


def in_force_or_past(row) -> bool:
    return row.effective_from <= timezone.now()


@transaction.atomic
def row_withdraw(*, actor, row: Price | TierMultiplier) -> None:
    """A price or multiplier not yet in force, taken back."""
    if in_force_or_past(row):
        raise ValidationError(_("A price in force or past is kept: add a new one instead."))
    audit_record(actor=actor, action=f"{row._meta.model_name}.withdraw", target=row, data={"id": row.pk})
    row.delete()
