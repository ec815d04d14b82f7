"""The testbed's slurmrestd (tests/testbed/testbed.sh) answers JWT-authenticated requests and
refuses others, so that bench/load.py always has its peer: ping, submit, get, list, cancel."""

import uuid

import pytest

from bench.peers import LoopbackHttp, PeerError, SbatchOverSsh, SlurmRestd, ssh_config_from_env
from tests.testbed.env import testbed_env


@pytest.fixture(scope="module")
def env():
    return testbed_env()


@pytest.fixture(scope="module")
def config(env):
    return ssh_config_from_env(env)


@pytest.fixture(scope="module")
def rest(env, config):
    return SlurmRestd.for_testbed(env, config, lifespan_s=600)


def test_the_env_file_names_slurmrestd(env):
    assert env["SLURMRESTD_URL"] == "http://127.0.0.1:6830"
    assert env["SLURMRESTD_API"] == "v0.0.38"
    assert (
        env["SLURMRESTD_USER"] == env["SLURM_TESTBED_IDENTITY"]
    )  # a job identity: the portal's user submits nothing


def test_ping_with_a_token_reaches_slurmctld(rest):
    answer = rest.ping()
    assert answer["meta"]["Slurm"]["release"].startswith("22.05")
    assert answer["pings"][0]["ping"] == "UP"


def test_a_request_without_a_token_is_refused(env):
    status, _ = LoopbackHttp(env["SLURMRESTD_URL"]).request("GET", f"/slurm/{env['SLURMRESTD_API']}/ping", {})
    assert status == 401


def test_a_forged_token_is_refused(rest):
    # slurmrestd 22.05 passes the token through; slurmctld refuses it and slurmrestd answers 500
    head, _, signature = rest.token.rpartition(".")
    swapped = "B" if signature[10] == "A" else "A"  # a whole sextet inside the HMAC, not padding bits
    forged = SlurmRestd(**{**_fields(rest), "token": f"{head}.{signature[:10]}{swapped}{signature[11:]}"})
    with pytest.raises(PeerError, match="HTTP 500"):
        forged.ping()


def test_submit_get_list_and_cancel_a_job(rest, env, config):
    name = f"t-rest-{uuid.uuid4().hex[:8]}"
    job_id = rest.submit(name)
    try:
        job = rest.get_job(job_id)
        assert job["name"] == name
        assert job["job_state"] == "PENDING"
        assert job["state_reason"] == "BeginTime"  # 30 days ahead: it never takes the testbed's GPUs
        assert job["account"] == env["SLURM_TESTBED_ACCOUNT"]
        assert job["user_name"] == env["SLURM_TESTBED_IDENTITY"]
        assert "gres/gpu=1" in job["tres_req_str"]
        assert job_id in {str(j["job_id"]) for j in rest.list_jobs()}
        rest.cancel(job_id)
        assert rest.get_job(job_id)["job_state"] == "CANCELLED"
    finally:
        SbatchOverSsh.for_testbed(env, config).cancel([job_id])


def test_sbatch_over_ssh_submits_the_same_job(rest, env, config):
    peer = SbatchOverSsh.for_testbed(env, config)
    name = f"t-ssh-{uuid.uuid4().hex[:8]}"
    job_id = peer.submit(name)
    try:
        job = rest.get_job(job_id)
        assert (job["name"], job["job_state"], job["state_reason"]) == (name, "PENDING", "BeginTime")
    finally:
        peer.cancel([job_id])
    assert rest.get_job(job_id)["job_state"] == "CANCELLED"


def test_cancel_named_sweeps_the_jobs_of_a_name_and_no_other(rest, env, config):
    """bench/load.py's last sweep: a submission that timed out on the client still left a job."""
    peer = SbatchOverSsh.for_testbed(env, config)
    name, other = f"t-sweep-{uuid.uuid4().hex[:8]}", f"t-keep-{uuid.uuid4().hex[:8]}"
    swept, kept = [rest.submit(name), peer.submit(name)], peer.submit(other)
    try:
        peer.cancel_named(name)
        assert {rest.get_job(job_id)["job_state"] for job_id in swept} == {"CANCELLED"}
        assert rest.get_job(kept)["job_state"] == "PENDING"
    finally:
        peer.cancel([*swept, kept])
    with pytest.raises(ValueError, match="unsuitable"):
        peer.cancel_named(f"{name},{other}")


def _fields(rest: SlurmRestd) -> dict:
    names = ("base_url", "api", "user", "token", "account", "partition", "gres", "timeout_s")
    return {name: getattr(rest, name) for name in names}
