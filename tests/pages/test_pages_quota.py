"""The quota page /t/<slug>/quota/: grants, requests with states and notes, request and withdraw."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone
from django.utils.html import escape

from tenants.models import QuotaRequest, RequestState
from tests.factories import QuotaGrantFactory, QuotaRequestFactory

TODAY = timezone.localdate()
URL = "/t/protein-lab/quota/"


def body(**overrides) -> dict:
    return {
        "scenario": "ai-training", "gpu_model": "h100-80gb", "gpus": "8", "gpu_hours": "1000",
        "starts_on": TODAY.isoformat(), "ends_on": (TODAY + timedelta(days=30)).isoformat(),
        "justification": "Training a protein language model.",
    } | overrides  # fmt: skip


def make_request(tenant, catalog, **fields) -> QuotaRequest:
    return QuotaRequestFactory(
        tenant=tenant, pair=catalog, gpus=4, gpu_hours=100, days=10, justification="x", **fields
    )


def test_the_page_shows_grants_requests_with_notes_and_the_scenarios_ranking(web, manager, tenant, catalog):
    QuotaGrantFactory(tenant=tenant, pair=catalog)
    make_request(tenant, catalog, state=RequestState.REJECTED, decision_note="Ask for fewer hours.")
    pending = make_request(tenant, catalog)
    page = web(manager).get(f"{URL}?scenario=ai-training").content.decode()
    assert 'id="grant-rows"' in page and catalog[1].name in page
    assert "Ask for fewer hours." in page and "Rejected" in page and "Pending" in page
    assert f"/quota/{pending.pk}/withdraw/" in page
    ranking = catalog[0].ranking.get(gpu_model=catalog[1])
    assert escape(ranking.reason) in page and 'id="request-quota"' in page


def test_a_manager_requests_quota_through_the_service(web, manager, tenant, catalog):
    response = web(manager).post(URL, body())
    assert response.status_code == 302 and response["Location"] == URL
    request = QuotaRequest.objects.get()
    assert (request.tenant, request.gpus, request.gpu_hours, request.state) == (
        tenant, 8, Decimal(1000), RequestState.PENDING,
    )  # fmt: skip
    assert request.requested_by == manager
    assert f"Quota request {request.pk} sent." in web(manager).get(URL).content.decode()


def test_errors_are_named_next_to_their_fields(web, owner, catalog):
    response = web(owner).post(URL, body(gpus="0", justification="", gpu_model="nope"))
    assert response.status_code == 400
    assert set(response.context["form"].errors) >= {"gpus", "justification", "gpu_model"}
    response = web(owner).post(URL, body(ends_on=(TODAY - timedelta(days=1)).isoformat()))
    assert response.status_code == 400
    assert "Must not be before starts_on." in response.context["form"].errors["ends_on"]
    assert not QuotaRequest.objects.exists()


def test_withdraw_a_pending_request_and_a_conflict_on_a_decided_one(web, owner, tenant, catalog):
    pending = make_request(tenant, catalog)
    client = web(owner)
    response = client.post(f"{URL}{pending.pk}/withdraw/", follow=True)
    pending.refresh_from_db()
    assert pending.state == RequestState.WITHDRAWN
    assert f"Quota request {pending.pk} withdrawn." in response.content.decode()
    response = client.post(f"{URL}{pending.pk}/withdraw/", follow=True)
    assert "This cannot be done in the object&#x27;s current state." in response.content.decode()


@pytest.mark.parametrize("persona", ["viewer", "member"])
def test_viewers_and_members_see_no_controls_and_their_posts_are_refused(
    request, web, persona, tenant, catalog
):
    pending = make_request(tenant, catalog)
    client = web(request.getfixturevalue(persona))
    page = client.get(URL).content.decode()
    assert 'id="request-quota"' not in page and "/withdraw/" not in page
    assert client.post(URL, body()).status_code == 403
    assert client.post(f"{URL}{pending.pk}/withdraw/").status_code == 403
    pending.refresh_from_db()
    assert pending.state == RequestState.PENDING and QuotaRequest.objects.count() == 1


def test_another_tenants_page_and_requests_are_404(web, outsider, tenant, catalog):
    pending = make_request(tenant, catalog)
    client = web(outsider)
    assert client.get(URL).status_code == 404
    assert client.post(URL, body()).status_code == 404
    assert client.post(f"{URL}{pending.pk}/withdraw/").status_code == 404
