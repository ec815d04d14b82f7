"""Conditional GETs (portal/core/conditional.py): an ETag on a job, the job list and quota; a 304
to If-None-Match while the answer is the same, uncounted by the user throttle; a new tag once
it changes; and another tenant's job still 404."""

import pytest
from django.test import override_settings

from jobs.models import Job
from tests.api_support import assert_problem

pytestmark = pytest.mark.django_db


@pytest.fixture
def job(make_job, member):
    return make_job(member)


def urls(job) -> list[str]:
    return [f"/api/v1/jobs/{job.pk}/", "/api/v1/jobs/", "/api/v1/jobs/?state=QUEUED", "/api/v1/quotas/"]


def test_an_unchanged_answer_is_a_304_without_a_body_and_a_changed_one_a_new_200(client_for, member, job):
    client = client_for(member)
    for url in urls(job):
        first = client.get(url)
        etag = first["ETag"]
        assert first.status_code == 200 and etag.startswith('"')
        again = client.get(url, HTTP_IF_NONE_MATCH=etag)
        assert (again.status_code, again.content, again["ETag"]) == (304, b"", etag), url
        # weakly compared: nginx's gzip hands the client W/"…", and the client sends it back
        assert client.get(url, HTTP_IF_NONE_MATCH=f'"other", W/{etag}').status_code == 304
        assert client.get(url, HTTP_IF_NONE_MATCH='"other"').status_code == 200
    tag_before = client.get(f"/api/v1/jobs/{job.pk}/")["ETag"]
    Job.objects.filter(pk=job.pk).update(reason="Resources")  # a change that records no event
    changed = client.get(f"/api/v1/jobs/{job.pk}/", HTTP_IF_NONE_MATCH=tag_before)
    assert changed.status_code == 200 and changed.json()["reason"] == "Resources"
    assert changed["ETag"] != tag_before


def test_a_304_is_not_counted_by_the_user_throttle(client_for, member, job):
    client = client_for(member)
    url = f"/api/v1/jobs/{job.pk}/"
    rates = {"user": "3/min", "anon": "100/min", "token": "100/min", "conditional": "100/min"}
    with override_settings(API_THROTTLE_RATES=rates):
        etag = client.get(url)["ETag"]  # 1 of 3
        for _ in range(20):
            assert client.get(url, HTTP_IF_NONE_MATCH=etag).status_code == 304
        assert client.get(url).status_code == 200  # 2
        # a tag that no longer matches is a full answer, and counted
        assert client.get(url, HTTP_IF_NONE_MATCH='"stale"').status_code == 200  # 3
        assert_problem(client.get(url, HTTP_IF_NONE_MATCH='"stale"'), 429, "throttled")
        assert_problem(client.get(url), 429, "throttled")


def test_another_tenants_job_is_404_whatever_the_tag(client_for, outsider, job):
    client = client_for(outsider)
    assert_problem(client.get(f"/api/v1/jobs/{job.pk}/", HTTP_IF_NONE_MATCH="*"), 404, "not_found")
    assert "ETag" not in client.get(f"/api/v1/jobs/{job.pk}/")


def test_the_tag_differs_between_a_viewer_and_the_submitter_who_sees_more(client_for, member, viewer, job):
    """The submitter's answer has the script; a viewer's does not: a viewer's tag never makes the
    submitter's client keep an answer without it, or the other way round."""
    mine = client_for(member).get(f"/api/v1/jobs/{job.pk}/")
    theirs = client_for(viewer).get(f"/api/v1/jobs/{job.pk}/")
    assert "script" in mine.json() and "script" not in theirs.json()
    assert mine["ETag"] != theirs["ETag"]
    assert (
        client_for(viewer).get(f"/api/v1/jobs/{job.pk}/", HTTP_IF_NONE_MATCH=mine["ETag"]).status_code == 200
    )


def test_if_none_match_star_is_a_full_answer_and_conditional_gets_have_their_own_allowance(
    client_for, member, job
):
    """`*` would make any answer a 304 the user throttle does not count: it is not honoured. And
    replaying a current tag is bounded by the larger allowance of conditional GETs."""
    client = client_for(member)
    url = f"/api/v1/jobs/{job.pk}/"
    rates = {"user": "2/min", "anon": "100/min", "token": "100/min", "conditional": "5/min"}
    with override_settings(API_THROTTLE_RATES=rates):
        etag = client.get(url)["ETag"]  # user 1
        assert client.get(url, HTTP_IF_NONE_MATCH="*").status_code == 200  # user 2, conditional 1
        assert_problem(client.get(url, HTTP_IF_NONE_MATCH="*"), 429, "throttled")  # user 3: refused
        for _ in range(3):  # conditional 3, 4, 5: uncounted 304s
            assert client.get(url, HTTP_IF_NONE_MATCH=etag).status_code == 304
        assert_problem(client.get(url, HTTP_IF_NONE_MATCH=etag), 429, "throttled")  # conditional 6
