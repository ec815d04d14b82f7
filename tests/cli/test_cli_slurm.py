"""`gpuportal submit --wait` on the real Slurm testbed: sbatch over SSH by a real Celery worker,
the cluster polled as beat would; the command follows the job through the event stream to its
end and exits 0 when it COMPLETED, 1 when its script failed."""

import pytest

from tests.cli_support import Cli, Reader, job_file
from tests.jobs_support import beat
from tests.slurm_support import GPU_MODEL, slurm_tenant

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def on_slurm(testbed, worker, token_of, tmp_path, portal):
    """A tenant of its own on the testbed (its Slurm account made), and the CLI as its member."""
    made = slurm_tenant(testbed)
    home = tmp_path / "home"
    home.mkdir()
    yield made, Cli(home=home, url=portal, token=token_of(made.user))
    made.cleanup()


def test_submit_wait_exits_0_when_the_job_completed_and_1_when_it_failed(on_slurm):
    tenant, cli = on_slurm
    on_testbed = {"tenant": tenant.tenant.slug, "gpu_model": GPU_MODEL, "cluster": "testbed", "partition": "a100",
                  "walltime_minutes": 2}  # fmt: skip
    good = job_file(
        cli.home, "good.yaml", **on_testbed, name="good", script="#!/bin/bash\necho done on $(hostname)\n"
    )
    bad = job_file(
        cli.home, "bad.yaml", **on_testbed, name="bad", script="#!/bin/bash\necho failing\nexit 7\n"
    )
    with beat(tenant.cluster.pk):
        waits = [
            Reader(cli.start("submit", "-f", str(path), "--wait", "--timeout", "90")) for path in (good, bad)
        ]
        results = [(wait.finish(timeout_s=120), wait.proc) for wait in waits]

    (good_out, good_proc), (bad_out, bad_proc) = results
    good_id = good_out[0][1].removeprefix("Submitted job ").split()[0]
    assert good_proc.returncode == 0, (good_out, good_proc.stderr.read())
    assert good_out[-1][1] == f"Job {good_id} ended COMPLETED (exit code 0)."
    progress = good_proc.stderr.read()
    assert "→ RUNNING" in progress or "→ COMPLETED" in progress, progress  # the states as they came

    assert bad_proc.returncode == 1, (bad_out, bad_proc.stderr.read())
    assert bad_out[-1][1].endswith("ended FAILED (exit code 7).")

    log = cli.run("logs", good_id)
    assert log.rc == 0 and log.stdout.startswith("done on "), log
    assert cli.json("show", good_id)["backend_id"].isdigit()  # a Slurm job id
