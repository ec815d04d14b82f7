"""Job templates: injection attempts stay inert, and what each launcher receives."""

import shutil
from pathlib import Path

import pytest

from jobs.job_templates import TEMPLATES, TemplateInvalid, render_template
from tests.job_templates_support import MINIMAL, SLURM_ENV, calls_of, environments_of, invalid, run_script

# --- Injection ----------------------------------------------------------------------------------


def payloads(marker: Path) -> list[str]:
    return [
        f"; touch {marker}",
        f"$(touch {marker})",
        f"`touch {marker}`",
        f"' ; touch {marker} ; '",
        f'" ; touch {marker} ; "',
        f"$(echo pwned > {marker})",
        f"&& touch {marker} #",
        f"| touch {marker}",
        "*",
        "~root",
        "${IFS}x",
        "",
    ]


SHELL_BITS = [";", "$(id)", "`id`", "a\nb", "'", '"', "a b", "|", "&", ">", "\\", "x\n"]


@pytest.mark.parametrize("slug", list(TEMPLATES))
def test_schema_refuses_shell_syntax_in_every_restricted_string(slug):
    schema = TEMPLATES[slug].parameters_schema
    checked = 0
    for name, prop in schema["properties"].items():
        if prop.get("type") != "string":
            continue
        for bit in SHELL_BITS:
            params = {**MINIMAL[slug], name: "ok" + bit}
            assert f"parameters.{name}" in invalid(slug, params), (name, bit)
            checked += 1
    assert checked


@pytest.mark.parametrize("slug", ["python", "torchrun", "horovod"])
@pytest.mark.parametrize(("kind", "nodes"), [("local", 1), ("kubernetes", 1), ("slurm", 1), ("slurm", 3)])
def test_free_text_arguments_arrive_as_one_literal_argument_each(slug, kind, nodes, tmp_path):
    if nodes > 1 and kind not in TEMPLATES[slug].multi_node_backends:
        nodes = 1
    marker = tmp_path / "marker"
    args = payloads(marker)
    script = render_template(
        slug, {"script": "train.py", "args": args}, nodes=nodes, gpus_per_node=2, backend_kind=kind
    )
    done, calls = run_script(script, tmp_path, env=SLURM_ENV)
    assert done.returncode == 0, done.stderr
    program = "torchrun" if slug == "torchrun" else "python3"
    (argv,) = calls_of(calls, program)
    assert argv[-len(args) - 1 :] == ["train.py", *args]
    assert not marker.exists()


def test_the_harness_would_catch_an_unquoted_value(tmp_path):
    # The check above means something only if an injected command would run here.
    marker = tmp_path / "marker"
    done, _ = run_script(f"#!/bin/bash\npython3 train.py $(touch {marker})\n", tmp_path)
    assert done.returncode == 0
    assert marker.exists()


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


def test_gromacs_builds_the_run_input_then_runs_mdrun_per_gpu(tmp_path):
    params = {"mdp": "md.mdp", "coordinates": "conf.gro", "topology": "topol.top", "nsteps": 500}
    script = render_template("gromacs", params, nodes=2, gpus_per_node=4, backend_kind="slurm")
    done, calls = run_script(script, tmp_path, env=SLURM_ENV)
    assert done.returncode == 0, done.stderr
    assert [call[0] for call in calls] == ["gmx_mpi", "srun", "gmx_mpi"]
    grompp, mdrun = calls_of(calls, "gmx_mpi")
    assert grompp == [
        "grompp",
        "-f",
        "md.mdp",
        "-c",
        "conf.gro",
        "-p",
        "topol.top",
        "-o",
        "md.tpr",
        "-maxwarn",
        "0",
    ]
    assert calls_of(calls, "srun")[0][:4] == [
        "--nodes=2",
        "--ntasks=8",
        "--ntasks-per-node=4",
        "--cpus-per-task=4",
    ]
    assert mdrun == [
        "mdrun",
        "-deffnm",
        "md",
        "-ntomp",
        "4",
        "-nb",
        "gpu",
        "-pme",
        "auto",
        "-cpi",
        "-nsteps",
        "500",
    ]


def test_lammps_gets_accelerator_flags_and_variables(tmp_path):
    params = {"input": "in.lj", "variables": {"n": "20", "T": "1.5"}}
    script = render_template("lammps", params, nodes=1, gpus_per_node=2, backend_kind="local")
    done, calls = run_script(script, tmp_path)
    assert done.returncode == 0, done.stderr
    assert calls_of(calls, "mpirun")[0][:2] == ["-np", "2"]
    assert calls_of(calls, "lmp") == [
        ["-k", "on", "g", "2", "-sf", "kk", "-in", "in.lj", "-var", "n", "20", "-var", "T", "1.5"]
    ]
    cpu = render_template(
        "lammps", {"input": "in.lj", "accelerator": "none"}, nodes=1, gpus_per_node=2, backend_kind="local"
    )
    assert "lmp -in in.lj" in cpu


