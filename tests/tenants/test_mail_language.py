"""Quota mail goes out in the site's mail language (MAIL_LANGUAGE), whatever language the
request or the task that triggers it has active, and every line of it is translated."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.core import mail
from django.utils import timezone, translation

from tenants import services
from tenants.models import QuotaRequest

TODAY = timezone.localdate()


@pytest.fixture
def quota_request(owner, catalog):
    return QuotaRequest.objects.create(
        tenant=owner.memberships.get().tenant,
        requested_by=owner, scenario=catalog[0], gpu_model=catalog[1], gpus=4, gpu_hours=Decimal(100),
        starts_on=TODAY, ends_on=TODAY + timedelta(days=30), justification="Protein LM.",
    )  # fmt: skip


def decide(admin_user, quota_request, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        services.quota_request_approve(actor=admin_user, request=quota_request, note="Go.", gpus=2)
    return mail.outbox[-1]


def test_mail_is_in_english_even_when_the_request_was_in_chinese(
    admin_user, owner, quota_request, django_capture_on_commit_callbacks
):
    with translation.override("zh-hans"):
        message = decide(admin_user, quota_request, django_capture_on_commit_callbacks)
    assert message.subject == f"[GPU portal] Quota request #{quota_request.pk} partially approved"
    assert message.body.startswith(
        f"Your quota request #{quota_request.pk} for Protein Lab was partially approved by admin."
    )
    assert (
        "Granted:   2× H100-80GB, 100" in message.body and "Note from the platform team:\nGo." in message.body
    )


def test_mail_language_chinese_translates_every_line(
    settings, admin_user, owner, quota_request, django_capture_on_commit_callbacks
):
    settings.MAIL_LANGUAGE = "zh-hans"
    message = decide(admin_user, quota_request, django_capture_on_commit_callbacks)
    assert message.subject.startswith("[GPU 门户]")
    for line in filter(None, message.body.splitlines()):
        if line in ("Go.",) or line.startswith("http"):
            continue  # the admin's own note and the link
        assert any("\u4e00" <= char <= "\u9fff" for char in line), line


def test_the_admins_mail_links_to_the_decision_page(
    settings, admin_user, owner, catalog, django_capture_on_commit_callbacks
):
    settings.MAIL_LANGUAGE = "zh-hans"
    with django_capture_on_commit_callbacks(execute=True):
        created = services.quota_request_create(
            actor=owner, tenant=owner.memberships.get().tenant, scenario=catalog[0], gpu_model=catalog[1],
            gpus=4, gpu_hours=Decimal(100), starts_on=TODAY, ends_on=TODAY + timedelta(days=30),
            justification="Protein LM.",
        )  # fmt: skip
    message = mail.outbox[-1]
    assert message.to == [admin_user.email]
    assert f"/admin/tenants/quotarequest/{created.pk}/decide/" in message.body
    assert "场景：" in message.body and "Protein LM." in message.body
