"""The local cluster's devices: each vendor's tool output parsed as recorded
(tests/fixtures/accelerators/README.md says where each recording comes from), and discovery
through stand-ins for the tools on the PATH, which replay those recordings."""

import time

import pytest

from clusters.backends.base import BackendError, ClusterConfig
from clusters.backends.local import LocalBackend
from clusters.backends.local.devices import (
    Device,
    MigDevice,
    parse_cnmon_devices,
    parse_npu_smi_devices,
    parse_nvidia_smi_devices,
    parse_rocm_smi_devices,
    run_tool,
)
from tests.conftest import ROOT

RECORDED = ROOT / "tests" / "fixtures" / "accelerators"
H200 = ROOT / "tests" / "fixtures" / "nvidia-smi" / "h200"
H200_UUID = "GPU-75bdf912-4cc4-0a16-d75d-86bb37ecacb3"


def recorded(name: str) -> str:
    return (RECORDED / name).read_text()


def stand_ins(tmp_path, monkeypatch, *tools: str):
    """A folder on the PATH where each tool is the replay of its recording."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for tool in tools:
        (folder / tool).symlink_to(RECORDED / "replay.sh")
    monkeypatch.setenv("PATH", f"{folder}:/usr/bin:/bin")
    return folder


def discovered(tmp_path, nvidia_smi: str = "nvidia-smi-missing") -> LocalBackend:
    config = ClusterConfig(slug="local", kind="local", local_gpus=0, state_dir=str(tmp_path / "state"))
    return LocalBackend(config, nvidia_smi=nvidia_smi)


def test_the_real_h200_listing_is_one_whole_gpu_and_no_mig_device():
    gpus, migs = parse_nvidia_smi_devices((H200 / "nvidia-smi-L.txt").read_text())

    assert gpus == [Device("nvidia", 0, "NVIDIA H200", H200_UUID)]
    assert migs == []


def test_mig_devices_are_read_under_their_gpu_with_profile_and_uuid():
    gpus, migs = parse_nvidia_smi_devices(recorded("nvidia-smi-L-h200-mig.txt"))

    assert [gpu.index for gpu in gpus] == [0, 1, 2, 3]
    assert {gpu.name for gpu in gpus} == {"NVIDIA H200"}
    assert migs[:2] == [
        MigDevice(0, "3g.71gb", 0, "MIG-6f1e2d3c-4b5a-5968-8776-a5b4c3d2e1f0"),
        MigDevice(0, "3g.71gb", 1, "MIG-0a1b2c3d-4e5f-5a6b-9c8d-7e6f5a4b3c2d"),
    ]
    assert [(mig.gpu, mig.profile, mig.index) for mig in migs[2:]] == [(1, "1g.18gb", i) for i in range(7)]
    assert len({mig.uuid for mig in migs}) == 9 and all(mig.uuid.startswith("MIG-") for mig in migs)


def test_mig_uuids_of_drivers_before_r470_are_read_too():
    # NVIDIA's GPU Operator documentation (driver 460) shows them as MIG-GPU-<uuid>/<gi>/<ci>.
    text = (
        "GPU 0: A100-SXM4-40GB (UUID: GPU-5c89852c-d268-c3f3-1b07-005d5ae1dc3f)\n"
        "  MIG 1g.5gb Device 0: (UUID: MIG-GPU-5c89852c-d268-c3f3-1b07-005d5ae1dc3f/7/0)\n"
    )

    _gpus, [mig] = parse_nvidia_smi_devices(text)

    assert mig == MigDevice(0, "1g.5gb", 0, "MIG-GPU-5c89852c-d268-c3f3-1b07-005d5ae1dc3f/7/0")


def test_rocm_smi_cards_are_amd_devices_with_their_memory():
    devices = parse_rocm_smi_devices(recorded("rocm-smi-mi300x.json"))

    assert devices == [
        Device("amd", 0, "AMD Instinct MI300X OAM", memory_mib=196288),
        Device("amd", 1, "AMD Instinct MI300X OAM", memory_mib=196288),
    ]


def test_rocm_smi_json_is_found_after_a_warning_line_and_hygon_cards_are_left_to_hy_smi():
    text = "WARNING: the line some builds print first\n" + recorded("rocm-smi-mi300x.json")
    hygon = recorded("hy-smi-k100.json")

    assert [device.index for device in parse_rocm_smi_devices(text)] == [0, 1]
    assert parse_rocm_smi_devices(hygon) == []  # a Hygon host's rocm-smi lists its DCUs
    with pytest.raises(BackendError, match="no JSON object"):
        parse_rocm_smi_devices("rocm-smi: ERROR: No DRM devices available. Exiting")


def test_hy_smi_cards_are_hygon_dcus_with_their_memory_in_mib():
    devices = parse_rocm_smi_devices(recorded("hy-smi-k100.json"), vendor="hygon")

    assert devices == [Device("hygon", index, "K100_AI", memory_mib=65520) for index in range(4)]


def test_npu_smi_chips_are_ascend_npus_by_logic_id_and_mcus_are_not():
    devices = parse_npu_smi_devices(recorded("npu-smi-info-m-910b.txt"))

    assert devices == [Device("huawei", index, "Ascend 910B4") for index in range(8)]


def test_cnmon_cards_are_cambricon_mlus_with_their_memory():
    devices = parse_cnmon_devices(recorded("cnmon-mlu370.txt"))

    assert devices == [
        Device("cambricon", 0, "MLU370-X8", memory_mib=20638),
        Device("cambricon", 1, "MLU370-X8", memory_mib=20638),
    ]


def test_the_backend_finds_mig_devices_through_nvidia_smi(tmp_path, monkeypatch):
    folder = stand_ins(tmp_path, monkeypatch, "nvidia-smi")

    backend = discovered(tmp_path, str(folder / "nvidia-smi"))

    assert backend.gpus == [0, 1, 2, 3]
    assert backend.machine.split == {0, 1} and len(backend.machine.migs) == 9
    assert backend.health().detail.startswith("4 GPUs (2 split into 9 MIG devices); state in")
    assert backend.inventory()[0].gpus_free == 4


def test_the_real_h200_replay_is_one_whole_gpu_with_its_memory(tmp_path):
    backend = discovered(tmp_path, str(ROOT / "tests" / "nvidia_smi_replay.sh"))

    assert backend.machine.devices == (Device("nvidia", 0, "NVIDIA H200", H200_UUID, memory_mib=143771),)
    assert backend.machine.migs == ()
    partition = backend.inventory()[0]
    assert (partition.gpus_per_node, partition.gpus_free) == (1, 1)


@pytest.mark.parametrize(
    ("tools", "summary", "vendors"),
    [
        (("rocm-smi",), "2 AMD GPUs", {"amd"}),
        # On a Hygon host rocm-smi is Hygon's own: hy-smi alone says what the DCUs are.
        (("rocm-smi", "hy-smi"), "4 Hygon DCUs", {"hygon"}),
        (("npu-smi",), "8 Ascend NPUs", {"huawei"}),
        (("cnmon",), "2 Cambricon MLUs", {"cambricon"}),
        (
            ("nvidia-smi", "npu-smi", "cnmon"),
            "4 GPUs (2 split into 9 MIG devices), 8 Ascend NPUs, 2 Cambricon MLUs",
            {"nvidia", "huawei", "cambricon"},
        ),
    ],
)
def test_each_vendors_tool_on_the_path_adds_its_devices(tmp_path, monkeypatch, tools, summary, vendors):
    folder = stand_ins(tmp_path, monkeypatch, *tools)

    backend = discovered(tmp_path, str(folder / "nvidia-smi"))

    assert {device.vendor for device in backend.machine.devices} == vendors
    assert backend.health().detail.startswith(f"{summary}; state in")
    assert backend.inventory()[0].gpus_per_node == len(backend.machine.devices)


def test_a_tool_that_fails_or_hangs_adds_no_device_and_is_not_waited_on(tmp_path):
    hangs = tmp_path / "hangs"
    hangs.write_text("#!/bin/sh\nexec sleep 60\n")
    hangs.chmod(0o755)
    fails = tmp_path / "fails"
    fails.write_text("#!/bin/sh\necho 'npu-smi: dcmi module initialize failed' >&2\nexit 1\n")
    fails.chmod(0o755)

    started = time.monotonic()
    assert run_tool(str(hangs), ("info", "-m"), timeout_s=0.5) is None
    assert time.monotonic() - started < 5
    assert run_tool(str(fails), ("info", "-m")) is None
    assert run_tool(str(tmp_path / "missing"), ()) is None


def test_a_machine_without_any_tool_has_no_device(tmp_path, monkeypatch):
    stand_ins(tmp_path, monkeypatch)

    backend = discovered(tmp_path)

    assert backend.machine.devices == () and backend.gpus == []
    assert backend.health().detail.startswith("0 GPUs; state in")
