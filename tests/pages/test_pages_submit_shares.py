"""The submit page's shares of a GPU and a template's parameters: the form offers only the shares
the tenant's grants hold and the partition offers (whole, MIG profiles, slices, shards), says what
a shard lacks, asks for a template's parameters as typed fields from its JSON Schema, and shows
the service's refusals next to their fields; the job pages and the quota page show the unit."""

import re
from decimal import Decimal

import pytest
from django.utils import translation
from playwright.sync_api import expect

from clusters.models import ClusterKind, Partition
from clusters.shares import SHARD_WARNING, ShareKind
from jobs.forms import parameter_fields
from jobs.job_templates import JobTemplate
from jobs.models import Job
from tests.browser import browser_page, log_in, outside_the_browser, screenshot
from tests.factories import ClusterFactory, JobFactory, PartitionFactory, QuotaGrantFactory, catalog_pair

URL = "/t/protein-lab/jobs/new/"
CHECK = "/t/protein-lab/jobs/new/check/"
HTMX = {"HTTP_HX_REQUEST": "true"}
MIG_LABEL = "3g.40gb: 40 GB, 3/7 of the compute"


def body(**overrides) -> dict:
    return {
        "scenario": "ai-training", "gpu_model": "h100-80gb", "gpus": "2", "nodes": "1", "walltime_minutes": "30",
        "name": "shared", "priority": "", "partition": "", "share": "whole", "template": "",
        "script": "#!/bin/bash\necho hi\n", "env": "",
    } | overrides  # fmt: skip


def options(page: str, field: str) -> list[str]:
    """The values of a select's options in a page."""
    select = re.search(rf'<select name="{field}"[^>]*>(.*?)</select>', page, re.S)
    assert select, f"no select {field}"
    return re.findall(r'<option value="([^"]*)"', select.group(1))


def english(text) -> str:
    with translation.override("en"):
        return str(text)


def errors_of(page: str, field: str) -> list[str]:
    box = re.search(rf'<div class="field-errors" id="id_{field}-errors"[^>]*>(.*?)</div>', page, re.S)
    assert box, f"no error box for {field}"
    return re.findall(r'<p class="error field-error"[^>]*>(.*?)</p>', box.group(1), re.S)


@pytest.fixture
def mig_grant(tenant, catalog):
    """Beside the whole-GPU `grant`: 4 MIG 3g.40gb instances at once and 50 GPU-hours."""
    return QuotaGrantFactory(
        tenant=tenant, pair=catalog, share=ShareKind.MIG, mig_profile="3g.40gb", gpus=4, gpu_hours=50
    )


@pytest.fixture
def offering(local_partition):
    """The local partition offering whole devices, MIG instances of two profiles, and slices."""
    Partition.objects.filter(pk=local_partition.pk).update(
        share_kinds=["whole", "mig", "slice"], mig_profiles=["3g.40gb", "1g.10gb"]
    )
    local_partition.refresh_from_db()
    return local_partition


@pytest.fixture
def sharded(catalog):
    """A Slurm partition "hpc/gpu" of the same model offering whole devices and 4 shards each."""
    cluster = ClusterFactory(slug="hpc", kind=ClusterKind.SLURM)
    return PartitionFactory(
        cluster=cluster, name="gpu", gpu_model=catalog[1], gpus_per_node=4, max_walltime_minutes=60,
        share_kinds=["whole", "shard"], shards_per_gpu=4,
    )  # fmt: skip


# --- The shares offered


def test_the_form_offers_the_granted_shares_that_a_partition_offers(
    web, member, grant, mig_grant, offering, sharded
):
    page = web(member).get(f"{URL}?scenario=ai-training").content.decode()
    # Slices the partition offers and shards the Slurm one offers: no grant holds them.
    assert options(page, "share") == ["whole", "mig"]
    assert options(page, "partition") == ["", "hpc/gpu", "local/local"]
    assert 'name="mig_profile"' not in page  # whole is chosen: no profile to ask for
    page = (
        web(member).post(CHECK, body(share="mig", share_context="h100-80gb||whole"), **HTMX).content.decode()
    )
    assert '<fieldset id="share-fields" hx-swap-oob="true">' in page
    assert options(page, "mig_profile") == ["3g.40gb"]  # 1g.10gb is offered but not granted
    assert MIG_LABEL in page
    # The Slurm partition has no MIG: chosen, it offers whole devices alone.
    on_slurm = body(partition="hpc/gpu", share="mig", share_context="h100-80gb|local/local|mig")
    page = web(member).post(CHECK, on_slurm, **HTMX).content.decode()
    assert options(page, "share") == ["whole"] and 'name="mig_profile"' not in page


