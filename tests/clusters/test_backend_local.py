"""The local backend: real processes on this machine, tmp_path as its state directory."""

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from clusters.backends.base import BackendError, ClusterConfig, JobRef, JobState, TenantLimits
from clusters.backends.local import LocalBackend
from clusters.backends.local.devices import detect_gpus, parse_nvidia_smi_list
from tests.conftest import ROOT
from tests.local_support import (
    SLEEPER,
    group_members,
    job_spec,
    make_backend,
    pgid_of,
    wait_for_state,
    wait_until_gone,
)

FIXTURES = ROOT / "tests" / "fixtures" / "nvidia-smi" / "h200"


def wait_for_gpus(backend: LocalBackend, backend_id: str, token: str, *, timeout_s: float = 20) -> set[str]:
    """The GPUs a SLEEPER job printed once it started."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        backend.poll([backend_id])
        lines = backend.log_tail(JobRef(backend_id, token, "team-a"), lines=5, max_bytes=1000).lines
        if lines and lines[0].startswith("gpus="):
            return set(lines[0].removeprefix("gpus=").split(","))
        time.sleep(0.05)
    raise AssertionError(f"{backend_id} printed no GPUs within {timeout_s}s")


def run_child(code: str, *args: str) -> subprocess.Popen:
    """A Python process standing in for a Celery worker: it imports the backend from this repo."""
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def test_parse_nvidia_smi_list_reads_the_h200_fixture():
    text = (FIXTURES / "nvidia-smi-L.txt").read_text()

    assert parse_nvidia_smi_list(text) == [(0, "GPU-75bdf912-4cc4-0a16-d75d-86bb37ecacb3")]


def test_parse_nvidia_smi_list_skips_mig_devices_and_noise():
    text = (
        "GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-11111111-2222-3333-4444-555555555555)\n"
        "  MIG 3g.40gb     Device  0: (UUID: MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee)\n"
        "\n"
        "No devices were found\n"
        "GPU 1: NVIDIA A100-SXM4-80GB (UUID: GPU-66666666-7777-8888-9999-000000000000)\n"
    )

    assert parse_nvidia_smi_list(text) == [
        (0, "GPU-11111111-2222-3333-4444-555555555555"),
        (1, "GPU-66666666-7777-8888-9999-000000000000"),
    ]


def test_gpus_come_from_the_configured_count_else_nvidia_smi_else_none(tmp_path):
    fake = tmp_path / "fake-nvidia-smi"
    fake.write_text(f"#!/bin/sh\ncat '{FIXTURES / 'nvidia-smi-L.txt'}'\n")
    fake.chmod(0o755)
    broken = tmp_path / "broken-nvidia-smi"
    broken.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    broken.chmod(0o755)
    config = ClusterConfig(slug="local", kind="local", local_gpus=0, state_dir=str(tmp_path / "state"))

    assert detect_gpus(str(fake)) == [0]
    assert detect_gpus(str(broken)) == []
    assert detect_gpus(str(tmp_path / "missing")) == []
    assert LocalBackend(config, nvidia_smi=str(fake)).gpus == [0]
    assert make_backend(tmp_path / "state", gpus=3, nvidia_smi=str(fake)).gpus == [0, 1, 2]
    none = LocalBackend(config, nvidia_smi=str(tmp_path / "missing"))
    assert none.gpus == []
    with pytest.raises(BackendError, match="asks for 1 GPUs"):
        none.submit(job_spec("gpu-job", "true\n", gpus=1))


def test_a_job_runs_on_its_own_gpus_and_completes(tmp_path):
    backend = make_backend(tmp_path)
    spec = job_spec("tok-1", 'echo "gpus=$CUDA_VISIBLE_DEVICES"\necho "cwd=$PWD"\n', gpus=2)

    backend_id = backend.submit(spec)
    status = wait_for_state(backend, backend_id, {JobState.COMPLETED, JobState.FAILED})

    assert status.state == JobState.COMPLETED
    assert status.exit_code == 0
    assert status.started_at.tzinfo is not None and status.finished_at.tzinfo is not None
    assert status.started_at <= status.finished_at
    tail = backend.log_tail(JobRef(backend_id, "tok-1", "team-a"), lines=10, max_bytes=4096)
    assert tail.lines == ["gpus=0,1", "cwd=/job"]  # its directory, as the sandbox shows it
    assert backend.find("tok-1") == backend_id
    assert backend.find("tok-2") is None
    assert backend.submit(spec) == backend_id  # a retried dispatch finds the first submission
    assert backend.inventory()[0].gpus_free == 4


def test_two_jobs_never_share_a_gpu_and_a_third_waits_for_one(tmp_path):
    backend = make_backend(tmp_path)
    first = backend.submit(job_spec("a", SLEEPER, gpus=2))
    second = backend.submit(job_spec("b", SLEEPER, gpus=2))
    third = backend.submit(job_spec("c", SLEEPER, gpus=2))
    try:
        gpus_a = wait_for_gpus(backend, first, "a")
        gpus_b = wait_for_gpus(backend, second, "b")
        waiting = backend.poll([third])[third]

        assert gpus_a.isdisjoint(gpus_b) and gpus_a | gpus_b == {"0", "1", "2", "3"}
        assert (waiting.state, waiting.reason) == (JobState.PENDING, "Resources")
        assert backend.inventory()[0].gpus_free == 0

        backend.cancel(first)

        assert wait_for_gpus(backend, third, "c") == gpus_a
        assert backend.poll([third])[third].state == JobState.RUNNING
    finally:
        for backend_id in (first, second, third):
            backend.cancel(backend_id)


def test_waiting_jobs_start_in_submission_order(tmp_path):
    backend = make_backend(tmp_path)
    big = backend.submit(job_spec("big", SLEEPER, gpus=3))
    pair = backend.submit(job_spec("pair", SLEEPER, gpus=2))
    single = backend.submit(job_spec("single", SLEEPER, gpus=1))
    try:
        statuses = backend.poll([big, pair, single])

        # One GPU is free, but the single-GPU job does not overtake the pair submitted before it.
        assert [statuses[i].state for i in (big, pair, single)] == [
            JobState.RUNNING,
            JobState.PENDING,
            JobState.PENDING,
        ]

        backend.cancel(big)

        assert wait_for_state(backend, pair, {JobState.RUNNING}) and wait_for_state(
            backend, single, {JobState.RUNNING}
        )
    finally:
        for backend_id in (big, pair, single):
            backend.cancel(backend_id)


def test_concurrent_submits_from_threads_never_share_a_gpu(tmp_path):
    backends = [make_backend(tmp_path) for _ in range(4)]
    barrier = threading.Barrier(len(backends))
    ids: dict[str, str] = {}

    def submit(index: int) -> None:
        barrier.wait(timeout=10)
        ids[f"t{index}"] = backends[index].submit(job_spec(f"t{index}", SLEEPER, gpus=2))

    threads = [threading.Thread(target=submit, args=(i,)) for i in range(len(backends))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=20)
    try:
        assert len(ids) == 4 and len(set(ids.values())) == 4
        statuses = backends[0].poll(list(ids.values()))
        running = [
            token for token, backend_id in ids.items() if statuses[backend_id].state == JobState.RUNNING
        ]
        gpu_sets = [wait_for_gpus(backends[0], ids[token], token) for token in running]

        assert len(running) == 2
        assert gpu_sets[0].isdisjoint(gpu_sets[1])
        assert sorted(s.state for s in statuses.values()) == [
            JobState.PENDING,
            JobState.PENDING,
            JobState.RUNNING,
            JobState.RUNNING,
        ]
    finally:
        for backend_id in ids.values():
            backends[0].cancel(backend_id)


CHILD_SUBMITS = """
import pathlib, sys, time
from tests.local_support import SLEEPER, job_spec, make_backend
state_dir, prefix, go = pathlib.Path(sys.argv[1]), sys.argv[2], pathlib.Path(sys.argv[3])
backend = make_backend(state_dir)
(state_dir / ("ready-" + prefix)).touch()
deadline = time.monotonic() + 20
while not go.exists() and time.monotonic() < deadline:
    time.sleep(0.001)
