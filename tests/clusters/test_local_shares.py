"""GPU shares on the local cluster, with real jobs: MIG devices of a profile, slices that share a
GPU while their caps fit, other vendors' devices pinned by their own variables, and an
allocation state written before shares. The machines are the recordings of
tests/fixtures/accelerators/ (a 4-GPU H200 host with MIG devices, AMD, Hygon, Ascend and
Cambricon hosts) and the real H200 capture (tests/nvidia_smi_replay.sh), their tools stood in for
on the PATH."""

import json
import time
from pathlib import Path

import pytest

from clusters.backends.base import BackendError, ClusterConfig, JobState
from clusters.backends.local import LocalBackend
from tests.conftest import ROOT
from tests.local_support import job_spec, make_backend

RECORDED = ROOT / "tests" / "fixtures" / "accelerators"
H200_REPLAY = ROOT / "tests" / "nvidia_smi_replay.sh"
GPU0_MIG_3G = ["MIG-6f1e2d3c-4b5a-5968-8776-a5b4c3d2e1f0", "MIG-0a1b2c3d-4e5f-5a6b-9c8d-7e6f5a4b3c2d"]
# The job writes its environment, whole, then stays until cancelled.
SHOW_ENV = "env -0 > env.tmp && mv env.tmp env.dump\nsleep 60\n"
VISIBLE = (
    "CUDA_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "ASCEND_RT_VISIBLE_DEVICES",
    "MLU_VISIBLE_DEVICES",
)


def backend_on(tmp_path, monkeypatch, *tools: str, nvidia_smi: str = "") -> LocalBackend:
    """A local cluster that finds its devices through stand-ins for these tools on the PATH."""
    folder = tmp_path / "bin"
    folder.mkdir(exist_ok=True)
    for tool in tools:
        (folder / tool).symlink_to(RECORDED / "replay.sh")
    monkeypatch.setenv("PATH", f"{folder}:/usr/bin:/bin")
    config = ClusterConfig(slug="local", kind="local", local_gpus=0, state_dir=str(tmp_path / "state"))
    return LocalBackend(config, grace_s=2, nvidia_smi=nvidia_smi or str(folder / "nvidia-smi"))


def env_of(backend: LocalBackend, backend_id: str, token: str, *, timeout_s: float = 20) -> dict[str, str]:
    """The environment the running job found, as it wrote it."""
    dump = Path(backend.config.state_dir) / "jobs" / token / "env.dump"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        backend.poll([backend_id])
        try:
            text = dump.read_bytes().decode()
        except FileNotFoundError:
            time.sleep(0.05)
            continue
        return dict(item.split("=", 1) for item in text.split("\0") if item)
    raise AssertionError(
        f"{backend_id} wrote no environment within {timeout_s}s: {backend.poll([backend_id])}"
    )


def pinned(env: dict[str, str]) -> dict[str, str]:
    return {name: env[name] for name in VISIBLE if name in env}


def state_of(backend: LocalBackend, backend_id: str) -> str:
    return backend.poll([backend_id])[backend_id].state


def cancel_all(backend: LocalBackend, ids: list[str]) -> None:
    for backend_id in ids:
        backend.cancel(backend_id)


# --- MIG


def test_a_mig_job_gets_mig_devices_of_its_profile_and_a_third_waits(tmp_path, monkeypatch):
    backend = backend_on(tmp_path, monkeypatch, "nvidia-smi")
    mig = {"share": "mig", "mig_profile": "3g.71gb"}
    ids = [backend.submit(job_spec(token, SHOW_ENV, **mig)) for token in ("m1", "m2", "m3")]
    try:
        first, second = env_of(backend, ids[0], "m1"), env_of(backend, ids[1], "m2")

        assert [first["CUDA_VISIBLE_DEVICES"], second["CUDA_VISIBLE_DEVICES"]] == GPU0_MIG_3G
        assert "PORTAL_GPU_MEMORY_MIB" not in first
        waiting = backend.poll([ids[2]])[ids[2]]
        assert (waiting.state, waiting.reason) == (JobState.PENDING, "Resources")
        assert backend.inventory()[0].gpus_free == 3  # GPU 0 holds MIG jobs; 1, 2 and 3 nothing

        backend.cancel(ids[0])

        assert env_of(backend, ids[2], "m3")["CUDA_VISIBLE_DEVICES"] == GPU0_MIG_3G[0]
    finally:
        cancel_all(backend, ids)


