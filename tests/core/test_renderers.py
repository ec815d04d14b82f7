"""portal.core.renderers.JSONRenderer writes, with orjson, the bytes DRF's JSONRenderer writes:
for every kind of value an answer holds, and for the API's own answers."""

import datetime
import decimal
import math
import uuid

import pytest
from django.utils.translation import gettext_lazy
from rest_framework.renderers import JSONRenderer as DrfRenderer
from rest_framework.utils.serializer_helpers import ReturnDict, ReturnList

from jobs.models import JobState
from portal.core.renderers import JSONRenderer

SAMPLES = {
    "scalars": {"a": 1, "b": [1.5, None, True, False, -0.0, 0.1 + 0.2, 1e300, -5], "c": "plain"},
    "text beyond ASCII, and the line separators JavaScript refuses": {"x": 'é 東京 \u2028 \u2029 \x00 "'},
    "decimals": {"gpu_hours": decimal.Decimal("1.2500"), "zero": decimal.Decimal("0.00")},
    "datetimes": {
        "micro": datetime.datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=datetime.UTC),
        "whole": datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC),
        "offset": datetime.datetime(
            2026, 1, 2, 3, 4, 5, tzinfo=datetime.timezone(datetime.timedelta(hours=8))
        ),
        "date": datetime.date(2026, 1, 1),
        "time": datetime.time(1, 2, 3),
        "duration": datetime.timedelta(seconds=5),
    },
    "serializer containers": ReturnDict({"x": ReturnList([1, 2], serializer=None)}, serializer=None),
    "choices, lazy text, uuids": {
        "state": JobState.QUEUED,
        "title": gettext_lazy("Not found"),
        "id": uuid.UUID("0a99f45a-a68f-4643-a888-a32811e7464a"),
    },
    "an int beyond 64 bits": {"big": 2**70},
    "empty": [{}, [], ""],
}


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_the_same_bytes_as_drf(name):
    assert JSONRenderer().render(SAMPLES[name]) == DrfRenderer().render(SAMPLES[name])


def test_indentation_asked_for_is_drfs():
    data = {"a": [1, {"b": 2}]}
    media = "application/json; indent=4"
    assert JSONRenderer().render(data, media, {}) == DrfRenderer().render(data, media, {})


def test_nan_is_written_as_null_where_drf_would_fail_the_answer():
    with pytest.raises(ValueError):
        DrfRenderer().render({"n": math.nan})
    assert JSONRenderer().render({"n": math.nan, "d": decimal.Decimal("NaN")}) == b'{"n":null,"d":null}'


@pytest.mark.django_db
def test_the_apis_answers_are_drfs_bytes(client_for, member, make_job, settings):
    for _ in range(3):
        make_job(member)
    api = client_for(member)
    for path in ("/api/v1/jobs/?tenant=protein-lab", "/api/v1/me/", "/api/v1/quotas/?tenant=protein-lab"):
        response = api.get(path)
        assert response.status_code == 200
        assert response.content == DrfRenderer().render(response.data)
    missing = api.get("/api/v1/jobs/999999/")
    assert missing.status_code == 404 and missing.content == DrfRenderer().render(missing.data)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("accept", "status", "indented"),
    [
        (None, 200, False),
        ("*/*", 200, False),
        ("application/json", 200, False),
        ("application/json, */*", 200, False),
        ("application/json; indent=2", 200, True),  # DRF's own negotiation: its parameters kept
        ("", 406, False),  # an empty header accepts nothing, as DRF reads it
        ("text/html", 406, False),
        ("application/xml", 406, False),
    ],
)
def test_negotiation_answers_as_drfs_would(client_for, member, accept, status, indented):
    """portal.core.renderers.JsonNegotiation decides the plain Accept headers itself and leaves
    every other to DRF's: the same status, type and form of body as DRF's negotiation gives."""
    headers = {} if accept is None else {"HTTP_ACCEPT": accept}
    response = client_for(member).get("/api/v1/me/", **headers)
    assert response.status_code == status, response.content
    assert response["Content-Type"].startswith(
        "application/json" if status == 200 else "application/problem+json"
    )
    assert (b"\n  " in response.content) is indented


@pytest.mark.django_db
def test_a_format_override_still_goes_through_drfs_negotiation(client_for, member):
    api = client_for(member)
    assert api.get("/api/v1/me/?format=json").status_code == 200
    assert api.get("/api/v1/me/?format=yaml").status_code == 404  # DRF: no renderer of that format


@pytest.mark.django_db
def test_a_view_whose_renderer_writes_html_is_not_answered_as_json(client_for, member):
    """The docs page's one renderer writes HTML: an Accept of JSON is DRF's 406, not that page."""
    response = client_for(member).get("/api/v1/docs/", HTTP_ACCEPT="application/json")
    assert response.status_code == 406
