"""What a caller can learn about tenants and users they may not see: nothing.

A tenant the caller cannot see answers 404 before any input is read, on every tenant-scoped API
route and page form; a tenant named in a body answers like one that does not exist; no answer
tells whether a username exists to a caller who shares no tenant with that user."""

import re

import pytest
from django.test import override_settings

from jobs.models import Job
from tenants.models import Membership, QuotaRequest, Role
from tests.api_support import request_body
from tests.conftest import join
from tests.factories import QuotaRequestFactory, UserFactory
from tests.jobs_support import JOB

pytestmark = pytest.mark.django_db

# A body of each kind no route accepts: none, empty, the wrong JSON type, wrong fields.
BAD_BODIES = [None, {}, [], "x", {"username": "\x00", "role": "god", "name": 7, "note": None}]


@pytest.fixture
def theirs(tenant, member, make_job, catalog):
    """protein-lab's objects, which the outsider (of other-team) may not see."""
    job = make_job(member)
    quota_request = QuotaRequestFactory(
        tenant=tenant, pair=catalog, gpus=1, gpu_hours=10, requested_by=member, days=0, justification="x"
    )
    return {"job": job.pk, "req": quota_request.pk}


API_ROUTES = [
    ("post", "/api/v1/tenants/protein-lab/members/"),
    ("get", "/api/v1/tenants/protein-lab/members/"),
    ("patch", "/api/v1/tenants/protein-lab/members/member/"),
    ("delete", "/api/v1/tenants/protein-lab/members/member/"),
    ("patch", "/api/v1/tenants/protein-lab/"),
    ("get", "/api/v1/tenants/protein-lab/"),
    ("post", "/api/v1/quota-requests/{req}/approve/"),
    ("post", "/api/v1/quota-requests/{req}/reject/"),
    ("delete", "/api/v1/quota-requests/{req}/"),
    ("get", "/api/v1/quota-requests/{req}/"),
    ("post", "/api/v1/jobs/{job}/cancel/"),
    ("get", "/api/v1/jobs/{job}/"),
    ("get", "/api/v1/jobs/{job}/events/"),
    ("get", "/api/v1/jobs/{job}/log/?tail=x"),
]


@pytest.mark.parametrize(("method", "path"), API_ROUTES, ids=[f"{m} {p}" for m, p in API_ROUTES])
@pytest.mark.parametrize("body", BAD_BODIES, ids=["none", "empty", "list", "string", "wrong"])
def test_another_tenants_routes_answer_404_whatever_the_body(
    client_for, outsider, theirs, method, path, body
):
    client = client_for(outsider)
    kwargs = {} if body is None or method == "get" else {"data": body, "format": "json"}
    response = getattr(client, method)(path.format(**theirs), **kwargs)
    assert response.status_code == 404, response.content
    assert response.json()["code"] == "not_found"


@pytest.mark.parametrize(("method", "path"), API_ROUTES[:1] + API_ROUTES[2:5])
def test_a_tenant_that_does_not_exist_answers_the_same(client_for, outsider, theirs, method, path):
    client = client_for(outsider)
    seen = getattr(client, method)(path, data={}, format="json")
    missing = getattr(client, method)(path.replace("protein-lab", "no-such-lab"), data={}, format="json")
    assert seen.status_code == missing.status_code == 404
    assert seen.json()["code"] == missing.json()["code"] == "not_found"


def _without_slug(response, slug: str) -> dict:
    body = response.json()
    return {key: str(value).replace(slug, "<slug>") for key, value in body.items()}


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/api/v1/quota-requests/", request_body()),
        ("/api/v1/quota-requests/", request_body(gpus="x")),
        ("/api/v1/jobs/", JOB),
        ("/api/v1/jobs/", JOB | {"gpus": -1}),
    ],
    ids=["quota", "quota-bad-gpus", "job", "job-bad-gpus"],
)
def test_a_body_naming_another_tenant_reads_as_one_that_does_not_exist(
    client_for, outsider, theirs, catalog, path, body
):
    """docs/api.md: a slug in a body answers 400 naming the field (tenant); the answer for a tenant the
    caller cannot see and for one that does not exist are the same, except for the slug echoed."""
    client = client_for(outsider)
    seen = client.post(path, body, format="json")
    missing = client.post(path, body | {"tenant": "no-such-lab"}, format="json")
    assert seen.status_code == missing.status_code == 400
    assert "tenant" in seen.json()["errors"]
    assert _without_slug(seen, "protein-lab") == _without_slug(missing, "no-such-lab")
    assert not QuotaRequest.objects.filter(requested_by=outsider).exists()
    assert not Job.objects.filter(submitted_by=outsider).exists()


