"""Job templates of the Python family (python, torchrun, horovod): what each launcher receives on
each backend, the vendor's variables handed to torchrun's workers, a virtual environment."""

import shutil

import pytest

from jobs.job_templates import render_template
from tests.job_templates_support import (
    SLURM_ENV,
    calls_of,
    environments_of,
    run_script,
)

# --- What the launchers receive -----------------------------------------------------------------


def test_torchrun_on_several_slurm_nodes_meets_on_the_first_node(tmp_path):
    script = render_template(
        "torchrun", {"script": "train.py"}, nodes=3, gpus_per_node=4, backend_kind="slurm"
    )
    done, calls = run_script(script, tmp_path, env=SLURM_ENV)
    assert done.returncode == 0, done.stderr
    assert calls_of(calls, "scontrol") == [["show", "hostnames", "node-[a-c]"]]
    (srun,) = calls_of(calls, "srun")
    assert srun[:4] == ["--nodes=3", "--ntasks=3", "--ntasks-per-node=1", "--cpus-per-task=16"]
    assert srun[4] == "torchrun"
    (torchrun,) = calls_of(calls, "torchrun")
    assert "--nnodes=3" in torchrun
    assert "--nproc_per_node=4" in torchrun
    assert "--rdzv_backend=c10d" in torchrun
    assert "--rdzv_endpoint=node-a:29500" in torchrun
    assert "--rdzv_id=4242" in torchrun
    assert torchrun[-1] == "train.py"


