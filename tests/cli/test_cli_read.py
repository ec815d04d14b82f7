"""The reading commands against a real portal: each one's --json is what the API answers (the
lists with every page followed: the portal serves pages of 3 here), and each one's table shows
what the API says; another tenant's job is exit code 3 `not_found`."""

from datetime import timedelta
from decimal import Decimal

import httpx
import pytest
from django.utils import timezone

from tenants.models import Role
from tests.cli_support import api_all, api_get, rows_of
from tests.conftest import join
from tests.factories import JobFactory, QuotaGrantFactory, TenantFactory

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def jobs(make_job, member, manager, catalog):
    """Seven jobs of protein-lab, newest first as the API lists them: two finished yesterday with
    GPU-hours (one each of member's and manager's), one failed, running and queued ones."""
    yesterday = timezone.now() - timedelta(days=1)
    done = {"finished_at": yesterday, "started_at": yesterday - timedelta(hours=1), "exit_code": 0}
    made = [
        make_job(member, name="prep", state="COMPLETED", gpu_hours=Decimal("1.5"), **done),
        make_job(manager, name="eval", state="COMPLETED", gpu_hours=Decimal("0.25"), **done),
        make_job(member, name="broken", state="FAILED", gpu_hours=Decimal("0.1"), **done | {"exit_code": 3}),
        make_job(member, name="train", state="RUNNING", gpus=2),
        *[make_job(member, name=f"sweep-{i}") for i in range(3)],
    ]
    return [str(job.pk) for job in reversed(made)]


def test_ls_follows_the_pages_and_filters(member_cli, portal, jobs):
    token = member_cli.token
    assert member_cli.json("ls") == api_all(portal, token, "/jobs/") and len(jobs) == 7
    assert [j["id"] for j in member_cli.json("ls", "--limit", "5")] == jobs[:5]
    finished = member_cli.json("ls", "--state", "COMPLETED", "--state", "failed")
    assert finished == api_all(portal, token, "/jobs/", state=["COMPLETED", "FAILED"]) and len(finished) == 3
    assert (
        member_cli.json("ls", "--tenant", "protein-lab", "--scenario", "ai-training", "-n", "2")
        == (api_all(portal, token, "/jobs/", tenant="protein-lab", scenario="ai-training")[:2])
    )

    table = member_cli.run("ls")
    assert table.rc == 0
    head, *rows = rows_of(table.stdout)
    # one tenant in the list: no Tenant column
    assert head == ["ID", "Name", "State", "Reason", "GPUs", "Cluster", "Submitted", "by", "Created"]
    for row, job in zip(rows, api_all(portal, token, "/jobs/"), strict=True):
        assert row[:3] == [job["id"], job["name"], job["state"]], row
    assert "2× h100-80gb" in table.stdout
    assert member_cli.run("ls", "--state", "NOPE").rc == 2


def test_show_and_events_are_the_apis(member_cli, portal, jobs):
    job_id = jobs[3]  # "train", RUNNING
    detail = member_cli.json("show", job_id)
    assert detail == api_get(portal, member_cli.token, f"/jobs/{job_id}/")
    assert detail["script"] == "#!/bin/bash\n"  # the submitter's view
    table = member_cli.run("show", job_id, "--script").stdout
    for name, value in [("ID", job_id), ("Name", "train"), ("State", "RUNNING"), ("GPUs", "2"),
                        ("Cluster", "local"), ("Submitted by", "member")]:  # fmt: skip
        assert any(line.split() == [*name.split(), *value.split()] for line in table.splitlines()), (
            name,
            table,
        )
    assert table.rstrip().endswith("Script:\n#!/bin/bash")

    assert member_cli.json("events", job_id) == api_get(portal, member_cli.token, f"/jobs/{job_id}/events/")
    assert member_cli.run("events").rc == 2  # an ID, or --follow
    assert member_cli.run("show", "12a").rc == 2


def test_another_tenants_job_is_exit_3_not_found(member_cli, outsider, other_tenant, catalog):
    theirs = JobFactory(grant=QuotaGrantFactory(tenant=other_tenant, pair=catalog), submitted_by=outsider)
    for command in (["show"], ["events"], ["logs"], ["logs", "-f"], ["cancel"], ["events", "--follow"]):
        refused = member_cli.run(*command, str(theirs.pk))
        assert refused.rc == 3, (command, refused)
        assert refused.stderr.startswith("Error: not_found (HTTP 404)"), (command, refused)
    refused = member_cli.run("events", "--follow", "--tenant", "other-team")
    assert refused.rc == 3 and refused.stderr.startswith("Error: not_found (HTTP 404)")