def test_the_chosen_partition_narrows_the_shares(
    web, member, grant, sharded, tenant, catalog, local_partition
):
    QuotaGrantFactory(tenant=tenant, pair=catalog, share=ShareKind.SHARD)
    page = web(member).get(f"{URL}?scenario=ai-training").content.decode()
    assert options(page, "partition") == ["", "hpc/gpu", "local/local"]
    assert options(page, "share") == ["whole", "shard"]
    # On the local partition, which has no shards, the shard chosen before gives way to whole.
    change = body(partition="local/local", share="shard", share_context="h100-80gb||shard")
    page = web(member).post(CHECK, change, **HTMX).content.decode()
    assert options(page, "share") == ["whole"]
    assert '<option value="whole" selected>' in page
    assert 'id="shard-warning"' not in page
    assert re.search(r'id="preview-share">\s*whole GPU\s*<', page)


def test_a_shard_says_that_it_shares_a_device_without_isolation(web, member, grant, sharded, tenant, catalog):
    QuotaGrantFactory(tenant=tenant, pair=catalog, share=ShareKind.SHARD)
    page = web(member).post(CHECK, body(share="shard", share_context="h100-80gb||whole"), **HTMX)
    page = page.content.decode()
    assert 'id="shard-warning"' in page and english(SHARD_WARNING).replace("'", "&#x27;") in page
    assert "Hpc / gpu" in page  # the preview's partition: the one that has shards
    assert "0.25 of a device per unit; device-equivalents in all: 0.5" in page


def test_the_check_renders_the_share_fields_again_only_when_what_they_show_changes(
    web, member, grant, mig_grant, offering
):
    same = body(share="mig", mig_profile="3g.40gb", share_context="h100-80gb||mig")
    page = web(member).post(CHECK, same, **HTMX).content.decode()
    assert 'id="share-fields"' not in page  # typing elsewhere leaves the fields as they are
    assert errors_of(page, "mig_profile") == []
    assert 'id="id_gpu_memory_mib-errors"' not in page  # not shown for a MIG share


def test_the_preview_shows_the_device_fraction_and_device_equivalent_gpu_hours(
    web, member, grant, mig_grant, offering
):
    check = body(
        share="mig", mig_profile="3g.40gb", partition="local/local", share_context="h100-80gb|local/local|mig",
        gpus="1",
    )  # fmt: skip
    page = web(member).post(CHECK, check, **HTMX).content.decode()
    assert re.search(r'id="preview-share">\s*MIG 3g.40gb\s*<', page)
    assert "0.5 of a device per unit; device-equivalents in all: 0.5<" in page
    # 1 instance (one per node) × 0.5 × 30 minutes, from the MIG grant's 50 hours
    assert "0.25 of the 50.00 left on the grant" in page


# --- Submitting a share


def test_a_mig_job_is_submitted_in_its_unit_on_its_grant(web, member, grant, mig_grant, offering):
    response = web(member).post(
        URL, body(share="mig", mig_profile="3g.40gb", partition="local/local", gpus="1")
    )
    assert response.status_code == 302, response.context["form"].errors
    job = Job.objects.get()
    assert (job.share, job.mig_profile, job.device_fraction, job.grant) == (
        "mig",
        "3g.40gb",
        Decimal("0.5"),
        mig_grant,
    )
    assert job.reserved_gpu_hours == Decimal("0.25")
    assert (job.gpu_memory_mib, job.gpu_cores_pct) == (0, 0)


