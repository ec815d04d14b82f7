"""The cost of GPU-hours at the prices in force (billing/pricing.py, jobs/costs.py): a price change
mid-job splits the job at the change, parts add up to the job exactly, a tier's multiplier and a
share's own price apply, restarted jobs are charged per attempt less the work lost, and running
jobs cost so far. Money is exact Decimal until shown, rounded half to even (billing/money.py)."""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from billing import money
from billing.models import Price, TierMultiplier
from billing.pricing import Piece, PriceBook, month_cuts
from clusters.backends.base import JobState
from jobs.costs import cost, cost_of, costs_of, pieces_of, reserved_cost
from jobs.models import JobAttempt

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 11, 30, 10, tzinfo=UTC)


@pytest.fixture
def h100(catalog):
    return catalog[1]


def price(model, per_gpu_hour, since, share="whole"):
    return Price.objects.create(
        gpu_model=model, share=share, per_gpu_hour=Decimal(per_gpu_hour), effective_from=since
    )


def test_a_price_change_mid_job_splits_its_cost_at_the_change(owner, make_job, h100):
    price(h100, "10.0000", T0 - timedelta(days=300))
    price(h100, "12.5000", T0 + timedelta(hours=2))  # two hours into the job
    job = make_job(
        owner, state=JobState.COMPLETED, gpus=4, started_at=T0, finished_at=T0 + timedelta(hours=4),
        gpu_hours=Decimal("16.0000"), reserved_gpu_hours=Decimal("16"), gpu_model=h100,
    )  # fmt: skip
    charges = [(c.start, c.end, c.gpu_hours, c.unit) for c in pieces_charges(job)]
    assert charges == [
        (T0, T0 + timedelta(hours=2), Decimal("8.0000"), Decimal("10.0000")),
        (T0 + timedelta(hours=2), T0 + timedelta(hours=4), Decimal("8.0000"), Decimal("12.5000")),
    ]
    assert cost_of(job, PriceBook.load()) == Decimal("180.00")  # 8 × 10 + 8 × 12.5


def pieces_charges(job, **kwargs):
    book = PriceBook.load()
    return book.charges(
        pieces_of(job), gpu_model_id=job.gpu_model_id, share=job.share, tier=job.tier, **kwargs
    )


def test_the_parts_add_up_to_the_job_exactly_whatever_the_cuts(owner, make_job, h100):
    """Odd GPU-hours cut at odd moments: each part is rounded to 4 places, the last takes the rest."""
    price(h100, "7.3333", T0 - timedelta(days=300))
    for minutes in (7, 19, 41, 53):
        price(h100, f"7.{minutes:04d}", T0 + timedelta(minutes=minutes, seconds=13))
    job = make_job(
        owner, state=JobState.FAILED, gpus=3, started_at=T0, finished_at=T0 + timedelta(hours=1, seconds=1),
        gpu_hours=Decimal("3.0008"), gpu_model=h100,
    )  # fmt: skip
    charges = pieces_charges(job, cuts=[T0 + timedelta(minutes=30)])
    assert len(charges) == 6
    assert sum(c.gpu_hours for c in charges) == Decimal("3.0008")
    assert cost(charges) == sum(c.gpu_hours * c.unit for c in charges)
    assert all(c.gpu_hours.as_tuple().exponent >= -4 for c in charges)


def test_a_tier_multiplier_applies_from_its_date_and_a_job_keeps_its_tier(owner, make_job, h100, tenant):
    price(h100, "10", T0 - timedelta(days=300))
    TierMultiplier.objects.create(
        tier="high", multiplier=Decimal("1.5"), effective_from=T0 + timedelta(hours=1)
    )
    job = make_job(
        owner, state=JobState.COMPLETED, gpus=1, started_at=T0, finished_at=T0 + timedelta(hours=2),
        gpu_hours=Decimal("2"), gpu_model=h100, tier="high",
    )  # fmt: skip
    assert cost_of(job, PriceBook.load()) == Decimal("25")  # 1 h × 10 + 1 h × 15
    tenant.tier = "low"  # a later change of the tenant's tier does not re-price the job
    tenant.save()
    job.refresh_from_db()
    assert cost_of(job, PriceBook.load()) == Decimal("25")


def test_a_share_pays_its_own_price_or_its_models_whole_price(owner, make_job, h100):
    price(h100, "10", T0 - timedelta(days=300))
    price(h100, "14", T0 - timedelta(days=300), share="mig")
    whole_priced = make_job(
        owner, state=JobState.COMPLETED, gpus=2, share="slice", device_fraction=Decimal("0.25"), started_at=T0,
        finished_at=T0 + timedelta(hours=2), gpu_hours=Decimal("1"), gpu_model=h100,
    )  # fmt: skip
    own_priced = make_job(
        owner, state=JobState.COMPLETED, gpus=2, share="mig", device_fraction=Decimal("0.4286"), started_at=T0,
        finished_at=T0 + timedelta(hours=1), gpu_hours=Decimal("0.8572"), gpu_model=h100,
    )  # fmt: skip
    costs = costs_of([(job.pk, job) for job in (whole_priced, own_priced)])
    assert costs == {whole_priced.pk: Decimal("10"), own_priced.pk: Decimal("0.8572") * 14}


