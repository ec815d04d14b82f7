"""The cost of GPU-hours at the prices in force while they were used.

A job is charged in pieces: each run (attempt) used `rate` device-GPUs from its start for as many
GPU-hours as it was charged. A piece is cut wherever a price, a tier multiplier or a period the
caller names (a month, a day) changes, and each cut part costs its GPU-hours × the unit price ×
the multiplier in force at its start. GPU-hours of the parts are rounded to 4 decimals (the
ledger's resolution), half to even, and the last part takes what is left, so the parts add up to
the piece exactly. Costs are exact Decimals; nothing is rounded until it is shown
(billing/money.py)."""

from __future__ import annotations

import bisect
import itertools
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from decimal import ROUND_HALF_EVEN, Decimal

from django.db.models import IntegerField, Value
from django.utils import timezone

from billing.models import Price, TierMultiplier
from clusters.shares import ShareKind

HOURS = Decimal("0.0001")
ONE = Decimal(1)
ZERO = Decimal(0)


@dataclass(frozen=True)
class Piece:
    """GPU-hours a run was charged, used at `rate` device-GPUs from `start`."""

    start: datetime
    rate: Decimal
    gpu_hours: Decimal

    @property
    def end(self) -> datetime:
        if self.rate <= 0:
            return self.start
        return self.start + timedelta(seconds=float(self.gpu_hours / self.rate * 3600))


@dataclass(frozen=True)
class Charge:
    """A part of a piece under one price: [start, end), its GPU-hours and what each costs."""

    start: datetime
    end: datetime
    gpu_hours: Decimal
    unit: Decimal  # the price per device-GPU-hour in force at `start`
    multiplier: Decimal  # the tier's multiplier in force at `start`

    @property
    def cost(self) -> Decimal:
        return self.gpu_hours * self.unit * self.multiplier


class _Timeline:
    """Values that each hold from a moment on."""

    def __init__(self, rows: Iterable[tuple[datetime, Decimal]]):
        ordered = sorted(rows)
        self.moments = [moment for moment, _ in ordered]
        self.values = [value for _, value in ordered]

    def at(self, moment: datetime) -> Decimal | None:
        i = bisect.bisect_right(self.moments, moment)
        return self.values[i - 1] if i else None

    def changes_within(self, start: datetime, end: datetime) -> list[datetime]:
        return [m for m in self.moments if start < m < end]


EMPTY = _Timeline([])


class PriceBook:
    """The whole price list and the tier multipliers, read once (two queries) and asked many
    times. A share kind without a price of its own pays its model's whole-device price per
    device-GPU-hour; a model without any price costs nothing (the price list page says so)."""

    def __init__(self, prices: Iterable[tuple], multipliers: Iterable[tuple]):
        """prices: (gpu_model_id, share, effective_from, per_gpu_hour); multipliers: (tier,
        effective_from, multiplier)."""
        by_key: dict[tuple[int, str], list] = defaultdict(list)
        for gpu_model_id, share, since, value in prices:
            by_key[(gpu_model_id, share)].append((since, value))
        self.prices = {key: _Timeline(rows) for key, rows in by_key.items()}
        by_tier: dict[str, list] = defaultdict(list)
        for tier, since, value in multipliers:
            by_tier[tier].append((since, value))
        self.multipliers = {tier: _Timeline(rows) for tier, rows in by_tier.items()}

    @classmethod
    def load(cls) -> PriceBook:
        """The price list and the multipliers in one query (a UNION of the two small tables)."""
        prices = Price.objects.order_by().values_list(
            "gpu_model_id", "share", "effective_from", "per_gpu_hour"
        )
        multipliers = TierMultiplier.objects.order_by().annotate(
            gpu_model_id=Value(0, output_field=IntegerField())
        )
        rows = prices.union(
            multipliers.values_list("gpu_model_id", "tier", "effective_from", "multiplier"), all=True
        )
        found_prices, found_multipliers = [], []
        for gpu_model_id, key, since, value in rows:
            if gpu_model_id:
                found_prices.append((gpu_model_id, key, since, Decimal(value)))
            else:
                found_multipliers.append((key, since, Decimal(value)))
        return cls(found_prices, found_multipliers)

    def _price_line(self, gpu_model_id: int, share: str) -> _Timeline:
        line = self.prices.get((gpu_model_id, share))
        if line is None or not line.moments:
            line = self.prices.get((gpu_model_id, ShareKind.WHOLE), EMPTY)
        return line

    def unit_at(self, gpu_model_id: int, share: str, moment: datetime) -> Decimal:
        line = self._price_line(gpu_model_id, share)
        unit = line.at(moment)
        if unit is None and share != ShareKind.WHOLE:
            unit = self.prices.get((gpu_model_id, ShareKind.WHOLE), EMPTY).at(moment)
        return unit if unit is not None else ZERO

    def multiplier_at(self, tier: str, moment: datetime) -> Decimal:
        value = self.multipliers.get(tier, EMPTY).at(moment)
        return value if value is not None else ONE

    def rate_at(self, *, gpu_model_id: int, share: str, tier: str, moment: datetime) -> Decimal:
        """What one device-GPU-hour costs at `moment`: the unit price × the tier's multiplier."""
        return self.unit_at(gpu_model_id, share, moment) * self.multiplier_at(tier, moment)

    def charges(
        self,
        pieces: Iterable[Piece],
        *,
        gpu_model_id: int,
        share: str,
        tier: str,
        cuts: Iterable[datetime] = (),
    ) -> list[Charge]:
        """The pieces cut at every change of price or multiplier and at `cuts`."""
        cuts = sorted(set(cuts))
        found = []
        for piece in pieces:
            if piece.gpu_hours <= 0:
                continue
            start, end = piece.start, piece.end
            moments = {
                *self._price_line(gpu_model_id, share).changes_within(start, end),
                *self.prices.get((gpu_model_id, ShareKind.WHOLE), EMPTY).changes_within(start, end),
                *self.multipliers.get(tier, EMPTY).changes_within(start, end),
                *(m for m in cuts if start < m < end),
            }
            bounds = [start, *sorted(moments), end]
            left = piece.gpu_hours
            for a, b in itertools.pairwise(bounds):
                last = b == end
                if last:
                    hours = left
                else:
                    seconds = Decimal((b - a).total_seconds()).quantize(Decimal("0.000001"))
                    hours = min(left, (piece.rate * seconds / 3600).quantize(HOURS, ROUND_HALF_EVEN))
                left -= hours
                found.append(
                    Charge(a, b, hours, self.unit_at(gpu_model_id, share, a), self.multiplier_at(tier, a))
                )
        return found


def month_start(day: date) -> date:
    return day.replace(day=1)


def next_month(day: date) -> date:
    return (day.replace(day=28) + timedelta(days=4)).replace(day=1)


def midnight(day: date) -> datetime:
    """The start of a day in the site's time zone (TIME_ZONE), as an aware moment."""
    return timezone.make_aware(datetime.combine(day, datetime.min.time()))


def month_cuts(start: datetime, end: datetime) -> list[datetime]:
    """The starts of the months between two moments, in the site's time zone."""
    cuts, day = [], next_month(timezone.localdate(start))
    while midnight(day) < end:
        cuts.append(midnight(day))
        day = next_month(day)
    return cuts