def test_a_slice_job_carries_its_caps(web, member, tenant, catalog, offering):
    QuotaGrantFactory(tenant=tenant, pair=catalog, share=ShareKind.SLICE)
    response = web(member).post(
        URL, body(share="slice", gpus="1", gpu_memory_mib="20480", gpu_cores_pct="30")
    )
    assert response.status_code == 302, response.context["form"].errors
    job = Job.objects.get()
    assert (job.share, job.gpu_memory_mib, job.gpu_cores_pct, job.mig_profile) == ("slice", 20480, 30, "")
    assert job.device_fraction == Decimal("0.3")  # max(20480 / 81920 MiB, 30 %)


def test_the_fields_of_another_share_are_dropped(web, member, grant, mig_grant, offering):
    stale = body(share="whole", mig_profile="3g.40gb", gpu_memory_mib="1000", gpu_cores_pct="10")
    assert web(member).post(URL, stale).status_code == 302
    job = Job.objects.get()
    assert (job.share, job.mig_profile, job.gpu_memory_mib, job.gpu_cores_pct) == ("whole", "", 0, 0)
    assert job.grant == grant


@pytest.mark.parametrize(
    ("overrides", "field", "text"),
    [
        ({"share": "slice"}, "share", "Select a valid choice"),  # no grant holds slices
        ({"share": "mig", "mig_profile": ""}, "mig_profile", "Choose a MIG profile."),
        ({"share": "mig", "mig_profile": "1g.10gb"}, "mig_profile", "Select a valid choice"),
        (
            {"share": "mig", "mig_profile": "3g.40gb", "partition": "nowhere/x"},
            "partition",
            "Select a valid choice",
        ),
    ],
)
def test_the_form_refuses_what_no_grant_holds(
    web, member, grant, mig_grant, offering, overrides, field, text
):
    response = web(member).post(URL, body(**overrides))
    assert response.status_code == 400
    errors = response.context["form"].errors
    assert text in " ".join(errors.get(field, [])), errors
    assert not Job.objects.exists()


def test_a_share_the_partition_does_not_offer_is_the_services_error_on_the_share_field(
    web, member, grant, mig_grant, local_partition
):
    """The local partition offers whole devices only (a page shown before an admin changed it)."""
    response = web(member).post(URL, body(share="mig", mig_profile="3g.40gb", partition="local/local"))
    assert response.status_code == 400
    page = response.content.decode()
    assert errors_of(page, "share") == ["local/local offers: whole."]
    assert '<option value="mig" selected>' in page  # what was chosen stays, with why not
    assert not Job.objects.exists()


def test_a_slice_cap_beyond_the_device_is_named_at_its_field(web, member, tenant, catalog, offering):
    QuotaGrantFactory(tenant=tenant, pair=catalog, share=ShareKind.SLICE)
    response = web(member).post(URL, body(share="slice", gpus="1", gpu_memory_mib="90000", gpu_cores_pct=""))
    assert response.status_code == 400
    errors = response.context["form"].errors
    assert "less than or equal to 81920" in " ".join(errors["gpu_memory_mib"])
    assert errors["gpu_cores_pct"] == ["Give the compute percentage of each slice."]


# --- A template's parameters as fields


def md_grant(tenant):
    return QuotaGrantFactory(tenant=tenant, pair=catalog_pair("molecular-dynamics", "h100-80gb"))


def md_body(**overrides) -> dict:
    return body(scenario="molecular-dynamics", script="", **overrides)


def test_a_templates_parameters_are_fields_of_their_schema_type(web, member, tenant, local_partition):
    md_grant(tenant)
    page = web(member).post(CHECK, md_body(template="gromacs"), **HTMX).content.decode()
    assert '<div id="template-parameters" hx-swap-oob="true">' in page
    assert 'name="parameters"' not in page  # no JSON to type
    assert options(page, "param_nonbonded") == ["gpu", "cpu", "auto"]
    assert '<option value="gpu" selected>' in page  # the default
    assert re.search(r'<input type="checkbox" name="param_resume"[^>]*checked', page)
    assert re.search(r'<input type="number" name="param_nsteps"[^>]*min="-1" max="1000000000000"', page)
    assert re.search(r'<input type="text" name="param_deffnm" value="md"', page)
    assert "Continue from &lt;name&gt;.cpt when it exists (mdrun -cpi)." in page  # the description as help
    assert 'id="id_param_resume_helptext"' in page and 'aria-describedby="id_param_resume_helptext"' in page
    page = web(member).post(CHECK, md_body(template="lammps"), **HTMX).content.decode()
    assert re.search(r'for="id_param_input">Input script<span class="required-mark"', page)
    assert "NAME=value, one per line." in page  # the variables, a mapping of names to words