def openfoam_case(tmp_path: Path, *, with_dict: bool) -> tuple[Path, Path]:
    bashrc = tmp_path / "openfoam" / "etc" / "bashrc"
    bashrc.parent.mkdir(parents=True)
    # Like the real one: reads unset variables and its last command may fail.
    bashrc.write_text('export WM_PROJECT=OpenFOAM\n: "$FOAM_UNSET_THING"\nfalse\n')
    case = tmp_path / "work" / "cases" / "cavity"
    (case / "system").mkdir(parents=True)
    if with_dict:
        (case / "system" / "decomposeParDict").write_text("numberOfSubdomains 2;\nmethod hierarchical;\n")
    return bashrc, case


def test_openfoam_decomposes_into_one_part_per_rank_and_reconstructs(tmp_path):
    bashrc, case = openfoam_case(tmp_path, with_dict=False)
    params = {"case_dir": "cases/cavity", "solver": "simpleFoam", "bashrc": str(bashrc), "block_mesh": True}
    script = render_template("openfoam", params, nodes=3, gpus_per_node=4, backend_kind="slurm")
    done, calls = run_script(script, tmp_path, env=SLURM_ENV)
    assert done.returncode == 0, done.stderr
    assert calls == [
        ["blockMesh"],
        ["decomposePar", "-force"],
        [
            "srun",
            "--nodes=3",
            "--ntasks=12",
            "--ntasks-per-node=4",
            "--cpus-per-task=4",
            "simpleFoam",
            "-parallel",
        ],
        ["simpleFoam", "-parallel"],
        ["reconstructPar", "-latestTime"],
    ]
    generated = (case / "system" / "decomposeParDict").read_text()
    assert "numberOfSubdomains 12;" in generated
    assert "method scotch;" in generated


def test_openfoam_sets_the_count_in_a_case_s_own_dict(tmp_path):
    bashrc, _ = openfoam_case(tmp_path, with_dict=True)
    params = {"case_dir": "cases/cavity", "solver": "icoFoam", "bashrc": str(bashrc), "ranks_per_node": 6}
    script = render_template("openfoam", params, nodes=1, gpus_per_node=1, backend_kind="local")
    done, calls = run_script(script, tmp_path)
    assert done.returncode == 0, done.stderr
    assert calls_of(calls, "foamDictionary") == [
        ["-entry", "numberOfSubdomains", "-set", "6", "system/decomposeParDict"]
    ]
    assert calls_of(calls, "mpirun") == [
        ["-np", "6", "-bind-to", "none", "-map-by", "slot", "icoFoam", "-parallel"]
    ]


def test_openfoam_simple_decomposition_for_builds_without_scotch(tmp_path):
    _, case = openfoam_case(tmp_path, with_dict=False)
    params = {"case_dir": "cases/cavity", "solver": "icoFoam", "decompose_method": "simple"}
    script = render_template("openfoam", params, nodes=1, gpus_per_node=4, backend_kind="local")
    done, _ = run_script(script, tmp_path)
    assert done.returncode == 0, done.stderr
    generated = (case / "system" / "decomposeParDict").read_text()
    assert "method simple;" in generated
    assert "n (4 1 1);" in generated


def test_openfoam_stops_when_its_environment_is_missing(tmp_path):
    params = {"solver": "icoFoam", "bashrc": "/nonexistent/openfoam/etc/bashrc"}
    script = render_template("openfoam", params, nodes=1, gpus_per_node=1, backend_kind="local")
    done, calls = run_script(script, tmp_path)
    assert done.returncode == 1
    assert "OpenFOAM environment not found: /nonexistent/openfoam/etc/bashrc" in done.stderr
    assert calls == []


def test_template_render_validates_on_its_own():
    # No way to a script skips validation: the method checks as render_template does.
    with pytest.raises(TemplateInvalid) as raised:
        TEMPLATES["python"].render(params={"script": "$(id)"}, nodes=1, gpus_per_node=1, backend_kind="local")
    assert list(raised.value.errors) == ["parameters.script"]


def test_no_parameters_means_the_defaults():
    script = render_template("openfoam", None, nodes=1, gpus_per_node=2, backend_kind="local")
    assert "mpirun -np 2 -bind-to none -map-by slot simpleFoam -parallel" in script
