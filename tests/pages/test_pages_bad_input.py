"""Every page (every URL pattern outside /api/, the admin console's included) refuses impossible
input with 400 or 404, never 500: a NUL byte in each path parameter, each query parameter and a
form; overlong slugs and ids; non-digit and non-ASCII-digit ids; invalid UTF-8."""

import re

import pytest
from django.contrib import admin
from django.urls import URLPattern, URLResolver, get_resolver, reverse

from portal.core.tokens import token_create
from tests.factories import QuotaRequestFactory
from webhooks.models import Delivery, Endpoint

pytestmark = pytest.mark.django_db

# Every query parameter a page reads (views, the job list's filters, the admin's changelist,
# the login page's next), and one no page reads.
QUERY_NAMES = (
    "tenant", "section", "scenario", "view", "before", "after", "state", "submitted_by", "cluster",
    "created_after", "created_before", "next", "q", "o", "p", "e", "_changelist_filters", "language", "unread",
)  # fmt: skip


def _page_routes(patterns=None, prefix: str = ""):
    """(route, converters) of every page pattern of portal.urls; the API and the admin apart."""
    for pattern in get_resolver().url_patterns if patterns is None else patterns:
        route = prefix + str(pattern.pattern)
        if route.startswith(("api/", "admin/")):
            continue
        if isinstance(pattern, URLResolver):
            yield from _page_routes(pattern.url_patterns, route)
        elif isinstance(pattern, URLPattern):
            yield route, dict(getattr(pattern.pattern, "converters", {}))


PAGE_ROUTES = sorted(_page_routes())


def _admin_names():
    """The admin console's pages: its index, each app's, and each model's list, add, change,
    delete and history (the last three take an object id)."""
    names = [("admin:index", {}), ("admin:logout", {}), ("admin:password_change", {})]
    for app in sorted({model._meta.app_label for model in admin.site._registry}):
        names.append(("admin:app_list", {"app_label": app}))
    for model in sorted(admin.site._registry, key=lambda m: m._meta.label):
        base = f"admin:{model._meta.app_label}_{model._meta.model_name}"
        names += [(f"{base}_changelist", {}), (f"{base}_add", {})]
        names += [(f"{base}_{view}", {"object_id": "1"}) for view in ("change", "delete", "history")]
    return names


ADMIN_NAMES = _admin_names()

# A value of each path parameter that names a real object (filled in by the fixture) and the
# impossible ones tried in its place.
IMPOSSIBLE = ["%00", "a%00b", "%FF", "%C0%AF", "x" * 300]
IMPOSSIBLE_IDS = ["9" * 30, "abc", "%C2%B2", "-1"]


@pytest.fixture
def world(admin_user, tenant, member, make_job, catalog):
    job = make_job(member)
    quota_request = QuotaRequestFactory(
        tenant=tenant, pair=catalog, gpus=1, gpu_hours=10, requested_by=member, days=0, justification="x"
    )
    token, _ = token_create(user=admin_user, name="probe")
    endpoint = Endpoint.objects.create(
        tenant=tenant, url="https://hooks.example.org/x", secret="s", events=["ping"]
    )
    delivery = Delivery.objects.create(
        endpoint=endpoint, event_type="ping", event_key="ping:probe", payload={}
    )
    return {
        "endpoint_id": str(endpoint.pk),
        "delivery_id": str(delivery.pk),
        "action": "disable",
        "slug": tenant.slug,
        "token_id": str(token.pk),
        "job_id": str(job.pk),
        "request_id": str(quota_request.pk),
        "username": member.username,
        "uidb64": "MQ",
        "token": "set-password",
        "object_id": "1",
        "app_label": "tenants",
    }


def _fill(route: str, converters: dict, values: dict, **replace) -> str:
    path = route
    for name in converters:
        path = re.sub(rf"<(?:\w+:)?{name}>", replace.get(name, values[name]), path)
    return "/" + path


def _assert_refused(client, method: str, url: str, **kwargs) -> None:
    response = getattr(client, method)(url, **kwargs)
    assert response.status_code in (400, 404), f"{method.upper()} {url}: {response.status_code}"


def _assert_admin_refused(client, url: str) -> None:
    """The admin console's own answer to an id of no object: back to its index with a message
    (302), or 403 where the view needs a permission first; never a 500."""
    response = client.get(url)
    if response.status_code == 302:
        assert response["Location"] == reverse("admin:index"), url
    else:
        assert response.status_code in (400, 403, 404), f"GET {url}: {response.status_code}"


def _probe(client, url: str, params: dict[str, list[str]]) -> None:
    """The page as it is (anything but a 500), then each impossible input in its place."""
    sound = client.get(url)
    assert sound.status_code < 500, f"GET {url}: {sound.status_code}"
    for name, bad_values in params.items():
        for bad in bad_values:
            _assert_refused(client, "get", url.replace(f"\x01{name}\x01", bad))
    for name in QUERY_NAMES:
        _assert_refused(client, "get", f"{url}?{name}=%00")
        _assert_refused(client, "get", f"{url}?{name}=ok&{name}=a%00")
    _assert_refused(client, "get", f"{url}?%00=1")
    form = {
        name: "a\x00" for name in ("username", "role", "scenario", "tenant", "name", "script", "language")
    }
    _assert_refused(client, "post", url, data=form)


@pytest.mark.parametrize(("route", "converters"), PAGE_ROUTES, ids=[r for r, _c in PAGE_ROUTES])
def test_pages_refuse_impossible_input(client, world, admin_user, route, converters):
    client.force_login(admin_user)  # a platform admin reaches every page and every object
    url = _fill(route, converters, world)
    _probe(client, url, {})
    for name in converters:
        bad_values = IMPOSSIBLE + (IMPOSSIBLE_IDS if name.endswith("_id") else [])
        for bad in bad_values:
            _assert_refused(client, "get", _fill(route, converters, world, **{name: bad}))


@pytest.mark.parametrize(("name", "kwargs"), ADMIN_NAMES, ids=[n for n, _k in ADMIN_NAMES])
def test_admin_pages_refuse_impossible_input(client, world, admin_user, name, kwargs):
    client.force_login(admin_user)
    url = reverse(name, kwargs=kwargs)
    _probe(client, url, {})
    if "object_id" in kwargs:
        for bad in IMPOSSIBLE + IMPOSSIBLE_IDS:
            _assert_admin_refused(client, url.replace("/1/", f"/{bad}/", 1))


def test_a_nul_byte_in_the_switcher_is_a_400_page(client, world, member):
    """The tenant switcher passed ?tenant= to PostgreSQL, which refuses a NUL byte: a 500 before."""
    client.force_login(member)
    response = client.get("/t/?tenant=protein%00lab")
    assert response.status_code == 400
    assert b"Bad request" in response.content


def test_the_job_list_pages_by_ascii_digits_only(client, world, member):
    """?before=² passed str.isdigit, then int() raised: a 500 before."""
    client.force_login(member)
    assert client.get("/t/protein-lab/jobs/?before=%C2%B2").status_code == 200
    assert client.get(f"/t/protein-lab/jobs/?before={'9' * 30}").status_code == 200
