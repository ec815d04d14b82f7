"""What schemathesis (scripts/fuzz) found in the API, each kept from coming back: a 500 on odd
input, input the schema forbids that the API took anyway, and answers the schema did not
describe. Against the real database; the last test starts gunicorn as the stack does."""

import json
import socket
import subprocess
from base64 import b64encode

import pytest
from django.utils import timezone
from rest_framework.exceptions import NotFound as DrfNotFound

from portal.core.errors import NotFound, problem_exception_handler
from tenants.models import Membership, Role
from tenants.services import membership_change_role, membership_remove
from tests.conftest import ROOT, VENV_BIN, free_port, stop, wait_for_port
from tests.jobs_support import JOB
from tests.test_api_conventions import assert_problem
from tests.test_quota_requests import request_body

pytestmark = pytest.mark.django_db

TODAY = timezone.localdate()


@pytest.fixture
def job(make_job, member):
    """A queued job of the member's, on a local partition, under a grant."""
    return make_job(member)


# --- 500s ---------------------------------------------------------------------------------------
# PostgreSQL refuses a NUL byte in a text parameter (psycopg raises DataError, not ValueError).


@pytest.mark.parametrize("kind", ["tenants", "gpu-models", "scenarios", "clusters", "jobs", "quotas"])
def test_a_nul_byte_as_an_objects_name_is_404(client_for, member, kind):
    assert_problem(client_for(member).get(f"/api/v1/{kind}/a%00b/"), 404, "not_found")


@pytest.mark.parametrize("method", ["patch", "delete"])
def test_a_nul_byte_as_a_members_name_is_404(client_for, owner, method):
    response = getattr(client_for(owner), method)(
        "/api/v1/tenants/protein-lab/members/a%00b/", {"role": "viewer"}, format="json"
    )
    assert_problem(response, 404, "not_found")


@pytest.mark.parametrize(
    ("url", "body", "field"),
    [
        ("/api/v1/jobs/", JOB | {"tenant": "\x00"}, "tenant"),
        ("/api/v1/jobs/", JOB | {"scenario": "ai\x00"}, "scenario"),
        ("/api/v1/jobs/", JOB | {"gpu_model": "\x00"}, "gpu_model"),
        ("/api/v1/jobs/", JOB | {"cluster": "\x00"}, "cluster"),
        ("/api/v1/quota-requests/", request_body(tenant="protein\x00lab"), "tenant"),
        ("/api/v1/tenants/protein-lab/members/", {"username": "\x00", "role": "viewer"}, "username"),
    ],
)
def test_a_nul_byte_in_a_reference_is_400_naming_it(client_for, owner, catalog, url, body, field):
    body = assert_problem(client_for(owner).post(url, body, format="json"), 400, "invalid")
    assert field in body["errors"]


def test_a_new_tenants_owner_with_a_nul_byte_is_400(client_for, admin_user):
    body = {"slug": "new-team", "name": "New", "owner": "ad\x00min"}
    response = client_for(admin_user).post("/api/v1/tenants/", body, format="json")
    assert list(assert_problem(response, 400, "invalid")["errors"]) == ["owner"]


def test_a_page_size_of_other_digits_is_400(client_for, member):
    # "²".isdigit() holds, and int("²") raises: the check was isdigit().
    body = assert_problem(client_for(member).get("/api/v1/auth/tokens/?page_size=%C2%B2"), 400, "invalid")
    assert list(body["errors"]) == ["page_size"]


@pytest.mark.parametrize(
    "cursor",
    [
        "0.0.abc",  # a position an integer key cannot hold
        b64encode(b"p=abc").decode(),  # the same as DRF wrote cursors: its decoder took any text
        "0.0.1%00",
    ],
)
def test_a_forged_cursor_is_400(client_for, member, cursor):
    response = client_for(member).get(f"/api/v1/jobs/?cursor={cursor}")
    assert list(assert_problem(response, 400, "invalid")["errors"]) == ["cursor"]


def test_cursors_page_through_a_list_ordered_by_slug(client_for, member):
    client = client_for(member)
    first = client.get("/api/v1/gpu-models/?page_size=2").json()
    assert first["next"].split("cursor=")[1].startswith("0.0.")
    second = client.get(first["next"]).json()
    slugs = [g["slug"] for page in (first, second) for g in page["results"]]
    assert len(slugs) == 4 and slugs == sorted(slugs)
    back = client.get(second["previous"]).json()
    assert [g["slug"] for g in back["results"]] == slugs[:2]