def test_a_mig_job_takes_several_devices_of_its_profile(tmp_path, monkeypatch):
    backend = backend_on(tmp_path, monkeypatch, "nvidia-smi")
    backend_id = backend.submit(job_spec("small", SHOW_ENV, gpus=3, share="mig", mig_profile="1g.18gb"))
    try:
        devices = env_of(backend, backend_id, "small")["CUDA_VISIBLE_DEVICES"].split(",")

        assert len(devices) == 3 and all(device.startswith("MIG-") for device in devices)
        assert not set(devices) & set(GPU0_MIG_3G)  # GPU 1's 1g.18gb devices, not GPU 0's
    finally:
        backend.cancel(backend_id)


def test_whole_jobs_never_get_a_gpu_split_into_mig_devices(tmp_path, monkeypatch):
    backend = backend_on(tmp_path, monkeypatch, "nvidia-smi")
    whole = backend.submit(job_spec("whole", SHOW_ENV, gpus=2))
    # A MIG job that waits for its profile does not hold up whole jobs: they compete for other devices.
    migs = [backend.submit(job_spec(f"m{i}", SHOW_ENV, share="mig", mig_profile="3g.71gb")) for i in range(3)]
    after = backend.submit(job_spec("after", SHOW_ENV, gpus=1))
    ids = [whole, *migs, after]
    try:
        assert pinned(env_of(backend, whole, "whole")) == {"CUDA_VISIBLE_DEVICES": "2,3"}
        assert state_of(backend, migs[2]) == JobState.PENDING
        assert state_of(backend, after) == JobState.PENDING  # GPUs 2 and 3 are held, 0 and 1 are MIG's

        backend.cancel(whole)

        assert pinned(env_of(backend, after, "after")) == {"CUDA_VISIBLE_DEVICES": "2"}
    finally:
        cancel_all(backend, ids)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"share": "mig", "mig_profile": "2g.35gb"},
            r"asks for 1 MIG 2g\.35gb devices; the local cluster has 0 \(its MIG devices are 1g\.18gb, 3g\.71gb\)",
        ),
        (
            {"share": "mig", "mig_profile": "3g.71gb", "gpus": 3},
            "asks for 3 MIG 3g.71gb devices; the local cluster has 2",
        ),
        ({"share": "mig", "mig_profile": ""}, "a MIG job names its MIG profile"),
        ({"gpus": 3}, r"asks for 3 GPUs; the local cluster has 2 \(and GPUs 0, 1 split into MIG devices"),
        ({"share": "shard"}, "the local cluster gives whole, mig, slice shares, not 'shard'"),
        ({"share": "slice", "gpu_memory_mib": 1024, "gpu_cores_pct": 10}, "does not know its GPUs' memory"),
    ],
)
def test_submit_refuses_a_share_the_mig_host_cannot_give(tmp_path, monkeypatch, fields, message):
    backend = backend_on(tmp_path, monkeypatch, "nvidia-smi")

    with pytest.raises(BackendError, match=message):
        backend.submit(job_spec("refused", "true\n", **fields))

    assert not (tmp_path / "state" / "jobs" / "refused").exists()


# --- slices, on the real H200 (143771 MiB)


def slice_of(token: str, memory_mib: int, cores_pct: int):
    return job_spec(token, SHOW_ENV, share="slice", gpu_memory_mib=memory_mib, gpu_cores_pct=cores_pct)


