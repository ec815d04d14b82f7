"""The grant ledger: reserve, take GPUs, settle; the race of fifty reservations; reminders."""

import threading
from datetime import timedelta
from decimal import Decimal

import pytest
from django.core import mail
from django.db import IntegrityError, connection, connections
from django.utils import timezone

from tenants.errors import QuotaExhausted, TenantSuspended
from tenants.models import QuotaGrant, TenantState
from tenants.services import grant_reserve, grant_settle, grant_take_gpus, grants_remind_ending

pytestmark = pytest.mark.grant(gpus=8)

TODAY = timezone.localdate()


@pytest.mark.django_db
def test_reserve_take_and_settle(grant):
    grant_reserve(grant_id=grant.pk, gpu_hours=Decimal(40))
    assert grant_take_gpus(grant_id=grant.pk, gpus=6)
    assert not grant_take_gpus(grant_id=grant.pk, gpus=4)  # 6 + 4 > 8: the job waits
    grant_settle(grant_id=grant.pk, reserved_gpu_hours=Decimal(40), used_gpu_hours=Decimal("12.5"), gpus=6)
    grant.refresh_from_db()
    assert (grant.gpus_in_use, grant.gpu_hours_reserved, grant.gpu_hours_used) == (0, 0, Decimal("12.5"))
    assert grant.gpu_hours_remaining == Decimal("87.5")


@pytest.mark.django_db
def test_a_job_is_never_charged_more_than_it_reserved(grant):
    grant_reserve(grant_id=grant.pk, gpu_hours=Decimal(10))
    grant_settle(grant_id=grant.pk, reserved_gpu_hours=Decimal(10), used_gpu_hours=Decimal(11), gpus=0)
    grant.refresh_from_db()
    assert grant.gpu_hours_used == 10


@pytest.mark.django_db
def test_exhausted_grant_answers_with_the_figures(grant):
    grant_reserve(grant_id=grant.pk, gpu_hours=Decimal(90))
    with pytest.raises(QuotaExhausted) as exc:
        grant_reserve(grant_id=grant.pk, gpu_hours=Decimal(11))
    assert exc.value.extra["gpu_hours_remaining"] == "10.0000"
    assert exc.value.extra["gpu_hours_requested"] == "11"


@pytest.mark.django_db
def test_grant_outside_its_window_or_of_a_suspended_tenant_reserves_nothing(grant, tenant):
    QuotaGrant.objects.filter(pk=grant.pk).update(starts_on=TODAY + timedelta(days=1))
    with pytest.raises(QuotaExhausted, match="runs from"):
        grant_reserve(grant_id=grant.pk, gpu_hours=Decimal(1))
    tenant.state = TenantState.SUSPENDED
    tenant.save()
    with pytest.raises(TenantSuspended):
        grant_reserve(grant_id=grant.pk, gpu_hours=Decimal(1))


@pytest.mark.django_db
def test_the_database_refuses_an_overshoot_even_without_the_service(grant):
    with pytest.raises(IntegrityError):
        QuotaGrant.objects.filter(pk=grant.pk).update(gpu_hours_reserved=Decimal(101))


@pytest.mark.django_db(transaction=True)
def test_fifty_parallel_reservations_never_overshoot(grant):
    assert connection.vendor == "postgresql", "the race is a PostgreSQL test (row locks)"
    outcomes: list[str] = []
    barrier = threading.Barrier(50)

    def reserve() -> None:
        try:
            barrier.wait(timeout=30)
            grant_reserve(grant_id=grant.pk, gpu_hours=Decimal(3))
            outcomes.append("ok")
        except QuotaExhausted:
            outcomes.append("exhausted")
        finally:
            connections.close_all()

    threads = [threading.Thread(target=reserve) for _ in range(50)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    grant.refresh_from_db()
    assert len(outcomes) == 50
    assert outcomes.count("ok") == 33  # 33 × 3 = 99 of 100 GPU-hours
    assert grant.gpu_hours_reserved == Decimal(99)


@pytest.mark.django_db
def test_reminders_go_out_seven_days_and_one_day_before_the_end_once_each(
    grant, owner, manager, member, django_capture_on_commit_callbacks
):
    def run(day) -> int:
        with django_capture_on_commit_callbacks(execute=True):
            return grants_remind_ending(today=day)

    end = grant.ends_on
    assert run(end - timedelta(days=8)) == 0
    assert run(end - timedelta(days=7)) == 1
    assert run(end - timedelta(days=6)) == 0
    assert run(end - timedelta(days=1)) == 1
    assert run(end) == 0
    assert [m.subject.rsplit(" ", 2)[-2] for m in mail.outbox] == ["7", "1"]
    assert sorted(mail.outbox[0].to) == sorted([owner.email, manager.email])