def test_an_empty_page_size_or_cursor_reads_as_absent(client_for, member):
    client = client_for(member)
    response = client.get("/api/v1/gpu-models/?page_size=&cursor=")
    assert response.status_code == 200
    assert response.json() == client.get("/api/v1/gpu-models/").json()


def test_a_number_beyond_any_float_is_400(client_for, member):
    # JSON has no limit; DRF's FloatField let OverflowError through.
    response = client_for(member).post(
        "/api/v1/scenarios/ai-training/advise/", {"params_b": 10**400}, format="json"
    )
    assert list(assert_problem(response, 400, "invalid")["errors"]) == ["params_b"]


@pytest.mark.parametrize(
    "moment",
    [
        "1336-11-08T16:21:23.834-22:04",  # RFC 3339 allows ±23:59; PostgreSQL stops at ±15:59
        "0001-01-01T00:00:00+14:00",  # before year 1 once in UTC
        "9999-12-31T23:59:59-14:00",  # after 9999 once in UTC
    ],
)
def test_a_time_with_any_offset_filters_jobs(client_for, member, job, moment):
    moment = moment.replace("+", "%2B")
    after = client_for(member).get(f"/api/v1/jobs/?created_after={moment}")
    before = client_for(member).get(f"/api/v1/jobs/?created_before={moment}")
    assert after.status_code == before.status_code == 200
    assert len(after.json()["results"]) + len(before.json()["results"]) == 1


def test_a_member_removed_meanwhile_is_not_found(owner, member, tenant):
    """Two requests on one member: the second read the member before the first removed it."""
    stale = Membership.objects.get(tenant=tenant, user=member)
    membership_remove(actor=owner, membership=Membership.objects.get(pk=stale.pk))
    with pytest.raises(NotFound):
        membership_change_role(actor=owner, membership=stale, role=Role.VIEWER)
    with pytest.raises(NotFound):
        membership_remove(actor=owner, membership=stale)
    assert not Membership.objects.filter(tenant=tenant, user=member).exists()


def test_not_found_raised_by_a_service_is_a_404_problem():
    response = problem_exception_handler(NotFound("Gone meanwhile."), {})
    assert response.status_code == 404 and response.data["code"] == "not_found"


def test_a_404_without_text_still_says_what():
    # DRF raises a bare Http404 for a lookup value its field cannot hold.
    from django.http import Http404

    response = problem_exception_handler(Http404(), {})
    assert response.data["detail"] == "Not found."
    assert problem_exception_handler(DrfNotFound(), {}).data["detail"]


# --- Input the schema forbids, which the API took ------------------------------------------------


@pytest.mark.parametrize(
    ("change", "field"), [({"name": 0}, "name"), ({"contact_email": True}, "contact_email")]
)
def test_a_string_field_refuses_another_json_type(client_for, owner, change, field):
    # DRF's CharField reads 0 as "0".
    response = client_for(owner).patch("/api/v1/tenants/protein-lab/", change, format="json")
    assert list(assert_problem(response, 400, "invalid")["errors"]) == [field]


@pytest.mark.parametrize(
    ("change", "field"),
    [({"gpus": "8"}, "gpus"), ({"gpus": True}, "gpus"), ({"gpu_hours": "5"}, "gpu_hours")],
)
def test_a_number_field_refuses_a_string(client_for, owner, catalog, change, field):
    response = client_for(owner).post("/api/v1/quota-requests/", request_body(**change), format="json")
    assert field in assert_problem(response, 400, "invalid")["errors"]


def test_the_advisor_api_takes_numbers_not_numerals(client_for, member):
    client = client_for(member)
    refused = client.post("/api/v1/scenarios/ai-training/advise/", {"params_b": "7"}, format="json")
    assert list(assert_problem(refused, 400, "invalid")["errors"]) == ["params_b"]
    assert (
        client.post("/api/v1/scenarios/ai-training/advise/", {"params_b": 7}, format="json").status_code
        == 200
    )


def test_the_active_filter_takes_true_or_false_only(client_for, member, grant):
    client = client_for(member)
    # Django's NullBooleanField read "maybe" as no filter at all.
    assert list(assert_problem(client.get("/api/v1/quotas/?active=maybe"), 400, "invalid")["errors"]) == [
        "active"
    ]
    assert len(client.get("/api/v1/quotas/?active=true").json()["results"]) == 1
    assert len(client.get("/api/v1/quotas/?active=false").json()["results"]) == 0
    assert len(client.get("/api/v1/quotas/?active=").json()["results"]) == 1


