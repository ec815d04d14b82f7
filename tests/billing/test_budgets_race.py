"""A hard budget hit by two submissions at once, on real PostgreSQL: each job fits alone, both do
not, and they reserve on two different grants (so that no grant's lock orders them): the budget's
row lock lets exactly one through, and the other answers budget_exhausted."""

import threading
from decimal import Decimal

import pytest
from django.db import connections

from billing.models import Budget
from jobs.budgets import BudgetExhausted
from jobs.models import Job
from jobs.services import job_submit
from tests.budgets_support import job_request, priced
from tests.factories import QuotaGrantFactory, catalog_pair


@pytest.mark.django_db(transaction=True)
def test_two_racing_submissions_pass_a_hard_budget_at_most_once(tenant, member, catalog, local_partition):
    priced(catalog[1])
    training, inference = catalog, catalog_pair("budget-race", catalog[1].slug)
    for pair in (training, inference):
        QuotaGrantFactory(tenant=tenant, pair=pair, gpus=4, gpu_hours=100)
    Budget.objects.create(tenant=tenant, period="month", amount=Decimal(30), hard=True)  # each job: 20.00
    # local_partition allows an hour at most: 2 GPUs for 60 minutes, 2 GPU-hours each.
    requests = [job_request(tenant, *pair, local_partition) for pair in (training, inference)]
    start, outcomes = threading.Barrier(2), []

    def submit(request) -> None:
        try:
            start.wait(10)
            job_submit(user=member, request=request)
            outcomes.append("submitted")
        except BudgetExhausted as exc:
            outcomes.append(exc.code)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=submit, args=(request,)) for request in requests]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(outcomes) == ["budget_exhausted", "submitted"]
    assert Job.objects.filter(tenant=tenant).count() == 1
