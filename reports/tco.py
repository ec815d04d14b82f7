"""What owning GPUs costs per delivered GPU-hour, beside what a cloud asks: pure Decimal arithmetic,
no database, no rounding (billing/money.py rounds, half to even, where a figure is shown).

    yearly cost   = nodes × node price ÷ years of depreciation                     (the purchase)
                  + GPUs × W per GPU × 8760 h ÷ 1000 × price per kWh × PUE          (power)
                  + staff per year + space per year
    available     = GPUs × 8760 GPU-hours a year
    cost per delivered GPU-hour at utilization u = yearly cost ÷ (available × u)   (none at u = 0)
    break-even utilization against a cloud price p = yearly cost ÷ (available × p)
                  (above 1: the cluster never beats that price, even fully used)
    the cloud's yearly cost for the same hours = available × u × p;
    saving = (cloud's − ours) ÷ cloud's × 100 %

A year is 365 days (8760 hours) every year: the utilization is measured over the last 365 days,
and a leap year's extra day would move the figures by 0.27 % and nothing else. Every cost here is
fixed: power is counted at the entered average draw for every hour, busy or idle, which errs on
the side of the cluster costing more.

The example profile (`EXAMPLE`) is built from public figures, in US dollars, as of 2024–2025
(illustrative: prices move, and each site should enter its own):
- NVIDIA H100 SXM: 700 W board power (NVIDIA H100 Tensor Core GPU datasheet); a DGX H100 draws
  at most 10.2 kW for its 8 GPUs (NVIDIA DGX H100 user guide), about 1.275 kW per GPU with its
  share of the node. The example takes 1,000 W per GPU on average.
- An 8-GPU H100 server: USD 250,000–350,000 as published in 2023–2025 analyses (The Next Platform,
  "H100 GPU Instance Pricing On AWS", 2023; vendor quotes); the example takes USD 300,000,
  written off over 4 years.
- Electricity: USD 0.08 per kWh, about the US industrial average (U.S. EIA, Electric Power
  Monthly, 2024).
- PUE 1.3: what new, large facilities reach (Uptime Institute Global Data Center Survey 2024;
  the industry's average has stayed at 1.55–1.59 since 2020, 1.58 in 2023).
- Staff USD 150,000 a year (one administrator's share), space USD 60,000 a year (colocation of
  about 41 kW at roughly USD 120 per kW-month, power excluded).
- Cloud, on demand, per H100 GPU-hour: AWS p5.48xlarge at USD 98.32 an hour for 8 GPUs before
  AWS's June 2025 cut of up to 45 % (USD 55.04 after it, USD 6.88 per GPU); AWS EC2 Capacity
  Blocks at USD 4.916 per accelerator-hour (us-east-1, AWS pricing page, 2025); Lambda's H100 SXM
  at USD 2.99 (Lambda's price list, 2025).
Published deployments report a yearly TCO about 45 % below the cloud's (`PUBLISHED_SAVING_PCT`).
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_HALF_EVEN, Decimal

ZERO = Decimal(0)
ONE = Decimal(1)
HOURS_PER_YEAR = 8760  # 365 × 24; see the module's docstring for leap years
PUBLISHED_SAVING_PCT = Decimal(45)


@dataclass(frozen=True)
class Costs:
    """What the cluster costs, as entered (any currency: the site's)."""

    nodes: int
    gpus_per_node: int
    node_price: Decimal
    depreciation_years: int
    power_w_per_gpu: int
    electricity_per_kwh: Decimal
    pue: Decimal
    staff_per_year: Decimal
    space_per_year: Decimal

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


@dataclass(frozen=True)
class Yearly:
    """A year's cost, by part."""

    depreciation: Decimal
    power: Decimal
    staff: Decimal
    space: Decimal

    @property
    def total(self) -> Decimal:
        return self.depreciation + self.power + self.staff + self.space


@dataclass(frozen=True)
class CloudComparison:
    """One cloud price beside the cluster: where it breaks even, and what the cloud would cost
    for the hours the cluster delivers."""

    provider: str
    per_gpu_hour: Decimal
    break_even: Decimal | None  # utilization; None for a price of 0 (the cluster never wins)
    never_breaks_even: bool
    cloud_yearly: Decimal
    saving_pct: Decimal | None  # None when no hours are delivered (nothing to compare)


@dataclass(frozen=True)
class Tco:
    """The cluster's figures at one utilization."""

    yearly: Yearly
    gpu_hours_available: Decimal
    utilization: Decimal
    gpu_hours_delivered: Decimal
    cost_per_gpu_hour: Decimal | None  # None at utilization 0: nothing delivered to divide by
    clouds: list[CloudComparison]


def yearly_cost(costs: Costs) -> Yearly:
    kwh = Decimal(costs.gpus * costs.power_w_per_gpu * HOURS_PER_YEAR) / 1000
    return Yearly(
        depreciation=costs.nodes * costs.node_price / costs.depreciation_years,
        power=kwh * costs.electricity_per_kwh * costs.pue,
        staff=costs.staff_per_year,
        space=costs.space_per_year,
    )


def gpu_hours_available(costs: Costs) -> Decimal:
    return Decimal(costs.gpus * HOURS_PER_YEAR)


def utilization_of(delivered: Decimal, available: Decimal) -> Decimal:
    """Delivered over available GPU-hours, at most 1 (a job's hours charged past the year's
    capacity, e.g. when nodes were added during the year, do not make it more than full)."""
    if available <= 0:
        return ZERO
    return min(ONE, max(ZERO, delivered / available))


def cost_per_gpu_hour(yearly: Decimal, available: Decimal, utilization: Decimal) -> Decimal | None:
    """What one delivered GPU-hour costs; None at utilization 0 (no hour is delivered)."""
    delivered = available * utilization
    return None if delivered <= 0 else yearly / delivered


def break_even(yearly: Decimal, available: Decimal, per_gpu_hour: Decimal) -> Decimal | None:
    """The utilization at which a delivered GPU-hour costs what the cloud asks; None for a free
    cloud (no utilization beats it). Above 1 the cluster never breaks even."""
    if per_gpu_hour <= 0 or available <= 0:
        return None
    return yearly / (available * per_gpu_hour)


def saving_pct(ours: Decimal, cloud: Decimal) -> Decimal | None:
    """How much less the cluster costs than the cloud for the same hours, in % of the cloud's
    (negative: the cluster costs more); None when the cloud's would be 0."""
    if cloud <= 0:
        return None
    return (cloud - ours) / cloud * 100


def tco(costs: Costs, *, utilization: Decimal, clouds: list[tuple[str, Decimal]]) -> Tco:
    """Every figure of the cluster at this utilization (0–1), beside each (provider, price)."""
    yearly = yearly_cost(costs)
    total = yearly.total
    available = gpu_hours_available(costs)
    delivered = available * utilization
    comparisons = []
    for provider, price in clouds:
        point = break_even(total, available, price)
        cloud_yearly = delivered * price
        comparisons.append(
            CloudComparison(
                provider=provider,
                per_gpu_hour=price,
                break_even=point,
                never_breaks_even=point is None or point > ONE,
                cloud_yearly=cloud_yearly,
                saving_pct=saving_pct(total, cloud_yearly) if delivered > 0 else None,
            )
        )
    return Tco(
        yearly=yearly,
        gpu_hours_available=available,
        utilization=utilization,
        gpu_hours_delivered=delivered,
        cost_per_gpu_hour=cost_per_gpu_hour(total, available, utilization),
        clouds=comparisons,
    )


CURVE_POINTS = [Decimal(pct) / 100 for pct in range(10, 101, 10)]


def curve(costs: Costs) -> list[tuple[Decimal, Decimal]]:
    """Cost per delivered GPU-hour at 10 %, 20 %, … 100 % utilization (the page's chart)."""
    total, available = yearly_cost(costs).total, gpu_hours_available(costs)
    return [(u, total / (available * u)) for u in CURVE_POINTS]


# The published figures of the module's docstring, in US dollars.
EXAMPLE_CURRENCY = "USD"
EXAMPLE = {
    "name": "Example: 4 × 8 H100 SXM (published figures)",
    "nodes": 4,
    "gpus_per_node": 8,
    "node_price": Decimal("300000.00"),
    "depreciation_years": 4,
    "power_w_per_gpu": 1000,
    "electricity_per_kwh": Decimal("0.0800"),
    "pue": Decimal("1.30"),
    "staff_per_year": Decimal("150000.00"),
    "space_per_year": Decimal("60000.00"),
}
EXAMPLE_MONEY = ("node_price", "electricity_per_kwh", "staff_per_year", "space_per_year")
EXAMPLE_CLOUDS = [
    ("AWS p5.48xlarge on demand", Decimal("6.8800")),
    ("AWS EC2 Capacity Blocks", Decimal("4.9160")),
    ("Lambda H100 SXM on demand", Decimal("2.9900")),
]


def example_in(rate: Decimal) -> tuple[dict, list[tuple[str, Decimal]]]:
    """The example's figures in the site's currency: its US-dollar amounts times `rate` (units of
    the site's currency per US dollar; 1 for USD), kept to the places the profile stores (2, and
    4 for prices per kWh and per GPU-hour), half to even."""
    figures = dict(EXAMPLE)
    for name in EXAMPLE_MONEY:
        places = Decimal("0.0001") if name == "electricity_per_kwh" else Decimal("0.01")
        figures[name] = (EXAMPLE[name] * rate).quantize(places, rounding=ROUND_HALF_EVEN)
    clouds = [
        (provider, (price * rate).quantize(Decimal("0.0001"), rounding=ROUND_HALF_EVEN))
        for provider, price in EXAMPLE_CLOUDS
    ]
    return figures, clouds
