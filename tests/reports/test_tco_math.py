"""The TCO arithmetic (reports/tco.py) on figures worked out by hand: exact Decimals, rounded only
where the API and the pages show them."""

from decimal import Decimal

from reports import tco

# 2 nodes of 4 GPUs at 100,000 over 4 years; 500 W per GPU at 0.10 per kWh, PUE 1.5;
# staff 20,000 and space 5,000 a year.
COSTS = tco.Costs(
    nodes=2, gpus_per_node=4, node_price=Decimal("100000.00"), depreciation_years=4, power_w_per_gpu=500,
    electricity_per_kwh=Decimal("0.1000"), pue=Decimal("1.50"), staff_per_year=Decimal("20000.00"),
    space_per_year=Decimal("5000.00"),
)  # fmt: skip


def test_the_yearly_cost_is_the_purchase_written_off_power_at_the_pue_staff_and_space():
    yearly = tco.yearly_cost(COSTS)
    assert yearly.depreciation == Decimal(50000)  # 2 × 100,000 / 4
    assert yearly.power == Decimal("5256")  # 8 × 500 W × 8760 h / 1000 = 35,040 kWh × 0.10 × 1.5
    assert (yearly.staff, yearly.space) == (Decimal(20000), Decimal(5000))
    assert yearly.total == Decimal(80256)
    assert tco.gpu_hours_available(COSTS) == Decimal(70080)  # 8 GPUs × 8760 h, leap years too


def test_the_cost_per_delivered_gpu_hour_at_half_the_hours():
    figures = tco.tco(COSTS, utilization=Decimal("0.5"), clouds=[])
    assert figures.gpu_hours_delivered == Decimal(35040)
    # 80,256 / 35,040 = 2.290410958904…, kept exact until shown
    assert figures.cost_per_gpu_hour == Decimal(80256) / Decimal(35040)
    assert figures.cost_per_gpu_hour.quantize(Decimal("0.000001")) == Decimal("2.290411")


def test_break_even_and_saving_against_two_cloud_prices():
    figures = tco.tco(COSTS, utilization=Decimal("0.5"), clouds=[("dear", Decimal(4)), ("cheap", Decimal(2))])
    dear, cheap = figures.clouds
    # break-even: 80,256 / (70,080 × price)
    assert dear.break_even.quantize(Decimal("0.0001")) == Decimal("0.2863")
    assert cheap.break_even.quantize(Decimal("0.0001")) == Decimal("0.5726")
    assert not dear.never_breaks_even and not cheap.never_breaks_even
    # the clouds' cost for 35,040 GPU-hours, and how much less the cluster costs
    assert (dear.cloud_yearly, cheap.cloud_yearly) == (Decimal(140160), Decimal(70080))
    assert dear.saving_pct.quantize(Decimal("0.01")) == Decimal("42.74")
    assert cheap.saving_pct.quantize(Decimal("0.01")) == Decimal("-14.52")  # the cluster costs more


def test_a_cloud_price_below_the_full_cluster_cost_never_breaks_even():
    (cloud,) = tco.tco(COSTS, utilization=Decimal(1), clouds=[("low", Decimal(1))]).clouds
    assert cloud.break_even.quantize(Decimal("0.0001")) == Decimal("1.1452")  # 80,256 / 70,080 > 1
    assert cloud.never_breaks_even
    (free,) = tco.tco(COSTS, utilization=Decimal(1), clouds=[("free", Decimal(0))]).clouds
    assert free.break_even is None and free.never_breaks_even and free.saving_pct is None


def test_at_zero_utilization_there_is_no_cost_per_hour_and_no_saving():
    figures = tco.tco(COSTS, utilization=Decimal(0), clouds=[("any", Decimal(3))])
    assert figures.cost_per_gpu_hour is None
    assert figures.gpu_hours_delivered == 0
    (cloud,) = figures.clouds
    assert cloud.saving_pct is None and cloud.cloud_yearly == 0
    assert cloud.break_even.quantize(Decimal("0.0001")) == Decimal("0.3817")  # 80,256 / 210,240


def test_utilization_is_capped_at_one_and_never_negative():
    assert tco.utilization_of(Decimal(80000), Decimal(70080)) == 1
    assert tco.utilization_of(Decimal(7008), Decimal(70080)) == Decimal("0.1")
    assert tco.utilization_of(Decimal(5), Decimal(0)) == 0


def test_the_curve_runs_from_ten_to_a_hundred_percent():
    points = tco.curve(COSTS)
    assert [u for u, _cost in points] == [Decimal(n) / 10 for n in range(1, 11)]
    assert points[-1][1] == Decimal(80256) / Decimal(70080)
    assert points[0][1] == Decimal(80256) / Decimal(7008)


def test_the_example_of_published_figures_and_its_break_even_points():
    figures, clouds = tco.example_in(Decimal(1))
    costs = tco.Costs(**{name: figures[name] for name in tco.Costs.__dataclass_fields__})
    # 4 × 300,000 / 4 + 32 × 1000 W × 8760 h / 1000 × 0.08 × 1.3 + 150,000 + 60,000
    assert tco.yearly_cost(costs).total == Decimal("539153.28")
    result = tco.tco(costs, utilization=Decimal("0.6"), clouds=clouds)
    points = {c.provider: c.break_even.quantize(Decimal("0.0001")) for c in result.clouds}
    assert points == {
        "AWS p5.48xlarge on demand": Decimal("0.2796"),
        "AWS EC2 Capacity Blocks": Decimal("0.3912"),
        "Lambda H100 SXM on demand": Decimal("0.6433"),
    }
    # at 60 % the cluster costs less than AWS on demand, more than Lambda
    saving = {c.provider: c.saving_pct.quantize(Decimal("0.1")) for c in result.clouds}
    assert saving["AWS p5.48xlarge on demand"] == Decimal("53.4")
    assert saving["Lambda H100 SXM on demand"] < 0


def test_the_example_in_another_currency_is_converted_and_kept_to_the_stored_places():
    figures, clouds = tco.example_in(Decimal("7.1234"))
    assert figures["node_price"] == Decimal("2137020.00")
    assert figures["electricity_per_kwh"] == Decimal("0.5699")  # 0.569872, half to even at 4 places
    assert dict(clouds)["Lambda H100 SXM on demand"] == Decimal("21.2990")  # 21.298966