@pytest.mark.parametrize(("index", "is_host"), [("0", "1"), ("2", "0")])
def test_torchrun_on_kubernetes_pods_meets_at_pod_zero(index, is_host, tmp_path):
    script = render_template(
        "torchrun", {"script": "train.py"}, nodes=3, gpus_per_node=8, backend_kind="kubernetes"
    )
    env = {"PORTAL_RDZV_HOST": "job-abc-0.job-abc", "JOB_COMPLETION_INDEX": index}
    done, calls = run_script(script, tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    (torchrun,) = calls_of(calls, "torchrun")
    assert "--nnodes=3" in torchrun
    assert "--nproc_per_node=8" in torchrun
    assert "--rdzv_endpoint=job-abc-0.job-abc:29500" in torchrun
    assert f"--rdzv_conf=is_host={is_host}" in torchrun


# What the local backend pins each vendor's job with (clusters.shares.VISIBLE_DEVICES), and the
# scenario's NCCL_* settings, as the backend exports them before the script runs.
PINNED = {
    "nvidia": {"CUDA_VISIBLE_DEVICES": "2,3"},
    "amd": {"ROCR_VISIBLE_DEVICES": "2,3", "HIP_VISIBLE_DEVICES": "0,1"},
    "hygon": {"HIP_VISIBLE_DEVICES": "2,3"},
    "huawei": {"ASCEND_RT_VISIBLE_DEVICES": "2,3"},
    "cambricon": {"MLU_VISIBLE_DEVICES": "2,3"},
}
SCENARIO_ENV = {"NCCL_SOCKET_IFNAME": "^lo,docker0", "NCCL_IB_DISABLE": "0"}
# What reaches torchrun, and so its workers, on each vendor's devices beyond the above; None: unset.
REACHES_TORCHRUN = {
    "nvidia": {"PORTAL_DIST_BACKEND": "nccl", "HSA_FORCE_FINE_GRAIN_PCIE": None, "HCCL_SOCKET_IFNAME": None},
    "amd": {"PORTAL_DIST_BACKEND": "nccl", "HSA_FORCE_FINE_GRAIN_PCIE": "1", "HCCL_SOCKET_IFNAME": None},
    "hygon": {"PORTAL_DIST_BACKEND": "nccl", "HSA_FORCE_FINE_GRAIN_PCIE": "1", "HCCL_SOCKET_IFNAME": None},
    "huawei": {
        "PORTAL_DIST_BACKEND": "hccl",
        "HCCL_CONNECT_TIMEOUT": "1200",
        "HCCL_EXEC_TIMEOUT": "1836",
        "HCCL_SOCKET_IFNAME": "^lo,docker0",
        "HSA_FORCE_FINE_GRAIN_PCIE": None,
    },
    "cambricon": {
        "PORTAL_DIST_BACKEND": "cncl",
        "HSA_FORCE_FINE_GRAIN_PCIE": None,
        "HCCL_SOCKET_IFNAME": None,
    },
}


@pytest.mark.parametrize("vendor", list(PINNED))
def test_torchrun_hands_its_vendor_s_variables_to_the_workers(vendor, tmp_path):
    script = render_template(
        "torchrun", {"script": "train.py"}, nodes=1, gpus_per_node=2, backend_kind="local", vendor=vendor
    )
    done, calls = run_script(script, tmp_path, env={**SCENARIO_ENV, **PINNED[vendor]})
    assert done.returncode == 0, done.stderr
    (torchrun,) = calls_of(calls, "torchrun")
    assert torchrun[:3] == ["--standalone", "--nnodes=1", "--nproc_per_node=2"]
    assert torchrun[-1] == "train.py"
    (environ,) = environments_of(tmp_path, "torchrun")
    for name, value in REACHES_TORCHRUN[vendor].items():
        assert environ.get(name) == value, name
    # The backend's pinning and the scenario's NCCL_* (which RCCL reads too) pass through untouched.
    for name, value in {**SCENARIO_ENV, **PINNED[vendor]}.items():
        assert environ[name] == value, name
    assert "CUDA_VISIBLE_DEVICES" not in environ or vendor == "nvidia"


@pytest.mark.parametrize("vendor", ["amd", "huawei"])
def test_the_job_s_own_values_win_over_the_vendor_defaults(vendor, tmp_path):
    script = render_template(
        "torchrun", {"script": "train.py"}, nodes=1, gpus_per_node=2, backend_kind="local", vendor=vendor
    )
    own = {
        "HSA_FORCE_FINE_GRAIN_PCIE": "0",
        "HCCL_CONNECT_TIMEOUT": "600",
        "HCCL_EXEC_TIMEOUT": "0",
        "HCCL_SOCKET_IFNAME": "=eth1",
    }
    done, _ = run_script(script, tmp_path, env={**SCENARIO_ENV, **own})
    assert done.returncode == 0, done.stderr
    (environ,) = environments_of(tmp_path, "torchrun")
    for name, value in own.items():
        assert environ[name] == value, name


@pytest.mark.parametrize(
    ("visible", "nproc"),
    [({"ASCEND_RT_VISIBLE_DEVICES": "4,5,6"}, "3"), ({"ASCEND_RT_VISIBLE_DEVICES": "7"}, "1"), ({}, "2")],
)
def test_ascend_torchrun_starts_one_worker_per_visible_npu(visible, nproc, tmp_path):
    script = render_template(
        "torchrun", {"script": "train.py"}, nodes=1, gpus_per_node=2, backend_kind="local", vendor="huawei"
    )
    done, calls = run_script(script, tmp_path, env=visible)
    assert done.returncode == 0, done.stderr
    (torchrun,) = calls_of(calls, "torchrun")
    assert f"--nproc_per_node={nproc}" in torchrun
    # Without a NCCL_SOCKET_IFNAME to follow, HCCL chooses its interface itself.
    assert "HCCL_SOCKET_IFNAME" not in environments_of(tmp_path, "torchrun")[0]


def test_ascend_torchrun_on_several_slurm_nodes_carries_hccl_to_every_node(tmp_path):
    script = render_template(
        "torchrun", {"script": "train.py"}, nodes=3, gpus_per_node=8, backend_kind="slurm", vendor="huawei"
    )
    env = {**SLURM_ENV, **SCENARIO_ENV, "ASCEND_RT_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}
    done, calls = run_script(script, tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    (torchrun,) = calls_of(calls, "torchrun")
    assert "--nnodes=3" in torchrun
    assert "--nproc_per_node=8" in torchrun
    assert "--rdzv_endpoint=node-a:29500" in torchrun
    # srun hands the batch step's environment to each node's torchrun.
    (srun,) = environments_of(tmp_path, "srun")
    (environ,) = environments_of(tmp_path, "torchrun")
    for name in ("PORTAL_DIST_BACKEND", "HCCL_CONNECT_TIMEOUT", "HCCL_EXEC_TIMEOUT", "HCCL_SOCKET_IFNAME"):
        assert srun[name] == environ[name], name
    assert environ["PORTAL_DIST_BACKEND"] == "hccl"


def test_horovod_starts_one_rank_per_gpu_with_a_share_of_the_cpus(tmp_path):
    script = render_template(
        "horovod", {"script": "train.py"}, nodes=3, gpus_per_node=4, backend_kind="slurm"
    )
    done, calls = run_script(script, tmp_path, env=SLURM_ENV)
    assert done.returncode == 0, done.stderr
    (srun,) = calls_of(calls, "srun")
    assert srun == [
        "--nodes=3",
        "--ntasks=12",
        "--ntasks-per-node=4",
        "--cpus-per-task=4",
        "python3",
        "train.py",
    ]
    local = render_template("horovod", {"script": "train.py"}, nodes=1, gpus_per_node=4, backend_kind="local")
    done, calls = run_script(local, tmp_path)
    assert calls_of(calls, "mpirun") == [
        ["-np", "4", "-bind-to", "none", "-map-by", "slot", "python3", "train.py"]
    ]


def test_venv_is_activated_and_a_missing_one_stops_the_job(tmp_path):
    script = render_template(
        "python", {"script": "t.py", "venv": "venv"}, nodes=1, gpus_per_node=1, backend_kind="local"
    )
    work = tmp_path / "work"
    (work / "venv" / "bin").mkdir(parents=True)
    # An activate script that reads an unset variable and ends on a failing command, as real ones may.
    (work / "venv" / "bin" / "activate").write_text('echo "$NOT_SET_ANYWHERE" > activated\nfalse\n')
    done, calls = run_script(script, tmp_path, cwd=work)
    assert done.returncode == 0, done.stderr
    assert (work / "activated").exists()
    assert calls_of(calls, "python3") == [["t.py"]]

    shutil.rmtree(work / "venv")
    done, calls = run_script(script, tmp_path, cwd=work)
    assert done.returncode == 1
    assert "Virtual environment not found" in done.stderr
    assert calls_of(calls, "python3") == []
