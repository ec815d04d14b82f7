"""manage.py demo_data: the logins `make run` prints."""

import json

import pytest
from django.contrib.auth import authenticate, get_user_model
from django.core.management import call_command

from billing.models import Budget, Price
from clusters.models import GpuModel
from portal.core.staff import can_decide_quota, is_platform_admin, sees_all_tenants, staff_roles_of
from tenants.models import Membership, QuotaGrant, QuotaRequest, Role


@pytest.mark.django_db
def test_demo_data_is_idempotent_and_its_logins_work(tmp_path, capsys, settings):
    settings.VAR_DIR = tmp_path
    call_command("demo_data")
    first = capsys.readouterr().out
    call_command("demo_data")
    assert capsys.readouterr().out == first
    logins = json.loads((tmp_path / "demo-logins.txt").read_text())
    assert set(logins) == {"admin", "quinn", "sam", "alice", "bob", "carol", "dave", "erin"}
    assert get_user_model().objects.count() == 8
    admin = authenticate(username="admin", password=logins["admin"])
    assert is_platform_admin(admin)
    quinn, sam = (authenticate(username=name, password=logins[name]) for name in ("quinn", "sam"))
    assert staff_roles_of(quinn) == ["Quota approver"] and can_decide_quota(quinn)
    assert not is_platform_admin(quinn)
    assert staff_roles_of(sam) == ["Read-only support"] and sees_all_tenants(sam)
    assert not can_decide_quota(sam)
    assert authenticate(username="dave", password=logins["dave"]) is not None
    roles = set(Membership.objects.filter(tenant__slug="protein-lab").values_list("role", flat=True))
    assert roles == set(Role.values)
    assert logins["carol"] in first
    assert QuotaGrant.objects.filter(tenant__slug="protein-lab").count() == 1
    assert QuotaRequest.objects.filter(tenant__slug="cfd-group", state="pending").count() == 1
    # Every model has a price in force (billing's demo_prices), and protein-lab a monthly budget.
    assert set(Price.objects.values_list("gpu_model_id", flat=True)) == set(
        GpuModel.objects.values_list("pk", flat=True)
    )
    assert Budget.objects.get().tenant.slug == "protein-lab"