def test_two_slices_share_the_gpu_with_their_caps_and_a_third_that_does_not_fit_waits(tmp_path, monkeypatch):
    backend = backend_on(tmp_path, monkeypatch, nvidia_smi=str(H200_REPLAY))
    big = backend.submit(slice_of("big", 100_000, 30))
    small = backend.submit(slice_of("small", 40_000, 50))
    third = backend.submit(slice_of("third", 10_000, 10))  # 150,000 MiB in all: more than the GPU's
    ids = [big, small, third]
    try:
        big_env, small_env = env_of(backend, big, "big"), env_of(backend, small, "small")

        assert pinned(big_env) == pinned(small_env) == {"CUDA_VISIBLE_DEVICES": "0"}
        assert {
            name: big_env[name] for name in big_env if "LIMIT" in name or name.startswith("PORTAL_GPU")
        } == {
            "PORTAL_GPU_MEMORY_MIB": "100000",
            "PORTAL_GPU_CORES_PCT": "30",
            "CUDA_DEVICE_MEMORY_LIMIT": "100000m",
            "CUDA_DEVICE_SM_LIMIT": "30",
        }
        assert (small_env["CUDA_DEVICE_MEMORY_LIMIT"], small_env["CUDA_DEVICE_SM_LIMIT"]) == ("40000m", "50")
        waiting = backend.poll([third])[third]
        assert (waiting.state, waiting.reason) == (JobState.PENDING, "Resources")
        assert backend.inventory()[0].gpus_free == 0

        backend.cancel(big)

        assert env_of(backend, third, "third")["CUDA_DEVICE_MEMORY_LIMIT"] == "10000m"
    finally:
        cancel_all(backend, ids)


def test_slices_wait_for_compute_as_for_memory_and_a_whole_job_waits_for_the_slices(tmp_path, monkeypatch):
    backend = backend_on(tmp_path, monkeypatch, nvidia_smi=str(H200_REPLAY))
    first = backend.submit(slice_of("first", 1_000, 60))
    second = backend.submit(slice_of("second", 1_000, 50))  # 110 % of the GPU's compute
    ids = [first, second]
    try:
        env_of(backend, first, "first")
        assert state_of(backend, second) == JobState.PENDING

        backend.cancel(first)
        env_of(backend, second, "second")
        ids.append(whole := backend.submit(job_spec("whole", SHOW_ENV)))

        assert state_of(backend, whole) == JobState.PENDING  # the GPU holds a slice

        backend.cancel(second)

        assert pinned(env_of(backend, whole, "whole")) == {"CUDA_VISIBLE_DEVICES": "0"}
        assert "CUDA_DEVICE_MEMORY_LIMIT" not in env_of(backend, whole, "whole")
        ids.append(late := backend.submit(slice_of("late", 1_000, 10)))
        assert state_of(backend, late) == JobState.PENDING  # and a slice waits for the whole job
    finally:
        cancel_all(backend, ids)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"gpu_memory_mib": 150_000, "gpu_cores_pct": 10},
            "slices of 150000 MiB.*its largest has 143771 MiB",
        ),
        (
            {"gpu_memory_mib": 1_000, "gpu_cores_pct": 10, "gpus": 2},
            "asks for 2 slices of 1000 MiB, each on a GPU of its own",
        ),
        ({"gpu_memory_mib": 1_000, "gpu_cores_pct": 0}, "compute percentage is between 1 and 100, not 0"),
        ({"gpu_memory_mib": 1_000, "gpu_cores_pct": 101}, "compute percentage is between 1 and 100, not 101"),
        ({"gpu_memory_mib": 0, "gpu_cores_pct": 10}, "a slice needs a memory cap in MiB"),
    ],
)
def test_submit_refuses_a_slice_larger_than_the_gpu(tmp_path, monkeypatch, fields, message):
    backend = backend_on(tmp_path, monkeypatch, nvidia_smi=str(H200_REPLAY))

    with pytest.raises(BackendError, match=message):
        backend.submit(job_spec("refused", "true\n", share="slice", **fields))


def test_a_cluster_configured_by_count_gives_no_slices(tmp_path):
    backend = make_backend(tmp_path, gpus=2)

    with pytest.raises(BackendError, match="configured by count"):
        backend.submit(job_spec("refused", "true\n", share="slice", gpu_memory_mib=1_000, gpu_cores_pct=10))


# --- other vendors