def test_a_model_without_a_price_costs_nothing(owner, make_job, h100):
    job = make_job(
        owner, state=JobState.COMPLETED, started_at=T0, finished_at=T0 + timedelta(hours=1),
        gpu_hours=Decimal(1), gpu_model=h100,
    )  # fmt: skip
    assert cost_of(job, PriceBook.load()) == 0


def test_a_restarted_job_is_charged_each_attempt_less_the_work_lost(owner, make_job, h100):
    price(h100, "10", T0 - timedelta(days=300))
    price(h100, "20", T0 + timedelta(hours=5))
    job = make_job(
        owner, state=JobState.COMPLETED, gpus=1, attempt=2, started_at=T0 + timedelta(hours=6),
        finished_at=T0 + timedelta(hours=7), gpu_hours=Decimal("2.5"), gpu_model=h100,
    )  # fmt: skip
    JobAttempt.objects.create(
        job=job, number=1, token="t1", started_at=T0, ended_at=T0 + timedelta(hours=2),
        end_state=JobState.PREEMPTED, gpu_hours=Decimal(2), gpu_hours_lost=Decimal("0.5"),
    )  # fmt: skip
    JobAttempt.objects.create(
        job=job, number=2, token="t2", started_at=T0 + timedelta(hours=6), ended_at=T0 + timedelta(hours=7),
        end_state=JobState.COMPLETED, gpu_hours=Decimal(1),
    )  # fmt: skip
    # attempt 1: 1.5 charged at 10 (0.5 lost, given back); attempt 2: the other 1.0 at 20
    assert [(p.start, p.gpu_hours) for p in pieces_of(job)] == [
        (T0, Decimal("1.5")),
        (T0 + timedelta(hours=6), 1),
    ]
    assert cost_of(job, PriceBook.load()) == Decimal(35)
    assert costs_of([(job.pk, job)]) == {job.pk: Decimal(35)}


def test_a_running_job_costs_so_far_and_holds_the_rest_in_reserve(owner, make_job, h100):
    now = timezone.now()
    price(h100, "10", now - timedelta(days=3))
    job = make_job(
        owner, state=JobState.RUNNING, gpus=2, started_at=now - timedelta(minutes=90),
        reserved_gpu_hours=Decimal("8.00"), gpu_model=h100,
    )  # fmt: skip
    book = PriceBook.load()
    assert cost_of(job, book, now=now) == Decimal("30.0000")  # 2 GPUs × 1.5 h × 10
    assert reserved_cost(job, book, now=now) == Decimal("50.0000")  # the 5 GPU-hours left
    assert cost_of(job, book, now=now + timedelta(days=1)) == Decimal("80.0000")  # never past its reserve


def test_money_is_rounded_only_when_shown_half_to_even():
    assert money.as_api(Decimal("0.125")) == "0.12"
    assert money.as_api(Decimal("0.135")) == "0.14"
    assert money.as_text(Decimal("1234.505"), "zh-hans") == "¥1,234.50"
    assert money.as_text(Decimal("1234.515"), "en") == "CN¥1,234.52"


def test_month_cuts_are_the_site_time_zones_midnights(settings):
    settings.TIME_ZONE = "Asia/Shanghai"
    with timezone.override("Asia/Shanghai"):
        cuts = month_cuts(datetime(2026, 10, 31, 15, tzinfo=UTC), datetime(2026, 12, 2, tzinfo=UTC))
    assert cuts == [datetime(2026, 10, 31, 16, tzinfo=UTC), datetime(2026, 11, 30, 16, tzinfo=UTC)]


def test_a_piece_with_no_rate_ends_where_it_starts():
    assert Piece(T0, Decimal(0), Decimal(1)).end == T0


def test_a_job_being_cancelled_costs_so_far_until_its_end_is_confirmed(owner, make_job, h100):
    """CANCELLING may last while its cluster is unreachable: its GPUs are still in use."""
    now = timezone.now()
    price(h100, "10", now - timedelta(days=3))
    job = make_job(
        owner, state=JobState.CANCELLING, gpus=1, started_at=now - timedelta(hours=2),
        reserved_gpu_hours=Decimal("8.00"), gpu_model=h100,
    )  # fmt: skip
    never_started = make_job(owner, state=JobState.CANCELLING, gpu_model=h100)
    book = PriceBook.load()
    assert cost_of(job, book, now=now) == Decimal("20.0000")
    assert reserved_cost(job, book, now=now) == Decimal("60.0000")
    assert cost_of(never_started, book, now=now) == 0