# --- Pages: every form POST of a tenant, as an outsider, with no or a bad form.

PAGE_POSTS = [
    "/t/protein-lab/team/add/",
    "/t/protein-lab/team/member/role/",
    "/t/protein-lab/team/member/remove/",
    "/t/protein-lab/quota/",
    "/t/protein-lab/quota/{req}/withdraw/",
    "/t/protein-lab/jobs/new/",
    "/t/protein-lab/jobs/new/check/",
    "/t/protein-lab/jobs/{job}/cancel/",
]


@pytest.mark.parametrize("path", PAGE_POSTS)
@pytest.mark.parametrize("form", [{}, {"username": "member", "role": "god", "gpus": "x", "scenario": "?"}])
def test_another_tenants_forms_answer_404_whatever_the_form(web, outsider, theirs, path, form):
    response = web(outsider).post(path.format(**theirs), form)
    assert response.status_code == 404
    assert Membership.objects.filter(tenant__slug="protein-lab", user=outsider).count() == 0


# --- Usernames: who may learn that one exists.


@pytest.fixture
def stranger(db):
    """A user who shares no tenant with anyone in protein-lab."""
    return UserFactory(username="stranger")


@pytest.mark.parametrize("persona", ["outsider", "viewer", "member"])
def test_adding_a_member_tells_no_one_without_the_role_whether_a_username_exists(
    client_for, request, tenant, stranger, persona
):
    client = client_for(request.getfixturevalue(persona))
    known = client.post("/api/v1/tenants/protein-lab/members/", {"username": "stranger", "role": "viewer"})
    unknown = client.post("/api/v1/tenants/protein-lab/members/", {"username": "nobody-x", "role": "viewer"})
    assert known.status_code == unknown.status_code == (404 if persona == "outsider" else 403)
    assert known.json() == unknown.json()


def test_a_managers_misses_are_counted_and_then_every_lookup_is_refused(client_for, manager, stranger):
    client = client_for(manager)
    rates = {"user": "1000/min", "anon": "1000/min", "token": "1000/min", "member_lookup": "3/hour"}
    with override_settings(API_THROTTLE_RATES=rates):
        for n in range(3):
            miss = client.post(
                "/api/v1/tenants/protein-lab/members/", {"username": f"guess{n}", "role": "viewer"}
            )
            assert miss.status_code == 400
            assert miss.json()["errors"] == {"username": ["No active user has this username."]}
        # Spent: a name that exists is refused exactly as one that does not.
        hit = client.post("/api/v1/tenants/protein-lab/members/", {"username": "stranger", "role": "viewer"})
        miss = client.post("/api/v1/tenants/protein-lab/members/", {"username": "guess9", "role": "viewer"})
    assert hit.status_code == miss.status_code == 429
    assert hit.json()["code"] == "throttled" and int(hit["Retry-After"]) > 0
    assert {k: v for k, v in hit.json().items() if k != "retry_after_s"} == {
        k: v for k, v in miss.json().items() if k != "retry_after_s"
    }
    assert not Membership.objects.filter(user=stranger).exists()


def test_an_inactive_user_is_named_like_an_unknown_one(client_for, manager):
    UserFactory(username="gone", is_active=False)
    client = client_for(manager)
    gone = client.post("/api/v1/tenants/protein-lab/members/", {"username": "gone", "role": "viewer"})
    nobody = client.post("/api/v1/tenants/protein-lab/members/", {"username": "nobody", "role": "viewer"})
    assert gone.status_code == nobody.status_code == 400
    assert gone.json() == nobody.json()


