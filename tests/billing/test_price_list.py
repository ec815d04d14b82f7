"""The price list: read-only in the API to everyone signed in, changed in the console by platform
admins only forward in time (a price in force is never edited or deleted, a backdated one is
refused on its field), every change audited."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.apps import apps
from django.conf import settings
from django.contrib.auth.models import Group
from django.utils import timezone

from billing.models import Price
from portal.core.models import AuditEvent
from portal.core.staff import ROLE_PLATFORM_ADMIN, ROLE_QUOTA_APPROVER, staff_role_groups_sync
from tests.api_support import assert_problem
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


def staff(username: str, role: str):
    staff_role_groups_sync(apps)  # a transactional test elsewhere may have flushed the groups
    user = UserFactory(username=username, is_staff=True)
    user.groups.set(Group.objects.filter(name=role))
    return user


@pytest.fixture
def prices(catalog):
    now = timezone.now()
    model = catalog[1]
    return [
        Price.objects.create(
            gpu_model=model, per_gpu_hour=Decimal("10.5"), effective_from=now - timedelta(days=60)
        ),
        Price.objects.create(
            gpu_model=model, per_gpu_hour=Decimal("12.25"), effective_from=now - timedelta(days=1)
        ),
        Price.objects.create(
            gpu_model=model, per_gpu_hour=Decimal("9.0001"), effective_from=now + timedelta(days=30)
        ),
    ]


def test_everyone_signed_in_reads_every_price_with_when_it_holds(client_for, viewer, prices, anon_client):
    rows = client_for(viewer).get("/api/v1/prices/").json()["results"]
    assert [(r["per_gpu_hour"], r["currency"], r["in_force"]) for r in rows] == [
        ("10.5000", "CNY", False),
        ("12.2500", "CNY", True),
        ("9.0001", "CNY", False),
    ]
    assert rows[0]["until"] == rows[1]["effective_from"]
    assert rows[2]["until"] is None
    assert anon_client.get("/api/v1/prices/").status_code == 401


def test_the_price_list_is_read_only_and_its_filters_name_bad_input(client_for, viewer, prices, catalog):
    client = client_for(viewer)
    assert client.post("/api/v1/prices/", {"per_gpu_hour": "1"}, format="json").status_code == 405
    assert client.delete(f"/api/v1/prices/{prices[0].pk}/").status_code == 405
    body = assert_problem(client.get("/api/v1/prices/?share=half"), 400, "invalid")
    assert set(body["errors"]) == {"share"}
    assert client.get(f"/api/v1/prices/?gpu_model={catalog[1].slug}&share=whole").json()["results"]
    assert client.get("/api/v1/prices/?gpu_model=a100-80gb").json()["results"] == []


def test_a_platform_admin_adds_a_future_price_and_it_is_audited(client, catalog):
    admin = staff("padmin", ROLE_PLATFORM_ADMIN)
    client.force_login(admin)
    client.cookies[settings.LANGUAGE_COOKIE_NAME] = "en"
    when = timezone.localtime() + timedelta(days=3)
    response = client.post(
        "/admin/billing/price/add/",
        {"gpu_model": catalog[1].pk, "share": "whole", "per_gpu_hour": "15.75",
         "effective_from_0": when.strftime("%Y-%m-%d"), "effective_from_1": when.strftime("%H:%M:%S")},
    )  # fmt: skip
    assert response.status_code == 302, response.content.decode()[:2000]
    added = Price.objects.get()
    assert added.per_gpu_hour == Decimal("15.75") and added.created_by == admin
    event = AuditEvent.objects.get(action="price.add")
    assert event.data["per_gpu_hour"] == "15.75" and event.actor_username == "padmin"


def test_a_backdated_price_is_refused_on_its_field(client, catalog):
    client.force_login(staff("padmin", ROLE_PLATFORM_ADMIN))
    client.cookies[settings.LANGUAGE_COOKIE_NAME] = "en"
    when = timezone.localtime() - timedelta(days=3)
    response = client.post(
        "/admin/billing/price/add/",
        {"gpu_model": catalog[1].pk, "share": "whole", "per_gpu_hour": "15.75",
         "effective_from_0": when.strftime("%Y-%m-%d"), "effective_from_1": when.strftime("%H:%M:%S")},
    )  # fmt: skip
    assert response.status_code == 200
    assert "the past is never re-priced" in response.content.decode()
    assert not Price.objects.exists()


def test_a_price_in_force_is_kept_and_a_future_one_may_be_withdrawn(client, prices):
    client.force_login(staff("padmin", ROLE_PLATFORM_ADMIN))
    past, current, future = prices
    page = client.get(f"/admin/billing/price/{current.pk}/change/")
    assert page.status_code == 200 and 'name="_save"' not in page.content.decode()
    assert client.post(f"/admin/billing/price/{current.pk}/change/", {"per_gpu_hour": "1"}).status_code == 403
    assert client.post(f"/admin/billing/price/{past.pk}/delete/", {"post": "yes"}).status_code == 403
    assert client.post(f"/admin/billing/price/{future.pk}/delete/", {"post": "yes"}).status_code == 302
    assert list(Price.objects.order_by("id")) == [past, current]
    assert AuditEvent.objects.filter(action="price.withdraw").count() == 1


def test_a_quota_approver_reads_the_price_list_in_the_console_and_changes_nothing(client, prices, catalog):
    client.force_login(staff("quinn", ROLE_QUOTA_APPROVER))
    assert client.get("/admin/billing/price/").status_code == 200
    assert client.get("/admin/billing/price/add/").status_code == 403
    assert client.post(f"/admin/billing/price/{prices[2].pk}/delete/", {"post": "yes"}).status_code == 403
    assert Price.objects.count() == 3