def test_a_template_picked_again_keeps_what_was_typed_into_a_parameter_of_the_same_name(
    web, member, grant, local_partition
):
    switch = body(
        script="", template="torchrun", parameters_for="python", param_script="train.py", param_venv=""
    )
    page = web(member).post(CHECK, switch, **HTMX).content.decode()
    assert re.search(r'name="param_script" value="train.py"', page)
    assert re.search(r'name="param_rdzv_port" value="29500"', page)
    same = switch | {"parameters_for": "torchrun"}
    assert 'id="template-parameters"' not in web(member).post(CHECK, same, **HTMX).content.decode()


def test_parameters_typed_into_fields_become_the_jobs_parameters(web, member, tenant, local_partition):
    md_grant(tenant)
    fields = {
        "param_input": "in.lj", "param_binary": "lmp", "param_accelerator": "kokkos",
        "param_variables": "steps=1000\n\nseed=42\n", "param_ranks_per_node": "",
    }  # fmt: skip
    response = web(member).post(URL, md_body(template="lammps", **fields))
    assert response.status_code == 302, response.context["form"].errors
    job = Job.objects.get()
    assert job.parameters == {
        "input": "in.lj", "binary": "lmp", "accelerator": "kokkos", "variables": {"steps": "1000", "seed": "42"}
    }  # fmt: skip
    assert "-var steps 1000" in job.script


def test_gromacs_booleans_and_choices_reach_the_job(web, member, tenant, local_partition):
    md_grant(tenant)
    fields = {"param_deffnm": "md", "param_maxwarn": "0", "param_nonbonded": "gpu", "param_pme": "cpu"}
    response = web(member).post(URL, md_body(template="gromacs", **fields))  # resume left unchecked
    assert response.status_code == 302, response.context["form"].errors
    assert Job.objects.get().parameters == {
        "deffnm": "md", "maxwarn": 0, "nonbonded": "gpu", "pme": "cpu", "resume": False
    }  # fmt: skip


@pytest.mark.parametrize(
    ("fields", "field", "text"),
    [
        ({"param_script": ""}, "param_script", "This field is required."),
        (
            {"param_script": "../up.py"},
            "param_script",
            "inside the job&#x27;s working directory",
        ),  # the service's
        (
            {"param_script": "t.py", "param_rdzv_port": "80"},
            "param_rdzv_port",
            "greater than or equal to 1024",
        ),
        (
            {"param_script": "t.py", "param_args": "--a\n--b\x01"},
            "param_args",
            "Item 2: Must be printable text",
        ),
    ],
)
def test_a_parameters_errors_show_next_to_its_field(web, member, grant, local_partition, fields, field, text):
    response = web(member).post(URL, body(script="", template="torchrun", **fields))
    assert response.status_code == 400
    page = response.content.decode()
    assert any(text in error for error in errors_of(page, field)), errors_of(page, field)
    assert not Job.objects.exists()


def test_a_mapping_line_without_a_name_is_refused_at_its_field(web, member, tenant, local_partition):
    md_grant(tenant)
    response = web(member).post(URL, md_body(template="lammps", param_input="in.lj", param_variables="=x"))
    assert response.context["form"].errors["param_variables"] == ["Line 1 is not NAME=value."]


