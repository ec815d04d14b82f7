"""The live parts of two forms: the submit form's check as one types (field errors, and a preview
of what would run, built by job_preview with job_submit's rules and nothing written), and the
sizing advisor on the quota page (the API's serializer and advisor, shown inline)."""

import re
from decimal import Decimal

import pytest

from jobs.models import Job
from tenants.models import QuotaGrant

CHECK = "/t/protein-lab/jobs/new/check/"
ADVISE = "/t/protein-lab/quota/advise/"
HTMX = {"HTTP_HX_REQUEST": "true"}


def body(**overrides) -> dict:
    return {
        "scenario": "ai-training", "gpu_model": "h100-80gb", "gpus": "2", "nodes": "1", "walltime_minutes": "5",
        "name": "hello", "priority": "", "template": "", "script": "#!/bin/bash\necho hi\n",
        "env": "FOO=bar\n",
    } | overrides  # fmt: skip


def errors_of(page: str, field: str) -> list[str]:
    """The error texts of the field's out-of-band error box in a check answer."""
    box = re.search(rf'<div class="field-errors" id="id_{field}-errors"[^>]*>(.*?)</div>', page, re.S)
    assert box, f"no error box for {field}"
    return re.findall(r'<p class="error field-error"[^>]*>(.*?)</p>', box.group(1), re.S)


def test_the_check_previews_what_would_run_and_writes_nothing(web, member, grant, local_partition):
    response = web(member).post(CHECK, body(), **HTMX)
    page = response.content.decode()
    assert response.status_code == 200
    assert 'id="job-preview"' in page and 'id="preview-script"' in page
    assert "Local / local" in page
    assert "2 × H100" in page and "on 1 node" in page
    assert "1 CPUs, 1000 MB" in page  # capped by the partition's limits
    assert "0.17 of the 100" in page  # 2 GPUs × 5 min, rounded up to the hundredth
    assert "FOO=bar" in page and "#!/bin/bash\necho hi" in page
    assert errors_of(page, "gpus") == [] and errors_of(page, "name") == []
    assert Job.objects.count() == 0
    grant.refresh_from_db()
    assert grant.gpu_hours_reserved == 0


def test_a_template_previews_its_rendered_script(web, member, grant, local_partition):
    page = web(member).post(CHECK, body(script="", template="python", param_script="train.py")).content
    assert b"train.py" in page and b'id="preview-script"' in page


def test_fields_filled_in_wrongly_show_their_errors_and_empty_ones_do_not_yet(
    web, member, grant, local_partition
):
    page = web(member).post(CHECK, body(gpus="0", name="", walltime_minutes="abc"), **HTMX).content.decode()
    assert errors_of(page, "gpus") == ["Ensure this value is greater than or equal to 1."]
    assert errors_of(page, "walltime_minutes") == ["Enter a whole number."]
    assert errors_of(page, "name") == []  # required, but not typed yet
    assert 'id="preview-hint"' in page and 'id="preview-script"' not in page


@pytest.mark.parametrize(
    ("change", "field", "message"),
    [
        ({"gpus": "3", "nodes": "2"}, "gpus", "3 GPUs do not divide evenly over 2 nodes."),
        ({"walltime_minutes": "61"}, "walltime_minutes", "At most 60 minutes on local/local."),
        ({"env": "SLURM_JOB_ID=1"}, "env", "SLURM_JOB_ID is set by the portal or the scheduler."),
        ({"script": "echo no shebang"}, "script", "A batch script starts with #!"),
    ],
)
def test_the_services_rules_are_named_at_their_field(
    web, member, grant, local_partition, change, field, message
):
    page = web(member).post(CHECK, body(**change), **HTMX).content.decode()
    assert any(message in error for error in errors_of(page, field)), errors_of(page, field)
    assert 'id="preview-script"' not in page


def test_quota_the_submission_would_exceed_is_said_before_submitting(web, member, grant, local_partition):
    page = web(member).post(CHECK, body(gpus="8", nodes="1"), **HTMX).content.decode()
    assert errors_of(page, "gpus") == ["local/local has 4 GPUs per node."]
    QuotaGrant.objects.filter(pk=grant.pk).update(gpu_hours_used=Decimal("99.9"))
    page = web(member).post(CHECK, body(walltime_minutes="60"), **HTMX).content.decode()
    assert 'id="preview-problem"' in page
    assert "quota grant is used up" in page and "2.00 GPU-hours asked, 0.1000 left on the grant." in page


def test_a_viewer_cannot_check_and_another_tenant_is_404(web, viewer, outsider, grant, local_partition):
    assert web(viewer).post(CHECK, body()).status_code == 403
    assert web(outsider).post(CHECK, body()).status_code == 404


def test_the_submit_page_asks_for_the_check_as_one_types(web, member, grant, local_partition):
    page = web(member).get("/t/protein-lab/jobs/new/?scenario=ai-training").content.decode()
    assert f'hx-post="{CHECK}"' in page and 'hx-trigger="load, input delay:400ms, change"' in page
    assert 'id="preview-hint"' in page and 'id="id_gpus-errors"' in page


# --- The sizing advisor on the quota page


def test_the_advisor_sizes_on_each_ranked_model_as_the_api_does(web, client_for, manager, tenant, catalog):
    query = {"scenario": "ai-training", "params_b": "7", "target_days": "2"}
    page = web(manager).get(ADVISE, query).content.decode()
    api = client_for(manager).post(
        "/api/v1/scenarios/ai-training/advise/", {"params_b": 7, "target_days": 2}, format="json"
    )
    assert api.status_code == 200
    options = api.json()["options"]
    assert options
    for option in options:
        row = re.search(rf'data-fill-request data-gpu-model="{option["gpu_model"]}" data-gpus="(\d+)"', page)
        assert row and int(row.group(1)) == option["gpus"]
        assert f'data-gpu-hours="{option["gpu_hours"]:.2f}"' in page
    assert "Assumptions" in page


def test_the_quota_page_sizes_without_javascript_too(web, manager, tenant, catalog):
    page = (
        web(manager)
        .get("/t/protein-lab/quota/", {"scenario": "ai-training", "params_b": "7"})
        .content.decode()
    )
    assert 'id="advice-options"' in page and 'value="7"' in page
    assert 'hx-get="/t/protein-lab/quota/advise/"' in page


def test_the_advisor_names_what_is_missing_and_what_is_wrong(web, manager, tenant, catalog):
    page = web(manager).get(ADVISE, {"scenario": "ai-training"}).content.decode()
    assert "Fill in to see the advice: Model parameters (billions)" in page
    page = web(manager).get(ADVISE, {"scenario": "ai-training", "params_b": "-1"}).content.decode()
    assert "Model parameters (billions): Ensure this value is greater than or equal to 0.001." in page
    assert 'id="advice-options"' not in page


def test_the_md_advisor_takes_its_own_inputs(web, manager, tenant, catalog):
    query = {"scenario": "molecular-dynamics", "atoms": "100000", "ns_per_day": "100", "days": "10"}
    page = web(manager).get(ADVISE, query).content.decode()
    assert 'id="advice-options"' in page and "data-fill-request" in page


def test_the_advisor_of_an_unknown_scenario_or_another_tenant_is_404(web, manager, outsider, tenant, catalog):
    assert web(manager).get(ADVISE, {"scenario": "nope", "params_b": "7"}).status_code == 404
    assert web(outsider).get(ADVISE, {"scenario": "ai-training", "params_b": "7"}).status_code == 404