for i in range(3):
    print(prefix + str(i), backend.submit(job_spec(prefix + str(i), SLEEPER, gpus=1)), flush=True)
"""


def test_concurrent_submits_from_processes_never_share_a_gpu(tmp_path):
    go = tmp_path / "go"
    children = [run_child(CHILD_SUBMITS, str(tmp_path), prefix, str(go)) for prefix in ("p", "q")]
    deadline = time.monotonic() + 30
    while not all((tmp_path / f"ready-{prefix}").exists() for prefix in ("p", "q")):
        assert time.monotonic() < deadline, "the children did not start"
        time.sleep(0.01)
    go.touch()  # both spin on this file, so that their submits overlap
    ids = {}
    for child in children:
        out, _ = child.communicate(timeout=30)
        assert child.returncode == 0
        ids.update(line.split() for line in out.splitlines())
    backend = make_backend(tmp_path)
    try:
        statuses = backend.poll(list(ids.values()))
        running = [
            token for token, backend_id in ids.items() if statuses[backend_id].state == JobState.RUNNING
        ]
        gpus = [wait_for_gpus(backend, ids[token], token) for token in running]

        assert len(ids) == 6 and len(set(ids.values())) == 6
        assert len(running) == 4
        assert sorted(gpu for gpu_set in gpus for gpu in gpu_set) == ["0", "1", "2", "3"]
    finally:
        for backend_id in ids.values():
            backend.cancel(backend_id)


def test_a_failing_script_reports_its_exit_code(tmp_path):
    backend = make_backend(tmp_path)
    backend_id = backend.submit(job_spec("fails", "echo oops\nexit 3\n"))

    status = wait_for_state(backend, backend_id, {JobState.COMPLETED, JobState.FAILED})

    assert (status.state, status.exit_code, status.reason) == (JobState.FAILED, 3, "exit code 3")
    assert status.finished_at is not None


def test_cancel_ends_the_whole_process_group(tmp_path):
    backend = make_backend(tmp_path)
    backend_id = backend.submit(job_spec("victim", 'sleep 300 &\necho "gpus=$CUDA_VISIBLE_DEVICES"\nwait\n'))
    wait_for_gpus(backend, backend_id, "victim")
    pgid = pgid_of(tmp_path, "victim")
    assert len(group_members(pgid, include_zombies=False)) >= 3  # wrapper, bash, sleep

    started = time.monotonic()
    backend.cancel(backend_id)

    assert time.monotonic() - started < 2  # sleep obeys SIGTERM: no wait for the grace period
    assert backend.poll([backend_id])[backend_id].state == JobState.CANCELLED
    wait_until_gone(pgid, include_zombies=True)  # the wrapper reaped its job, we reaped the wrapper
    backend.cancel(backend_id)  # a finished job: nothing to do, no error
    backend.cancel("local-999")
    assert backend.poll([backend_id])[backend_id].state == JobState.CANCELLED


def test_cancel_of_a_waiting_job_removes_it_from_the_queue(tmp_path):
    backend = make_backend(tmp_path, gpus=1)
    running = backend.submit(job_spec("holder", SLEEPER))
    waiting = backend.submit(job_spec("waiter", SLEEPER))
    try:
        backend.cancel(waiting)
        backend.cancel(running)

        statuses = backend.poll([running, waiting])
        assert statuses[waiting].state == JobState.CANCELLED and statuses[waiting].started_at is None
        assert statuses[running].state == JobState.CANCELLED
        assert not (tmp_path / "jobs" / "waiter" / "waiter.out").exists()
    finally:
        backend.cancel(running)


def test_walltime_kills_the_job_as_timeout_even_if_it_ignores_sigterm(tmp_path):
    backend = make_backend(tmp_path, minute_s=1, grace_s=1)  # "a minute" lasts one second
    backend_id = backend.submit(
        job_spec("slow", "trap '' TERM\necho \"gpus=$CUDA_VISIBLE_DEVICES\"\nsleep 60\n", walltime_minutes=1)
    )
    wait_for_gpus(backend, backend_id, "slow")
    pgid = pgid_of(tmp_path, "slow")

    status = wait_for_state(
        backend, backend_id, {JobState.TIMEOUT, JobState.COMPLETED, JobState.FAILED}, timeout_s=15
    )

    assert status.state == JobState.TIMEOUT
    assert 1 <= (status.finished_at - status.started_at).total_seconds() < 10
    # SIGKILL takes the wrapper with its job, so the job's own processes may stay as zombies of
    # this machine's init, which reaps nothing here; none may still run.
    wait_until_gone(pgid, include_zombies=False)


def test_a_new_instance_polls_and_cancels_a_job_another_process_started(tmp_path):
    code = (
        "import sys; from tests.local_support import SLEEPER, job_spec, make_backend\n"
        "print(make_backend(sys.argv[1]).submit(job_spec('orphan', SLEEPER)), flush=True)\n"
    )
    child = run_child(code, str(tmp_path))
    out, _ = child.communicate(timeout=30)  # the "worker" that started the job has exited
    backend_id = out.strip()
    backend = make_backend(tmp_path)  # as after a worker restart

    wait_for_gpus(backend, backend_id, "orphan")
    assert backend.poll([backend_id])[backend_id].state == JobState.RUNNING

    backend.cancel(backend_id)

    assert backend.poll([backend_id])[backend_id].state == JobState.CANCELLED
    # The wrapper's parent is gone, so only init can reap it (a zombie here); nothing runs on.
    wait_until_gone(pgid_of(tmp_path, "orphan"), include_zombies=False)


def test_the_exit_code_is_recorded_after_the_starting_worker_is_killed(tmp_path):
    code = (
        "import sys, time; from tests.local_support import job_spec, make_backend\n"
        "print(make_backend(sys.argv[1]).submit(job_spec('survivor', 'sleep 1\\nexit 7\\n')), flush=True)\n"
        "time.sleep(60)\n"
    )
    child = run_child(code, str(tmp_path))
    backend_id = child.stdout.readline().strip()
    os.kill(child.pid, signal.SIGKILL)
    child.wait(timeout=10)
    backend = make_backend(tmp_path)

    status = wait_for_state(backend, backend_id, {JobState.COMPLETED, JobState.FAILED})

    assert (status.state, status.exit_code) == (JobState.FAILED, 7)


def test_env_values_and_job_name_are_data_not_shell(tmp_path):
    marker = tmp_path / "marker"
    tricks = {
        "SEMI": f"x; touch {marker}",
        "SUBST": f"$(touch {marker})",
        "TICKS": f"`touch {marker}`",
        "LINES": f"a\ntouch {marker}\nb",
        "QUOTES": f"\"' ; touch {marker} ; '\"",
        "RELATIVE": "$(touch marker)",
    }
    name = f"n\"$(touch {marker})`touch {marker}`'; touch {marker}\n"
    backend = make_backend(tmp_path)
    spec = job_spec("inert", "env -0 > env.dump\n", env=tricks, name=name)

    status = wait_for_state(backend, backend.submit(spec), {JobState.COMPLETED, JobState.FAILED})

    assert status.state == JobState.COMPLETED
    dump = (tmp_path / "jobs" / "inert" / "env.dump").read_bytes().decode()
    env = dict(item.split("=", 1) for item in dump.split("\0") if item)
    assert {key: env[key] for key in tricks} == tricks
    assert env["PORTAL_JOB_NAME"] == name
    assert "SECRET_KEY" not in env and "DJANGO_SETTINGS_MODULE" not in env
    assert not marker.exists() and not (tmp_path / "jobs" / "inert" / "marker").exists()


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"env": {"A;B": "1"}}, "invalid environment variable 'A;B'"),
        ({"env": {"1X": "1"}}, "invalid environment variable '1X'"),
        ({"env": {"A": "x\0y"}}, "invalid environment variable 'A'"),
        ({"name": "a\0b"}, "invalid environment variable 'PORTAL_JOB_NAME'"),
        ({"token": "../escape"}, "invalid job token"),
        ({"token": "a/b"}, "invalid job token"),
        ({"nodes": 2}, "the local cluster has one node"),
        ({"gpus_per_node": 5}, "asks for 5 GPUs"),
    ],
)
def test_submit_refuses_what_the_local_cluster_cannot_run(tmp_path, fields, message):
    backend = make_backend(tmp_path)

    with pytest.raises(BackendError, match=message):
        backend.submit(job_spec(fields.pop("token", "bad"), "true\n", **fields))

    assert not (tmp_path / "jobs" / "bad").exists()


def test_log_tail_respects_lines_and_bytes(tmp_path):
    backend = make_backend(tmp_path)
    backend_id = backend.submit(job_spec("chatty", 'for i in $(seq 1 100); do echo "line-$i"; done\n'))
    wait_for_state(backend, backend_id, {JobState.COMPLETED})
    ref = JobRef(backend_id, "chatty", "team-a")

    last5 = backend.log_tail(ref, lines=5, max_bytes=10_000)
    everything = backend.log_tail(ref, lines=1000, max_bytes=10_000)
    few_bytes = backend.log_tail(ref, lines=1000, max_bytes=20)

    assert (last5.lines, last5.truncated) == ([f"line-{i}" for i in range(96, 101)], True)
    assert (len(everything.lines), everything.lines[0], everything.truncated) == (100, "line-1", False)
    assert few_bytes.truncated and few_bytes.lines[-1] == "line-100"
    assert sum(len(line) + 1 for line in few_bytes.lines) <= 20
    assert all(line.startswith("line-") for line in few_bytes.lines)  # no line cut in half
    assert backend.log_tail(JobRef("local-9", "nothing", "team-a"), lines=5, max_bytes=100).lines == []


def test_poll_leaves_out_unknown_ids(tmp_path):
    backend = make_backend(tmp_path)

    assert backend.poll(["local-999", "nonsense", "../../etc"]) == {}


def test_inventory_health_and_apply_tenant(tmp_path):
    backend = make_backend(tmp_path / "state", gpus=2)
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")

    partition = backend.inventory()[0]

    assert (partition.name, partition.gpu_type, partition.gpus_per_node, partition.gpus_free) == (
        "local",
        "local",
        2,
        2,
    )
    assert backend.health().healthy
    assert not make_backend(not_a_dir).health().healthy
    assert not make_backend(not_a_dir / "sub").health().healthy
    limits = TenantLimits(account="team-a", qos="portal-normal", users=[], gpus_by_type={}, gpu_minutes=0)
    assert backend.apply_tenant(limits) is None