def test_a_schema_the_form_cannot_render_as_fields_falls_back_to_json():
    schema = {
        "type": "object",
        "properties": {
            "grid": {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}},
            "sizes": {"type": "array", "items": {"type": "integer"}, "description": "Sizes."},
        },
        "required": ["grid"],
        "additionalProperties": False,
    }
    template = JobTemplate("t", "ai-training", "T", "A test.", schema, renderer=lambda values, shape: [])
    grid, sizes = parameter_fields(template)
    assert (grid.kind, grid.required, sizes.kind) == ("json", True, "list")
    assert grid.parse("[[1, 2], [3]]") == [[1, 2], [3]]
    assert sizes.parse("4\n\n8\n") == [4, 8]
    with translation.override("en"):
        assert str(grid.note()) == "JSON, as the template's schema describes it."


# --- The pages that show a share


def test_the_job_pages_and_the_quota_page_show_the_unit(web, member, tenant, catalog, local_partition):
    grant = QuotaGrantFactory(tenant=tenant, pair=catalog, share=ShareKind.SLICE, gpus=8, gpu_hours=100)
    job = JobFactory(
        grant=grant, partition=local_partition, submitted_by=member, share="slice", gpu_memory_mib=20000,
        gpu_cores_pct=30, device_fraction=Decimal("0.3"), gpus=2,
    )  # fmt: skip
    client = web(member)
    page = client.get(f"/t/protein-lab/jobs/{job.pk}/").content.decode()
    assert re.search(
        r'id="job-gpus">2 × H100-80GB <span class="share-unit">\(slice 20000 MiB / 30%\)</span>', page
    )
    assert "0.3 of a device per unit; device-equivalents in all: 0.6" in page
    assert "(slice 20000 MiB / 30%)" in client.get("/t/protein-lab/jobs/").content.decode()
    quota = client.get("/t/protein-lab/quota/").content.decode()
    assert '<td class="unit">slice</td>' in quota
    dashboard = client.get("/t/protein-lab/").content.decode()
    assert re.search(
        rf'<h3 id="grant-{grant.pk}">[^<]*<span class="muted">·</span> H100-80GB <span class="muted">·</span> slice</h3>',
        dashboard,
    )


def test_a_whole_gpu_job_shows_no_share(web, member, make_job):
    job = make_job(member)
    page = web(member).get(f"/t/protein-lab/jobs/{job.pk}/").content.decode()
    assert 'id="job-gpus">1 × H100-80GB</dd>' in page and 'id="job-fraction"' not in page


def test_the_share_fields_speak_chinese(client, member, grant, mig_grant, offering):
    client.force_login(member)
    with translation.override("en"):  # the requests leave Chinese active in this thread: not after
        client.post("/i18n/setlang/", {"language": "zh-hans", "next": URL})
        page = client.get(f"{URL}?scenario=ai-training").content.decode()
    for text in ("GPU 份额", "整卡", "MIG 实例", "任一分区"):
        assert text in page, text


# --- In a real browser


def _fill_basics(page, *, name: str, walltime: str = "30") -> None:
    page.get_by_label("Name", exact=True).fill(name)
    page.get_by_label("GPUs", exact=True).fill("2")
    page.get_by_label("Walltime (minutes)").fill(walltime)


