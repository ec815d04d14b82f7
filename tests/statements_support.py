"""The month the statement tests read: March 2025 at the site's time, a price change on the 15th,
and jobs across it and across the month's end (tests/reports/, tests/pages/).

Prices of the catalog's H100: 10.0000 a device-GPU-hour from January, 12.5000 from 15 March.

| job | user | ran | GPU-hours in March | cost |
| --- | --- | --- | --- | --- |
| `across-change` | alice | 14 Mar 12:00 to 15 Mar 12:00, 2 GPUs | 24 at 10 + 24 at 12.5 | 540 |
| `across-end` | bob | 31 Mar 20:00 to 1 Apr 04:00, 1 GPU | 4 at 12.5 (4 more in April) | 50 |
| `running` | bob | since 31 Mar 22:00, 1 GPU, still running | 2 at 12.5 | 25 |
| `tiny` | alice | 20 Mar 10:00, 0.01 GPU-hours | 0.01 at 12.5 | 0.125 |
| `february` | alice | in February | none | — |

The month's exact total is 615.125: shown as 615.12, half to even."""

from dataclasses import dataclass
from datetime import date, datetime, timedelta
from decimal import Decimal

from django.utils import timezone

from billing.models import Price
from jobs.models import JobState
from tests.factories import UserFactory

MARCH = date(2025, 3, 1)
TOTAL = Decimal("615.125")


def at(day: int, hour: int, month: int = 3) -> datetime:
    return timezone.make_aware(datetime(2025, month, day, hour))


@dataclass
class March:
    jobs: dict
    alice: object
    bob: object


def make_march(tenant, gpu_model, make_job) -> March:
    """The jobs and prices above; `make_job` is the suite's fixture (tests/conftest.py)."""
    Price.objects.create(gpu_model=gpu_model, per_gpu_hour=Decimal("10.0000"), effective_from=at(1, 0, 1))
    Price.objects.create(gpu_model=gpu_model, per_gpu_hour=Decimal("12.5000"), effective_from=at(15, 0))
    alice = UserFactory(username="alice", email="alice@example.org")
    bob = UserFactory(username="bob", email="bob@example.org")
    ended = JobState.COMPLETED
    jobs = {
        "across-change": make_job(
            alice, name="across-change", gpus=2, state=ended, started_at=at(14, 12),
            finished_at=at(15, 12), gpu_hours=Decimal("48"),
        ),
        "across-end": make_job(
            bob, name="across-end", state=ended, started_at=at(31, 20), finished_at=at(1, 4, month=4),
            gpu_hours=Decimal("8"),
        ),
        "running": make_job(
            bob, name="running", state=JobState.RUNNING, started_at=at(31, 22), reserved_gpu_hours=Decimal("100"),
        ),
        "tiny": make_job(
            alice, name="tiny", state=ended, started_at=at(20, 10),
            finished_at=at(20, 10) + timedelta(seconds=36), gpu_hours=Decimal("0.0100"),
        ),
        "february": make_job(
            alice, name="february", state=ended, started_at=at(10, 8, month=2), finished_at=at(10, 10, month=2),
            gpu_hours=Decimal("2"),
        ),
    }  # fmt: skip
    return March(jobs=jobs, alice=alice, bob=bob)
