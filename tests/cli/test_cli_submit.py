"""`gpuportal submit -f job.yaml` against a real portal: the Idempotency-Key from the spec (the
same file twice is one job, a changed file or another --key a new one), --set overrides, a
template job's parameters checked against its schema; a bad file refused before anything is
sent (exit code 2, the field named, no job made); the portal's 409s and 403s as exit code 3.
No worker runs here: the jobs stay QUEUED."""

import hashlib
import json
import time

import pytest

from jobs.models import Job
from portal.core.models import ApiToken
from tests.cli_support import SCRIPT_JOB, api_get, job_file
from tests.factories import catalog_pair

pytestmark = pytest.mark.django_db(transaction=True)

TEMPLATE_JOB = SCRIPT_JOB | {"script": None, "template": "python", "parameters": {"script": "train.py"}}


def submitted(result) -> dict:
    assert result.rc == 0, result
    return json.loads(result.stdout)


def test_the_same_file_is_one_job_a_changed_file_or_another_key_a_new_one(member_cli, grant, local_partition):
    path = job_file(member_cli.home)
    first = submitted(member_cli.run("submit", "-f", str(path), "--json"))
    stored = Job.objects.get(pk=first["id"])
    body = json.dumps(SCRIPT_JOB, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert stored.idempotency_key == "gpuportal-" + hashlib.sha256(body.encode()).hexdigest()
    assert first == api_get(member_cli.url, member_cli.token, "/jobs/")["results"][0]

    again = member_cli.run("submit", "-f", str(path))
    assert again.rc == 0 and again.stdout.startswith(f"Job {first['id']} was submitted before from this spec")
    path.write_text(path.read_text() + "\n# a comment: the spec is the same\n")
    assert submitted(member_cli.run("submit", "-f", str(path), "--json"))["id"] == first["id"]

    changed = submitted(
        member_cli.run("submit", "-f", str(job_file(member_cli.home, walltime_minutes=6)), "--json")
    )
    keyed = submitted(member_cli.run("submit", "-f", str(path), "--key", "run-2", "--json"))
    keyed_again = submitted(member_cli.run("submit", "-f", str(path), "--key", "run-2", "--json"))
    assert len({first["id"], changed["id"], keyed["id"]}) == 3 and keyed_again["id"] == keyed["id"]
    assert Job.objects.count() == 3

    table = member_cli.run("submit", "-f", str(path), "--key", "run-3")
    new_id = Job.objects.latest("id").pk
    assert table.stdout == f"Submitted job {new_id} (QUEUED).\n"
    assert table.stderr == f"Follow it: gpuportal logs -f {new_id}\n"


def test_set_overrides_fields_parameters_and_env(member_cli, grant, local_partition):
    path = job_file(member_cli.home, **TEMPLATE_JOB)
    job = submitted(member_cli.run(
        "submit", "-f", str(path), "--set", "name=007", "--set", "walltime_minutes=7", "--set", 'parameters.args=[--epochs, "3"]',
        "--set", "env.SEED=42", "--json",
    ))  # fmt: skip
    detail = api_get(member_cli.url, member_cli.token, f"/jobs/{job['id']}/")
    assert (detail["name"], detail["walltime_minutes"], detail["template"]) == ("007", 7, "python")
    assert detail["parameters"] == {"script": "train.py", "args": ["--epochs", "3"]}
    assert detail["env"]["SEED"] == "42"  # env values stay text
    assert "python3 train.py --epochs 3" in detail["script"]
    # the overrides are part of the spec, hence of the key: without them, another job
    assert submitted(member_cli.run("submit", "-f", str(path), "--json"))["id"] != job["id"]


def test_a_preemptible_job_with_its_restarts(member_cli, grant, local_partition):
    path = job_file(member_cli.home, preemptible=True, max_restarts=2)
    job = submitted(member_cli.run("submit", "-f", str(path), "--set", "restart_exit_codes=[42]", "--json"))
    stored = Job.objects.get(pk=job["id"])
    assert (stored.preemptible, stored.max_restarts, stored.restart_exit_codes) == (True, 2, "42")
    assert (job["preemptible"], job["max_restarts"], job["attempt"]) == (True, 2, 1)


def test_a_script_file_stdin_and_a_dry_run(member_cli, grant, local_partition):
    (member_cli.home / "train.sh").write_text("#!/bin/bash\necho from a file\n")
    path = job_file(member_cli.home, script=None, script_file="train.sh")
    dry = member_cli.run("submit", "-f", str(path), "--dry-run", "--json").json()
    assert dry["body"]["script"] == "#!/bin/bash\necho from a file\n" and "script_file" not in dry["body"]
    assert dry["idempotency_key"].startswith("gpuportal-") and Job.objects.count() == 0
    piped = member_cli.run("submit", "-f", "-", "--json", input=path.read_text())
    assert piped.rc == 0 and Job.objects.get().script == "#!/bin/bash\necho from a file\n"


BAD_FILES = [
    ({"gpus": "two"}, "gpus: Must be a whole number."),
    ({"gpus": True}, "gpus: Must be a whole number."),
    ({"gpus": 5000}, "gpus: Must be from 1 to 4096."),
    ({"walltime_minutes": None}, "walltime_minutes: This field is required."),
    ({"name": "-bad name"}, "name: Must be 1 to 64 of"),
    ({"tenant": "Protein Lab"}, "tenant: Must be a slug"),
    ({"priority": "urgent"}, "priority: Must be one of: low, normal, high."),
    ({"gpu": 1}, "gpu: Unknown field. A job takes: tenant, scenario"),
    ({"script": "echo hi"}, "script: Must start with #!"),
    ({"template": "python"}, "script: Give exactly one of script"),
    ({"env": {"PATH": "/tmp"}}, "env.PATH: This variable is the scheduler's or the portal's own"),
    ({"env": {"SEED": 42}}, "env.SEED: Must be text (put numbers in quotes)."),
    ({"nodes": 2, "gpus": 3}, "gpus: Must divide evenly over the 2 nodes."),
    ({"preemptible": "yes"}, "preemptible: Must be true or false."),
    ({"max_restarts": -1}, "max_restarts: Must be from 0 to 100."),
    ({"restart_exit_codes": [0]}, "restart_exit_codes: Must be a list of at most 8 exit codes"),
    ({"restart_exit_codes": "42"}, "restart_exit_codes: Must be a list of at most 8 exit codes"),
]


def test_a_bad_field_is_exit_2_naming_it_and_nothing_is_sent(member_cli, member, grant, local_partition):
    for fields, message in BAD_FILES:
        refused = member_cli.run("submit", "-f", str(job_file(member_cli.home, **fields)))
        assert refused.rc == 2, (fields, refused)
        assert refused.stderr.startswith("Error: ") and f"  {message}" in refused.stderr, (fields, refused)
    assert Job.objects.count() == 0
    assert ApiToken.objects.get(user=member).last_used is None  # not one request reached the portal


def test_files_and_overrides_that_cannot_be_read_are_exit_2(member_cli, grant, local_partition):
    path = member_cli.home / "job.yaml"
    cases = [
        ("tenant: [unclosed\n", [], "file: Not valid YAML (line 2, column 1)."),
        ("- a list\n", [], "file: Must be a mapping of the job's fields"),
        (job_file(member_cli.home).read_text() + "name: 2026-01-01\n", [], "name: Is a date or time in YAML"),
        (None, ["parameters.args=[--epochs, 3]"], "parameters.args[1]: Must be text."),
        (None, ["gpus"], "--set takes key=value"),
        (None, ["gpus.count=2"], "gpus: Is not a mapping, so --set gpus.count cannot go inside it."),
        (None, ["gpus=3.5"], "gpus: Must be a whole number."),
    ]
    for text, sets, message in cases:
        if text is not None:
            path.write_text(text)
        else:
            job_file(member_cli.home, **TEMPLATE_JOB)
        refused = member_cli.run("submit", "-f", str(path), *[a for s in sets for a in ("--set", s)])
        assert refused.rc == 2 and message in refused.stderr, (text, sets, refused)
    missing = member_cli.run("submit", "-f", str(member_cli.home / "nope.yaml"))
    assert missing.rc == 2 and "file: No such file." in missing.stderr
    assert member_cli.run("submit").rc == 2  # -f is required
    assert Job.objects.count() == 0


def test_a_templates_parameters_are_checked_against_its_schema_before_sending(
    member_cli, grant, local_partition
):
    cases = [
        ({"parameters": {}}, "parameters.script: This parameter is required."),
        ({"parameters": {"script": "train.py", "epochs": 3}}, "parameters.epochs: Unknown parameter. This template takes: script, args"),
        ({"parameters": {"script": "/etc/passwd"}}, "parameters.script: Does not have the form this parameter takes"),
        ({"parameters": {"script": "t.py", "args": "--x"}}, "parameters.args: Must be a list."),
        ({"parameters": {"script": "t.py", "args": ["ok", "a\nb"]}}, "parameters.args[1]: Does not have the form"),
        ({"template": "nope"}, "template: No template 'nope' for scenario 'ai-training'"),
    ]  # fmt: skip
    for fields, message in cases:
        refused = member_cli.run("submit", "-f", str(job_file(member_cli.home, **TEMPLATE_JOB | fields)))
        assert refused.rc == 2 and f"  {message}" in refused.stderr, (fields, refused.stderr)
    assert Job.objects.count() == 0
    fine = member_cli.run("submit", "-f", str(job_file(member_cli.home, **TEMPLATE_JOB)), "--json")
    assert fine.rc == 0 and Job.objects.get().template == "python"


@pytest.mark.grant(gpus=2, gpu_hours=1)
def test_the_portals_refusals_are_exit_3(member_cli, viewer, grant, local_partition, token_of):
    def submit(**fields):
        return member_cli.run("submit", "-f", str(job_file(member_cli.home, **fields)))

    catalog_pair("molecular-dynamics", "h100-80gb")  # a pair the tenant has no grant for
    no_quota = submit(scenario="molecular-dynamics")
    assert no_quota.rc == 3 and no_quota.stderr.startswith("Error: no_quota (HTTP 409)"), no_quota
    too_many = submit(gpus=4)
    assert too_many.rc == 3 and too_many.stderr.startswith("Error: quota_exhausted (HTTP 409)"), too_many
    assert submit(walltime_minutes=30).rc == 0  # 0.5 of the grant's 1 GPU-hour
    too_long = submit(gpus=2, walltime_minutes=60)
    assert too_long.rc == 3 and too_long.stderr.startswith("Error: quota_exhausted (HTTP 409)"), too_long
    shape = submit(gpus=8)
    assert (
        shape.rc == 3
        and "invalid (HTTP 400)" in shape.stderr
        and "  gpus: local/local has 4 GPUs" in shape.stderr
    )
    viewing = member_cli.run("submit", "-f", str(job_file(member_cli.home)), GPUPORTAL_TOKEN=token_of(viewer))
    assert viewing.rc == 3 and viewing.stderr.startswith("Error: permission_denied (HTTP 403)")
    assert Job.objects.count() == 1


def test_cancel_a_queued_job_and_then_once_more(member_cli, grant, local_partition):
    job = submitted(member_cli.run("submit", "-f", str(job_file(member_cli.home)), "--json"))
    cancelled = member_cli.run("cancel", job["id"])
    assert (
        cancelled.rc == 0 and cancelled.stdout == f"Cancel asked for job {job['id']}: it is CANCELLED now.\n"
    )
    assert member_cli.json("show", job["id"])["state"] == "CANCELLED"
    again = member_cli.run("cancel", job["id"], "--json")
    assert again.rc == 3 and again.stdout == ""
    assert again.stderr.startswith(
        f"Error: conflict (HTTP 409): Job {job['id']} has already ended (CANCELLED)."
    )


def test_every_wait_is_bounded(member_cli, grant, local_partition):
    """No worker runs here, so the job stays QUEUED: each follow ends at its --timeout."""
    started = time.monotonic()
    waited = member_cli.run("submit", "-f", str(job_file(member_cli.home)), "--wait", "--timeout", "2")
    assert waited.rc == 4 and waited.stdout.startswith("Submitted job ") and "Timed out" in waited.stderr
    job_id = waited.stdout.split()[2]
    followed = member_cli.run("logs", "-f", job_id, "--timeout", "1s")
    assert followed.rc == 4 and "Timed out" in followed.stderr
    watched = member_cli.run("events", "--follow", "--timeout", "1", "--json")
    assert watched.rc == 0 and watched.stdout == ""  # nothing happened: done when the time is up
    assert time.monotonic() - started < 15
    assert member_cli.run("logs", "-f", job_id, "--timeout", "soon").rc == 2