def test_a_member_sees_exactly_the_granted_shares_and_submits_a_mig_job_in_chromium(
    live_server, member, grant, mig_grant, offering, sharded
):
    base = live_server.url
    with browser_page() as page:
        log_in(page, base, "member")
        page.goto(f"{base}{URL}?scenario=ai-training")
        share = page.get_by_label("Share of a GPU")
        expect(share.locator("option")).to_have_text(["Whole device", "MIG instance"])
        expect(page.get_by_label("Partition").locator("option")).to_have_text(
            ["Any partition", "Hpc / gpu", "Local / local"]
        )
        _fill_basics(page, name="mig-job")
        page.get_by_label("GPUs", exact=True).fill("1")  # a MIG job has one instance per node
        page.get_by_label("Batch script").fill("#!/bin/bash\nnvidia-smi -L\n")
        page.get_by_label("Partition").select_option("local/local")
        share.select_option("mig")
        expect(page.get_by_label("MIG profile").locator("option")).to_have_text([MIG_LABEL])
        expect(page.locator("#shard-warning")).to_have_count(0)
        expect(page.locator("#preview-share")).to_have_text("MIG 3g.40gb")
        expect(page.locator("#preview-fraction")).to_have_text(
            "0.5 of a device per unit; device-equivalents in all: 0.5"
        )
        expect(page.locator("#preview-gpu-hours")).to_have_text("0.25 of the 50.00 left on the grant")
        screenshot(page, "job-new-mig")
        page.get_by_role("button", name="Submit job").click()
        page.wait_for_url(f"{base}/t/protein-lab/jobs/*/")
        expect(page.locator("#job-gpus")).to_have_text("1 × H100-80GB (MIG 3g.40gb)")
        expect(page.locator("#job-fraction")).to_have_text(
            "0.5 of a device per unit; device-equivalents in all: 0.5"
        )
        page.goto(f"{base}/t/protein-lab/jobs/")
        expect(page.locator("#job-rows")).to_contain_text("(MIG 3g.40gb)")
        page.goto(f"{base}/t/protein-lab/quota/")
        units = page.locator("#grant-rows td.unit")
        expect(units.filter(has_text="MIG 3g.40gb")).to_have_count(1)
        expect(units.filter(has_text="whole GPU")).to_have_count(1)
        screenshot(page, "quota-units")
        job = outside_the_browser(lambda: Job.objects.get())
    assert (job.name, job.share, job.mig_profile, job.gpus) == ("mig-job", "mig", "3g.40gb", 1)
    assert (job.device_fraction, job.grant_id, job.partition_id) == (
        Decimal("0.5"),
        mig_grant.pk,
        offering.pk,
    )


def test_choosing_a_shard_shows_that_it_has_no_isolation_in_chromium(
    live_server, member, grant, sharded, local_partition, tenant, catalog
):
    QuotaGrantFactory(tenant=tenant, pair=catalog, share=ShareKind.SHARD)
    base = live_server.url
    with browser_page() as page:
        log_in(page, base, "member")
        page.goto(f"{base}{URL}?scenario=ai-training")
        _fill_basics(page, name="sharded")
        page.get_by_label("Batch script").fill("#!/bin/bash\necho hi\n")
        expect(page.locator("#shard-warning")).to_have_count(0)
        page.get_by_label("Share of a GPU").select_option("shard")
        expect(page.locator("#shard-warning")).to_have_text(english(SHARD_WARNING))
        expect(page.locator("#preview-fraction")).to_have_text(
            "0.25 of a device per unit; device-equivalents in all: 0.5"
        )
        expect(page.locator("#preview-resources")).to_contain_text("Hpc / gpu")
        screenshot(page, "job-new-shard")
        # The local partition has no shards: choosing it leaves whole devices, and no warning.
        page.get_by_label("Partition").select_option("local/local")
        expect(page.get_by_label("Share of a GPU").locator("option")).to_have_text(["Whole device"])
        expect(page.locator("#shard-warning")).to_have_count(0)
        expect(page.locator("#preview-resources")).to_contain_text("Local / local")


