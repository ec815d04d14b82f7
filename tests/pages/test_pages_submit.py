"""The submit page /t/<slug>/jobs/new/: a form by scenario that calls jobs.services.job_submit."""

from datetime import timedelta

import pytest
from django.utils import timezone

from clusters.models import GpuModel
from jobs.models import Job, JobState
from tests.factories import QuotaGrantFactory

TODAY = timezone.localdate()
URL = "/t/protein-lab/jobs/new/"


def body(**overrides) -> dict:
    return {
        "scenario": "ai-training", "gpu_model": "h100-80gb", "gpus": "2", "nodes": "1", "walltime_minutes": "5",
        "name": "hello", "priority": "", "template": "", "script": "#!/bin/bash\necho hi\n",
        "env": "FOO=bar\nEMPTY=\n",
    } | overrides  # fmt: skip


def test_the_form_offers_only_the_gpu_models_of_the_tenants_active_grants(
    web, member, grant, local_partition
):
    other = GpuModel.objects.exclude(pk=grant.gpu_model_id).first()
    QuotaGrantFactory(  # expired: not offered
        tenant=grant.tenant, scenario=grant.scenario, gpu_model=other, gpus=4, gpu_hours=10,
        starts_on=TODAY - timedelta(days=30), ends_on=TODAY - timedelta(days=1),
    )  # fmt: skip
    page = web(member).get(f"{URL}?scenario=ai-training").content.decode()
    assert 'value="h100-80gb"' in page
    assert f'value="{other.slug}"' not in page
    assert 'value="python"' in page  # the scenario's templates
    assert "Submit a job" in page and 'id="submit-job"' in page


def test_a_member_submits_and_lands_on_the_job_page(web, member, grant, local_partition):
    client = web(member)
    response = client.post(URL, body())
    job = Job.objects.get()
    assert response.status_code == 302
    assert response["Location"] == f"/t/protein-lab/jobs/{job.pk}/"
    assert (job.name, job.gpus, job.state, job.submitted_by) == ("hello", 2, JobState.QUEUED, member)
    assert job.env.items() >= {"FOO": "bar", "EMPTY": ""}.items()
    assert job.grant == grant
    page = client.get(response["Location"]).content.decode()
    assert f"Job {job.pk} submitted." in page


def test_a_template_with_parameters_renders_the_script(web, member, grant, local_partition):
    response = web(member).post(URL, body(script="", template="python", param_script="train.py"))
    assert response.status_code == 302
    assert "train.py" in Job.objects.get().script


def test_form_errors_are_named_next_to_their_fields(web, member, grant, local_partition):
    response = web(member).post(
        URL, body(gpus="0", name="", env="NOT A LINE", script="", template="torchrun", param_max_restarts="x")
    )
    assert response.status_code == 400
    form = response.context["form"]
    assert set(form.errors) >= {"gpus", "name", "env", "param_max_restarts", "param_script"}
    page = response.content.decode()
    assert "Line 1 is not NAME=value." in page and 'class="error field-error"' in page
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    ("overrides", "field", "text"),
    [
        ({"gpus": "3", "nodes": "2"}, "gpus", "do not divide evenly"),
        ({"walltime_minutes": "600"}, "walltime_minutes", "At most 60 minutes"),
        ({"env": "PATH=/x"}, "env", "set by the portal"),
        ({"script": "echo no shebang"}, "script", "starts with #!"),
        (
            {"script": "", "template": "python", "param_script": "../up.py"},
            "param_script",
            "working directory",
        ),
    ],
)
def test_the_services_errors_show_next_to_their_field(
    web, member, grant, local_partition, overrides, field, text
):
    response = web(member).post(URL, body(**overrides))
    assert response.status_code == 400
    errors = response.context["form"].errors
    assert field in errors, errors
    assert text in " ".join(errors[field])
    assert not Job.objects.exists()


def test_no_grant_is_a_clear_message(web, member, catalog, local_partition):
    response = web(member).post(URL, body())
    assert response.status_code == 400
    # No grant: no GPU model to choose, so the form says so for the field.
    assert "gpu_model" in response.context["form"].errors
    assert "no active quota grant" in web(member).get(URL).content.decode()


def test_a_quota_error_of_the_service_is_shown_with_its_detail(web, member, grant, local_partition):
    grant.gpus = 1
    grant.save()
    response = web(member).post(URL, body(gpus="2"))
    assert response.status_code == 400
    page = response.content.decode()
    assert "used up" in page and "at most 1 at once" in page


def test_a_viewer_sees_no_form_and_a_hand_made_post_is_refused(web, viewer, grant, local_partition):
    client = web(viewer)
    page = client.get(URL).content.decode()
    assert 'id="submit-job"' not in page and "not submit" in page
    assert f'href="{URL}"' not in client.get("/t/protein-lab/").content.decode()
    assert client.post(URL, body()).status_code == 403
    assert not Job.objects.exists()


def test_another_tenants_page_is_404(web, outsider, grant, local_partition):
    client = web(outsider)
    assert client.get(URL).status_code == 404
    assert client.post(URL, body()).status_code == 404


# --- In a real browser


@pytest.mark.django_db(transaction=True)
def test_a_member_submits_in_chromium_and_lands_on_the_job_page(
    live_server, member, owner, grant, local_partition
):
    """Headless Chromium fills the form for the local cluster; no worker runs, so the job waits QUEUED."""
    import os

    from playwright.sync_api import expect

    from tests.browser import browser_page, log_in, screenshot

    os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    base = live_server.url
    with browser_page() as page:
        log_in(page, base, "member")
        page.get_by_role("link", name="Submit a job").click()
        expect(page.get_by_role("heading", level=1)).to_have_text("Submit a job")
        page.get_by_label("Name", exact=True).fill("browser-job")
        page.get_by_label("GPU model").select_option("h100-80gb")
        page.get_by_label("GPUs", exact=True).fill("1")
        page.get_by_label("Walltime (minutes)").fill("5")
        page.get_by_label("Batch script").fill("#!/bin/bash\necho hi\n")
        page.get_by_label("Environment (NAME=value, one per line)").fill("FOO=bar")
        screenshot(page, "job-new")
        page.get_by_role("button", name="Submit job").click()
        page.wait_for_url(f"{base}/t/protein-lab/jobs/*/")
        expect(page.locator("#job-state")).to_have_attribute("data-state", "QUEUED")
        expect(page.get_by_role("status").first).to_contain_text("submitted")
        expect(page.locator("main")).to_contain_text("browser-job")
        screenshot(page, "job-submitted")
        page.get_by_role("link", name="Quota").click()
        expect(page.get_by_role("heading", level=1)).to_have_text("Quota")
        screenshot(page, "quota")
        page.get_by_role("link", name="Team", exact=True).click()
        expect(page.locator("#member-rows tr")).to_have_count(2)
        screenshot(page, "team")
    job = Job.objects.get()
    assert (job.name, job.state, job.submitted_by_id) == ("browser-job", JobState.QUEUED, member.pk)
