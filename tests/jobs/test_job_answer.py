"""JobOut builds a job's answer straight from the row (jobs/serializers.py); it must answer what
DRF's walk over the declared fields answers, which the schema describes, for a job in any state,
with or without its submitter, dates, exit code and GPU-hours."""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone
from rest_framework import serializers

from jobs.models import Job, JobState
from jobs.selectors import job_answer_rows_visible_to, job_answers_visible_to
from jobs.serializers import JobDetailOut, JobOut, answer_plan

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 3, 29, 0, 59, 59, 123456, tzinfo=UTC)  # the hour Europe's clocks change


def drf_walk(serializer_class, job: Job) -> dict:
    return serializers.ModelSerializer.to_representation(serializer_class(job), job)


@pytest.fixture
def jobs(owner, make_job):
    made = [make_job(owner, state=state) for state in JobState.values]
    finished = made[JobState.values.index(JobState.COMPLETED)]
    finished.started_at, finished.finished_at, finished.exit_code = T0, T0 + timedelta(hours=1), 0
    finished.gpu_hours, finished.reserved_gpu_hours = Decimal("1.00005"), Decimal("0.12551")
    finished.backend_id, finished.raw_state, finished.node_list = "4242", "COMPLETED", "gpu[01-02]"
    finished.env, finished.parameters, finished.template = {"A": "1"}, {"steps": 10}, "pytorch"
    finished.save()
    failed = made[JobState.values.index(JobState.FAILED)]
    failed.exit_code, failed.submitted_by, failed.gpu_hours = -9, None, Decimal(0)
    failed.save()
    return made


@pytest.mark.parametrize("tz", ["UTC", "Europe/Berlin", "Asia/Kolkata"])
@pytest.mark.parametrize("serializer_class", [JobOut, JobDetailOut])
def test_the_answer_is_drfs_answer_for_every_state(owner, jobs, serializer_class, tz):
    with timezone.override(tz):
        for job in job_answers_visible_to(user=owner, detail=True).filter(pk__in=[job.pk for job in jobs]):
            built = serializer_class(job).data
            assert built == drf_walk(serializer_class, job), job.state
            assert list(built) == serializer_class.Meta.fields


def test_a_page_answers_as_each_job_alone(owner, jobs):
    page = list(job_answers_visible_to(user=owner).order_by("id"))
    assert JobOut(page, many=True).data == [drf_walk(JobOut, job) for job in page]
    finished = next(row for row in JobOut(page, many=True).data if row["state"] == JobState.COMPLETED)
    assert finished["gpu_hours"] == Decimal("1.0001") and finished["gpu_hours_reserved"] == Decimal("0.13")
    assert finished["started_at"] == "2026-03-29T00:59:59.123456Z"
    failed = next(row for row in JobOut(page, many=True).data if row["state"] == JobState.FAILED)
    assert (failed["submitted_by"], failed["exit_code"], failed["finished_at"]) == (None, -9, None)


@pytest.mark.parametrize("tz", ["UTC", "Asia/Kolkata"])
def test_the_lists_rows_answer_as_the_jobs_do(owner, jobs, tz):
    """The API's list reads rows (dicts of a values() query), not jobs."""
    with timezone.override(tz):
        rows = list(job_answer_rows_visible_to(user=owner).order_by("id"))
        assert all(isinstance(row, dict) for row in rows)
        page = list(job_answers_visible_to(user=owner).order_by("id"))
        answers = JobOut(rows, many=True).data
        assert answers == [drf_walk(JobOut, job) for job in page]
        assert all(list(answer) == JobOut.Meta.fields for answer in answers)
        assert JobOut(rows[0]).data == drf_walk(JobOut, page[0])


def test_a_page_of_detailed_jobs_keeps_their_detail(owner, jobs):
    page = list(job_answers_visible_to(user=owner, detail=True).order_by("id"))
    assert JobDetailOut(page, many=True).data == [drf_walk(JobDetailOut, job) for job in page]


def test_values_not_yet_stored_are_rounded_as_drf_rounds_them(owner, make_job):
    job = make_job(owner)  # a job as a service holds it after create(): values not read back
    job.gpu_hours, job.reserved_gpu_hours = Decimal("1.00005"), Decimal("0.125")
    job.started_at = timezone.now()
    built = JobDetailOut(job).data
    assert built == drf_walk(JobDetailOut, job)
    assert (str(built["gpu_hours"]), str(built["gpu_hours_reserved"])) == ("1.0000", "0.12")


def test_a_declared_field_must_read_the_column_the_answer_declares():
    class Renamed(JobOut):
        tenant = serializers.CharField(source="tenant.name")

    with pytest.raises(ImproperlyConfigured, match=r"reads tenant__name; .* says tenant__slug"):
        answer_plan(Renamed)