@pytest.mark.parametrize(
    ("tools", "vendor", "first", "second"),
    [
        # ROCr picks the devices, then HIP numbers what ROCr shows from 0.
        (
            ("rocm-smi",),
            "amd",
            {"ROCR_VISIBLE_DEVICES": "0", "HIP_VISIBLE_DEVICES": "0"},
            {"ROCR_VISIBLE_DEVICES": "1", "HIP_VISIBLE_DEVICES": "0"},
        ),
        (("hy-smi",), "hygon", {"HIP_VISIBLE_DEVICES": "0"}, {"HIP_VISIBLE_DEVICES": "1,2"}),
        (("npu-smi",), "huawei", {"ASCEND_RT_VISIBLE_DEVICES": "0"}, {"ASCEND_RT_VISIBLE_DEVICES": "1,2"}),
        (("cnmon",), "cambricon", {"MLU_VISIBLE_DEVICES": "0"}, {"MLU_VISIBLE_DEVICES": "1"}),
    ],
)
def test_other_vendors_devices_are_pinned_by_their_own_variables(
    tmp_path, monkeypatch, tools, vendor, first, second
):
    backend = backend_on(tmp_path, monkeypatch, *tools)
    second_units = len(second[next(iter(second))].split(","))
    ids = [
        backend.submit(job_spec("one", SHOW_ENV, vendor=vendor)),
        backend.submit(job_spec("two", SHOW_ENV, vendor=vendor, gpus=second_units)),
    ]
    try:
        assert pinned(env_of(backend, ids[0], "one")) == first
        assert pinned(env_of(backend, ids[1], "two")) == second  # never a device of the first job's
    finally:
        cancel_all(backend, ids)


@pytest.mark.parametrize(
    ("tools", "fields", "message"),
    [
        (("npu-smi",), {"vendor": "huawei", "gpus": 9}, "asks for 9 Ascend NPUs; the local cluster has 8"),
        (
            ("rocm-smi",),
            {"vendor": "amd", "share": "slice", "gpu_memory_mib": 1_000, "gpu_cores_pct": 10},
            "slices of NVIDIA GPUs only",
        ),
        (
            ("cnmon",),
            {"vendor": "cambricon", "share": "mig", "mig_profile": "3g.71gb"},
            "MIG devices are NVIDIA GPUs'",
        ),
        (("cnmon",), {"vendor": "nvidia"}, "asks for 1 GPUs; the local cluster has 0"),
        (("cnmon",), {"vendor": "intel"}, "unknown accelerator vendor 'intel'"),
    ],
)
def test_submit_refuses_what_the_vendors_devices_cannot_give(tmp_path, monkeypatch, tools, fields, message):
    backend = backend_on(tmp_path, monkeypatch, *tools)

    with pytest.raises(BackendError, match=message):
        backend.submit(job_spec("refused", "true\n", **fields))


# --- the allocation state


def strip_share_keys(state_dir) -> None:
    """alloc.json as a portal from before shares wrote it: no share, vendor or MIG keys."""
    path = state_dir / "alloc.json"
    state = json.loads(path.read_text())
    for job in [*state["running"].values(), *state["queue"]]:
        for key in ("share", "vendor", "mig", "mig_profile", "memory_mib", "cores_pct"):
            job.pop(key, None)
    path.write_text(json.dumps(state))


def test_a_state_from_before_shares_still_loads_and_its_jobs_keep_their_gpus(tmp_path):
    backend = make_backend(tmp_path, gpus=2)
    holder = backend.submit(job_spec("holder", SHOW_ENV, gpus=2))
    waiter = backend.submit(job_spec("waiter", SHOW_ENV, gpus=1))
    ids = [holder, waiter]
    try:
        env_of(backend, holder, "holder")
        strip_share_keys(tmp_path)
        backend = make_backend(tmp_path, gpus=2)  # as after an upgrade

        assert state_of(backend, waiter) == JobState.PENDING
        assert backend.inventory()[0].gpus_free == 0

        backend.cancel(holder)

        assert pinned(env_of(backend, waiter, "waiter")) == {"CUDA_VISIBLE_DEVICES": "0"}
        assert json.loads((tmp_path / "alloc.json").read_text())["running"][waiter]["gpus"] == [0]
    finally:
        cancel_all(backend, ids)


def test_a_whole_job_from_before_shares_holds_its_gpu_against_slices(tmp_path, monkeypatch):
    backend = backend_on(tmp_path, monkeypatch, nvidia_smi=str(H200_REPLAY))
    old = backend.submit(job_spec("old", SHOW_ENV))
    ids = [old]
    try:
        env_of(backend, old, "old")
        strip_share_keys(tmp_path / "state")

        ids.append(sliced := backend.submit(slice_of("sliced", 1_000, 10)))

        assert state_of(backend, sliced) == JobState.PENDING

        backend.cancel(old)

        assert env_of(backend, sliced, "sliced")["PORTAL_GPU_MEMORY_MIB"] == "1000"
    finally:
        cancel_all(backend, ids)