def test_whoami_tenants_and_quota(member_cli, portal, member, grant, catalog):
    for index in range(4):  # five tenants in all: two pages of 3
        join(TenantFactory(slug=f"lab-{index}"), "member", Role.VIEWER)
    QuotaGrantFactory(
        tenant=grant.tenant, pair=catalog, starts_on=timezone.localdate() - timedelta(days=60), days=10
    )
    token = member_cli.token
    assert member_cli.json("whoami") == api_get(portal, token, "/me/")
    assert member_cli.json("tenants") == api_all(portal, token, "/tenants/")
    assert len(member_cli.json("tenants")) == 5
    assert (
        member_cli.json("quota")
        == api_all(portal, token, "/quotas/", active="true")
        == [api_get(portal, token, f"/quotas/{grant.pk}/")]
    )
    assert member_cli.json("quota", "--all", "--tenant", "protein-lab") == api_all(
        portal, token, "/quotas/", tenant="protein-lab"
    )
    assert len(member_cli.json("quota", "--all")) == 2

    whoami = rows_of(member_cli.run("whoami").stdout)
    assert ["Username", "member"] in whoami and ["lab-3", "Lab", "3", "viewer"] in whoami
    tenants = rows_of(member_cli.run("tenants").stdout)
    assert tenants[0] == ["Tenant", "Name", "Tier", "State", "Contact", "Created"]
    today = str(timezone.localdate())
    assert ["protein-lab", "Protein", "Lab", "normal", "active", "protein-lab@example.org", today] in tenants
    quota = rows_of(member_cli.run("quota").stdout)
    assert quota[0] == ["ID", "Scenario", "GPU", "model", "GPUs", "in", "use", "GPU-hours", "left", "Used", "Reserved",
                        "Until"]  # fmt: skip
    assert quota[1:] == [[str(grant.pk), "ai-training", "h100-80gb", "0/4", "100.00", "/", "100",
                          "0.00", "0.00", str(grant.ends_on)]]  # fmt: skip
    everything = rows_of(member_cli.run("quota", "--all").stdout)
    assert everything[0][-3:] == ["Until", "From", "Active"] and sorted(r[-1] for r in everything[1:]) == [
        "no",
        "yes",
    ]


def test_advise_is_the_advisors_answer(member_cli, portal, catalog):
    inputs = {"params_b": 7, "tokens_b": 20, "precision": "bf16"}
    expected = httpx.post(
        f"{portal}/api/v1/scenarios/ai-training/advise/", json=inputs,
        headers={"Authorization": f"Token {member_cli.token}"}, timeout=20,
    ).json()  # fmt: skip
    sets = [arg for name, value in inputs.items() for arg in ("--set", f"{name}={value}")]
    assert member_cli.json("advise", "ai-training", *sets) == expected
    table = member_cli.run("advise", "ai-training", *sets, "-v").stdout
    first = expected["options"][0]
    assert f"{first['gpu_model']}   " in table and f"{first['gpu_hours']:,.2f}" in table
    assert (
        first["arithmetic"][0] in table
        and "Assumptions:" in table
        and expected["assumptions"][0][:40] in table
    )

    asked = member_cli.run("advise", "ai-training")
    assert asked.rc == 2 and "params_b (required)" in asked.stderr  # what to give
    bad = member_cli.run("advise", "ai-training", "--set", "params_b=-1")
    assert bad.rc == 3 and "invalid (HTTP 400)" in bad.stderr and "params_b:" in bad.stderr


def test_templates_and_a_templates_parameters(member_cli, portal):
    token = member_cli.token
    assert member_cli.json("templates") == api_get(portal, token, "/templates/")["results"]
    assert (
        member_cli.json("templates", "--scenario", "cfd")
        == api_get(portal, token, "/templates/", scenario="cfd")["results"]
    )
    torchrun = member_cli.json("templates", "torchrun")
    assert torchrun["slug"] == "torchrun" and "script" in torchrun["parameters_schema"]["required"]
    slugs = [t["slug"] for t in api_get(portal, token, "/templates/")["results"]]
    listing = rows_of(member_cli.run("templates").stdout)
    assert listing[0] == ["Template", "Scenario", "Name", "Description"]
    assert [row[0] for row in listing if row[0] in slugs] == slugs  # one row each, in the API's order
    one = rows_of(member_cli.run("templates", "torchrun").stdout)
    assert ["script", "string", "yes", "The", "training", "script;", "torchrun", "starts", "it", "once", "per",
            "GPU."] in one  # fmt: skip
    assert next(row for row in one if row[0] == "rdzv_port")[:4] == ["rdzv_port", "integer", "no", "29500"]
    assert member_cli.run("templates", "nope").rc == 2


def test_usage_by_day_user_and_gpu_model(member_cli, portal, jobs):
    token = member_cli.token
    day = str(timezone.localdate() - timedelta(days=1))
    assert (
        member_cli.json("usage")
        == api_get(portal, token, "/usage/")
        == {"results": [{"key": day, "gpu_hours": 1.85, "cost": "0.00"}], "currency": "CNY"}  # no price set
    )
    by_user = member_cli.json(
        "usage", "--group-by", "user", "--from", day, "--to", day, "--tenant", "protein-lab"
    )
    assert by_user == api_get(
        portal, token, "/usage/", group_by="user", tenant="protein-lab", **{"from": day, "to": day}
    )
    assert by_user["results"] == [
        {"key": "manager", "gpu_hours": 0.25, "cost": "0.00"},
        {"key": "member", "gpu_hours": 1.6, "cost": "0.00"},
    ]
    table = rows_of(member_cli.run("usage", "--group-by", "gpu_model").stdout)
    assert table == [["GPU", "model", "GPU-hours"], ["h100-80gb", "1.8500"], ["Total", "1.8500"]]
    assert member_cli.run("usage", "--from", "yesterday").rc == 2
    assert member_cli.run("usage", "--from", "2026-01-10", "--to", "2026-01-01").rc == 3  # the API's 400