def test_platform_admins_misses_are_not_counted(client_for, admin_user, tenant):
    client = client_for(admin_user)
    rates = {"user": "1000/min", "anon": "1000/min", "token": "1000/min", "member_lookup": "1/hour"}
    with override_settings(API_THROTTLE_RATES=rates):
        for n in range(3):
            assert (
                client.post(
                    "/api/v1/tenants/protein-lab/members/", {"username": f"g{n}", "role": "viewer"}
                ).status_code
                == 400
            )
        assert (
            client.post(
                "/api/v1/tenants/protein-lab/members/", {"username": "admin", "role": "viewer"}
            ).status_code
            == 201
        )


def test_the_team_page_counts_misses_too(web, manager, stranger):
    client = web(manager)
    rates = {"user": "1000/min", "anon": "1000/min", "token": "1000/min", "member_lookup": "2/hour"}
    with override_settings(API_THROTTLE_RATES=rates):
        for n in range(2):
            miss = client.post("/t/protein-lab/team/add/", {"username": f"guess{n}", "role": "viewer"})
            assert miss.status_code == 400
            assert b"No active user has this username." in miss.content
        hit = client.post("/t/protein-lab/team/add/", {"username": "stranger", "role": "viewer"})
    assert hit.status_code == 429 and int(hit["Retry-After"]) > 0
    assert b"Too many usernames that name no one" in hit.content
    assert not Membership.objects.filter(user=stranger).exists()


def test_a_viewer_on_the_team_page_learns_nothing_of_usernames(web, viewer, stranger):
    client = web(viewer)
    known = client.post("/t/protein-lab/team/add/", {"username": "stranger", "role": "viewer"})
    unknown = client.post("/t/protein-lab/team/add/", {"username": "nobody-x", "role": "viewer"})
    assert known.status_code == unknown.status_code == 403


def test_the_token_endpoint_answers_an_unknown_user_as_a_wrong_password(anon_client, member):
    unknown = anon_client.post("/api/v1/auth/token/", {"username": "nobody-x", "password": "x"})
    wrong = anon_client.post("/api/v1/auth/token/", {"username": "member", "password": "x"})
    inactive = UserFactory(username="gone", is_active=False)
    gone = anon_client.post("/api/v1/auth/token/", {"username": inactive.username, "password": "x"})
    assert unknown.status_code == wrong.status_code == gone.status_code == 400
    assert unknown.json() == wrong.json() == gone.json()


def test_the_login_page_answers_an_unknown_user_as_a_wrong_password(client, member):
    unknown = client.post("/accounts/login/", {"username": "nobody-x", "password": "x"})
    wrong = client.post("/accounts/login/", {"username": "member", "password": "x"})
    assert unknown.status_code == wrong.status_code == 200
    assert _page_text(unknown).replace("nobody-x", "member") == _page_text(wrong)


def _page_text(response) -> str:
    """The page without its per-render CSRF token."""
    return re.sub(r'name="csrfmiddlewaretoken" value="[^"]*"', "", response.content.decode())


def test_a_member_sees_the_usernames_of_their_tenant_only(client_for, member, outsider, tenant):
    join(tenant, "colleague", Role.VIEWER)
    names = [
        m["username"]
        for m in client_for(member).get("/api/v1/tenants/protein-lab/members/").json()["results"]
    ]
    assert "colleague" in names and "outsider" not in names


def test_with_the_counters_unreadable_a_lookup_is_refused_with_503_not_guessed(client_for, manager, stranger):
    """The member look-up's counter fails closed: no look-up it cannot count (a cache on a port
    where nothing listens, as when Redis is down)."""
    dead = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": "redis://127.0.0.1:1/0",
        }
    }
    client = client_for(manager)
    with override_settings(CACHES=dead):
        response = client.post(
            "/api/v1/tenants/protein-lab/members/", {"username": "stranger", "role": "viewer"}
        )
    assert response.status_code == 503 and response.json()["code"] == "unavailable"
    assert not Membership.objects.filter(user=stranger).exists()