def test_a_templates_parameters_are_typed_fields_and_make_the_job_in_chromium(
    live_server, member, grant, local_partition
):
    base = live_server.url
    with browser_page() as page:
        log_in(page, base, "member")
        page.goto(f"{base}{URL}?scenario=ai-training")
        expect(page.locator("[name=parameters]")).to_have_count(0)
        _fill_basics(page, name="templated", walltime="5")
        page.get_by_label("GPUs", exact=True).fill("1")
        page.get_by_label("Template").select_option("python")
        page.get_by_label("Python script").fill("train.py")
        expect(page.get_by_label("Rendezvous port")).to_have_count(0)
        page.get_by_label("Template").select_option("torchrun")  # its fields, the script kept
        port = page.get_by_label("Rendezvous port")
        expect(port).to_have_value("29500")
        expect(port).to_have_attribute("type", "number")
        expect(port).to_have_attribute("min", "1024")
        expect(page.get_by_label("Python script")).to_have_value("train.py")
        expect(page.locator("label[for=id_param_script] .required-mark")).to_be_visible()
        expect(page.locator("#id_param_script_helptext")).to_have_text(
            "The training script; torchrun starts it once per GPU."
        )
        expect(page.locator("#id_param_args_helptext")).to_contain_text("One item per line.")
        port.fill("80")
        expect(page.locator("#id_param_rdzv_port-errors")).to_have_text(
            "Ensure this value is greater than or equal to 1024."
        )
        port.fill("29500")
        page.get_by_label("Python script").fill("../up.py")  # the template's own rule, said by the service
        expect(page.locator("#id_param_script-errors")).to_contain_text("inside the job's working directory")
        page.get_by_label("Python script").fill("train.py")
        page.get_by_label("Arguments").fill("--epochs=3\n--lr=0.1,0.2")
        page.get_by_label("Restarts").fill("2")
        expect(page.locator("#id_param_script-errors")).to_have_text("")
        expect(page.locator("#preview-script")).to_contain_text("--max_restarts=2")
        screenshot(page, "job-new-template")
        page.get_by_role("button", name="Submit job").click()
        page.wait_for_url(f"{base}/t/protein-lab/jobs/*/")
        job = outside_the_browser(lambda: Job.objects.get())
    assert (job.name, job.template) == ("templated", "torchrun")
    assert job.parameters == {
        "script": "train.py", "args": ["--epochs=3", "--lr=0.1,0.2"], "rdzv_port": 29500, "max_restarts": 2,
        "checkpoint_minutes": 15,
    }  # fmt: skip
    assert "train.py --epochs=3 --lr=0.1,0.2" in job.script


def test_a_checkbox_and_a_choice_of_gromacs_reach_the_job_in_chromium(
    live_server, member, tenant, local_partition
):
    md_grant(tenant)
    base = live_server.url
    with browser_page() as page:
        log_in(page, base, "member")
        page.goto(f"{base}{URL}?scenario=molecular-dynamics")
        _fill_basics(page, name="md-run", walltime="5")
        page.get_by_label("GPUs", exact=True).fill("1")
        page.get_by_label("Template").select_option("gromacs")
        resume = page.get_by_label("Resume from checkpoint")
        expect(resume).to_be_checked()
        expect(page.get_by_label("Non-bonded forces on")).to_have_value("gpu")
        expect(page.get_by_label("Non-bonded forces on").locator("option")).to_have_text(
            ["gpu", "cpu", "auto"]
        )
        resume.uncheck()
        page.get_by_label("PME on").select_option("cpu")
        page.get_by_label("Steps").fill("5000")
        expect(page.locator("#preview-script")).to_contain_text("-pme cpu")
        page.get_by_role("button", name="Submit job").click()
        page.wait_for_url(f"{base}/t/protein-lab/jobs/*/")
        job = outside_the_browser(lambda: Job.objects.get())
    assert job.parameters == {
        "deffnm": "md", "maxwarn": 0, "nonbonded": "gpu", "pme": "cpu", "nsteps": 5000, "resume": False,
        "checkpoint_minutes": 15,
    }  # fmt: skip


def test_a_share_the_partition_no_longer_offers_shows_the_error_on_the_share_field_in_chromium(
    live_server, member, grant, mig_grant, offering
):
    base = live_server.url
    with browser_page() as page:
        log_in(page, base, "member")
        page.goto(f"{base}{URL}?scenario=ai-training")
        _fill_basics(page, name="too-late")
        page.get_by_label("GPUs", exact=True).fill("1")
        page.get_by_label("Batch script").fill("#!/bin/bash\necho hi\n")
        page.get_by_label("Partition").select_option("local/local")
        page.get_by_label("Share of a GPU").select_option("mig")
        expect(page.locator("#preview-share")).to_have_text("MIG 3g.40gb")
        # Meanwhile an admin takes MIG off the partition.
        outside_the_browser(
            lambda: Partition.objects.filter(pk=offering.pk).update(share_kinds=["whole"], mig_profiles=[])
        )
        page.get_by_role("button", name="Submit job").click()
        expect(page.locator("#id_share-errors")).to_have_text("local/local offers: whole.")
        expect(page.get_by_label("Share of a GPU")).to_have_value("mig")
        screenshot(page, "job-new-share-refused")
        assert outside_the_browser(lambda: Job.objects.count()) == 0