def test_a_jobs_events_and_log_do_not_take_the_job_lists_filters(client_for, member, job):
    # get_object() applied the list's filter set: ?state=RUNNING made a queued job a 404.
    client = client_for(member)
    assert client.get(f"/api/v1/jobs/{job.pk}/events/?state=RUNNING").status_code == 200
    assert client.get(f"/api/v1/jobs/{job.pk}/events/?state=nonsense").status_code == 200


@pytest.mark.parametrize(
    "url", ["/api/v1/audit/?action=a%00", "/api/v1/jobs/?tenant=%00", "/api/v1/usage/?tenant=%00"]
)
def test_a_nul_byte_in_a_text_filter_is_400_as_the_schema_says(client_for, owner, url):
    assert_problem(client_for(owner).get(url), 400, "invalid")


def test_templates_with_an_empty_scenario_are_all_templates(client_for, member):
    client = client_for(member)
    every = client.get("/api/v1/templates/").json()["results"]
    assert every and client.get("/api/v1/templates/?scenario=").json()["results"] == every


# --- Answers the schema did not describe ---------------------------------------------------------


@pytest.fixture
def spec(client_for, member):
    return client_for(member).get("/api/v1/schema/?format=json").json()


def operations(spec):
    for path, methods in spec["paths"].items():
        for method, operation in methods.items():
            yield method.upper(), path, operation


def test_every_error_answer_is_documented_as_problem_json(spec):
    for method, path, operation in operations(spec):
        responses = operation["responses"]
        where = f"{method} {path}"
        errors = {code: r for code, r in responses.items() if int(code) >= 400}
        for code, response in errors.items():
            assert list(response["content"]) == ["application/problem+json"], (where, code)
            assert response["content"]["application/problem+json"]["schema"]["$ref"].endswith("/ProblemOut")
        assert "429" in errors and "Retry-After" in errors["429"]["headers"], where
        secured = operation.get("security") and {} not in operation["security"]
        assert ("401" in errors) == bool(secured), where
        if any(p["in"] == "path" for p in operation.get("parameters", [])):
            assert "404" in errors, where
        if "requestBody" in operation:
            assert {"400", "413", "415"} <= set(errors), where


def test_the_schema_states_what_fields_the_api_refuses(spec):
    schemas = spec["components"]["schemas"]
    assert schemas["MemberPatchRequest"]["required"] == ["role"]  # not an all-optional PATCH body
    assert schemas["QuotaRequestOut"]["properties"]["decided_by"]["nullable"] is True
    assert {"type": "string", "maxLength": 0} in schemas["MeOut"]["properties"]["email"]["oneOf"]
    assert schemas["JobOut"]["properties"]["submitted_by"]["nullable"] is True
    assert schemas["QuotaRequestInRequest"]["properties"]["gpu_hours"]["multipleOf"] == 0.01
    assert "^(?!(?:default|root)$|kube-)" in schemas["TenantInRequest"]["properties"]["slug"]["pattern"]
    jobs = {p["name"]: p for p in spec["paths"]["/api/v1/jobs/"]["get"]["parameters"]}
    assert jobs["page_size"]["schema"] == {"type": "integer", "minimum": 1, "maximum": 200}
    assert jobs["created_after"]["allowEmptyValue"] is True and "allowEmptyValue" not in jobs["state"]
    assert jobs["tenant"]["schema"]["pattern"] == "^[^\\x00]*$"  # a text filter refuses NUL, as said
    advise = spec["paths"]["/api/v1/scenarios/{slug}/advise/"]["post"]
    assert advise["requestBody"]["required"] is True


def test_gunicorn_answers_a_request_it_cannot_parse_with_problem_json():
    """Gunicorn refuses a request line over 4094 bytes itself, before Django; gunicorn.conf.py,
    which every gunicorn of the project reads, makes that answer problem+json too."""
    port = free_port()
    proc = subprocess.Popen(
        [str(VENV_BIN / "gunicorn"), "portal.wsgi", "--bind", f"127.0.0.1:{port}", "--workers", "1"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port(port, timeout_s=30, proc=proc)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(f"GET /api/v1/me/?x={'a' * 6000} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())
            raw = b""
            while chunk := sock.recv(65536):
                raw += chunk
    finally:
        stop(proc)
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 ")
    assert b"Content-Type: application/problem+json" in head
    problem = json.loads(body)
    assert problem["code"] == "invalid" and problem["status"] == 400 and "too large" in problem["detail"]
