"""Job templates: injection attempts stay inert, what each launcher receives, and checkpoints kept
across a preemption warning and resumed in the next attempt."""

import re
import shutil
import signal
import time
from pathlib import Path

import pytest

from jobs.job_templates import TEMPLATES, TemplateInvalid, render_template
from tests.job_templates_support import (
    MINIMAL,
    RESUMED,
    SLURM_ENV,
    calls_of,
    environments_of,
    invalid,
    make_fakebin,
    markers,
    run_script,
    start_script,
)

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
    checkpoint = tmp_path / "work" / "checkpoints" / "job-4242" / "state.cpt"  # no PORTAL_CHECKPOINT_DIR
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
        "-cpt",
        "15",
        "-cpo",
        str(checkpoint),
        "-cpi",
        "-nsteps",
        "500",
    ]


def test_lammps_gets_accelerator_flags_and_variables(tmp_path):
    params = {"input": "in.lj", "variables": {"n": "20", "T": "1.5"}}
    script = render_template("lammps", params, nodes=1, gpus_per_node=2, backend_kind="local")
    checkpoints = tmp_path / "ck"
    done, calls = run_script(script, tmp_path, env={"PORTAL_CHECKPOINT_DIR": str(checkpoints)})
    assert done.returncode == 0, done.stderr
    assert calls_of(calls, "mpirun")[0][:2] == ["-np", "2"]
    # LAMMPS reads the portal's driver, which includes the job's input; the input takes the rest.
    assert calls_of(calls, "lmp") == [
        [
            *("-k", "on", "g", "2", "-sf", "kk", "-in", f"{checkpoints}/portal-run.lmp"),
            *("-var", "portal_resume", "0", "-var", "portal_restart", "none"),
            *("-var", "portal_checkpoint", f"{checkpoints}/portal-checkpoint.lmp"),
            *("-var", "n", "20", "-var", "T", "1.5"),
        ]
    ]
    assert (checkpoints / "portal-run.lmp").read_text().splitlines()[1] == "include in.lj"
    cpu = render_template(
        "lammps", {"input": "in.lj", "accelerator": "none"}, nodes=1, gpus_per_node=2, backend_kind="local"
    )
    assert 'lmp -in "$lammps_input"' in cpu
    assert "lammps_input=in.lj\n" in cpu


def test_lammps_runs_the_job_s_input_itself_where_it_cannot_name_the_checkpoints(tmp_path):
    script = render_template("lammps", {"input": "in.lj"}, nodes=1, gpus_per_node=1, backend_kind="local")
    odd = tmp_path / "my checkpoints"  # LAMMPS would split the name at the blank
    done, calls = run_script(script, tmp_path, env={"PORTAL_CHECKPOINT_DIR": str(odd)})
    assert done.returncode == 0, done.stderr
    assert "the job runs without checkpoints" in done.stderr
    (lmp,) = calls_of(calls, "lmp")
    assert lmp[lmp.index("-in") + 1] == "in.lj"
    assert lmp[lmp.index("portal_checkpoint") + 1] == "/dev/null"


CONTROL_DICT = """FoamFile { version 2.0; format ascii; class dictionary; object controlDict; }
application icoFoam;
startFrom startTime;
startTime 0;
stopAt endTime;
endTime 0.5;
deltaT 0.005;
writeControl timeStep;
writeInterval 20;
runTimeModifiable true;
"""
# What the template sets in the case's controlDict for a run, with the default interval.
WRITE_EVERY_15_MINUTES = [
    ["foamDictionary", "-entry", "writeControl", "-set", "clockTime", "system/controlDict"],
    ["foamDictionary", "-entry", "writeInterval", "-set", "900", "system/controlDict"],
    ["foamDictionary", "-entry", "runTimeModifiable", "-set", "true", "system/controlDict"],
]


def openfoam_case(tmp_path: Path, *, with_dict: bool) -> tuple[Path, Path]:
    bashrc = tmp_path / "openfoam" / "etc" / "bashrc"
    bashrc.parent.mkdir(parents=True)
    # Like the real one: reads unset variables and its last command may fail.
    bashrc.write_text('export WM_PROJECT=OpenFOAM\n: "$FOAM_UNSET_THING"\nfalse\n')
    case = tmp_path / "work" / "cases" / "cavity"
    (case / "system").mkdir(parents=True)
    (case / "system" / "controlDict").write_text(CONTROL_DICT)
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
        *WRITE_EVERY_15_MINUTES,
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
    # The decomposed case lives in the checkpoint directory, linked into the case; the case's
    # controlDict is as it was.
    checkpoints = case / "checkpoints" / "job-4242"
    assert {path.name for path in checkpoints.glob("processor*")} == {f"processor{n}" for n in range(12)}
    assert (case / "processor11").resolve() == (checkpoints / "processor11").resolve()
    assert (case / "system" / "controlDict").read_text() == CONTROL_DICT


def test_openfoam_sets_the_count_in_a_case_s_own_dict(tmp_path):
    bashrc, _ = openfoam_case(tmp_path, with_dict=True)
    params = {"case_dir": "cases/cavity", "solver": "icoFoam", "bashrc": str(bashrc), "ranks_per_node": 6}
    script = render_template("openfoam", params, nodes=1, gpus_per_node=1, backend_kind="local")
    done, calls = run_script(script, tmp_path)
    assert done.returncode == 0, done.stderr
    assert calls_of(calls, "foamDictionary") == [
        ["-entry", "numberOfSubdomains", "-set", "6", "system/decomposeParDict"],
        *(call[1:] for call in WRITE_EVERY_15_MINUTES),
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


# --- Preemption: checkpoint on the warning, resume in the next attempt ---------------------------
#
# Each family runs twice against stand-ins that behave like their tools: attempt 1 gets the
# warning (USR1, as Slurm sends it to the batch shell) and must save, print the marker and exit
# promptly; attempt 2 must resume from that checkpoint. FAKE_MINUTE_S makes a "minute" short.

WARNED = 128 + signal.SIGUSR1  # a job stopped on the warning exits as one killed by it
FAST = {"FAKE_MINUTE_S": "0.3", "PORTAL_CHECKPOINT_POLL_S": "0.1", "PORTAL_PREEMPT_SIGNAL": "USR1"}

# A training program that keeps the contract (README, "The checkpoint contract for job scripts").
TRAIN = """
import os, signal, sys, time

path = os.path.join(os.environ["PORTAL_CHECKPOINT_DIR"], "model.pt")
step = 0
if os.path.exists(path):
    step = int(open(path).read())
    print(f"PORTAL_RESUMED {int(time.time())} {path} step {step}", flush=True)
stopping = []
signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))
every_s = int(os.environ["PORTAL_CHECKPOINT_MINUTES"]) * 60


def save():
    with open(path + ".tmp", "w") as out:
        out.write(str(step))
    os.replace(path + ".tmp", path)  # whole or not at all
    print(f"PORTAL_CHECKPOINT {int(time.time())} step {step}", flush=True)


print(f"training from step {step}", flush=True)
saved = time.monotonic()
while step < int(os.environ["TRAIN_STEPS"]):
    if stopping:
        save()
        sys.exit(0)
    time.sleep(0.01)
    step += 1
    if time.monotonic() - saved >= every_s:
        save()
        saved = time.monotonic()
save()
"""


def test_torchrun_hands_the_warning_to_the_training_which_resumes(tmp_path):
    script = render_template(
        "torchrun", {"script": "train.py"}, nodes=1, gpus_per_node=2, backend_kind="slurm"
    )
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text(TRAIN)
    checkpoints = tmp_path / "scratch" / "checkpoints" / "job-1"
    env = {**SLURM_ENV, **FAST, "PORTAL_CHECKPOINT_DIR": str(checkpoints), "TRAIN_STEPS": "100000"}

    job = start_script(script, tmp_path, env={**env, "PORTAL_ATTEMPT": "1"}, cwd=work)
    job.wait_for(lambda: "training from step 0" in job.out, "the training's start")
    job.signal(signal.SIGUSR1)
    assert job.finish(timeout_s=20) == WARNED, job.err
    saved = int((checkpoints / "model.pt").read_text())
    ((epoch, what),) = markers(job.out)
    assert what == f"step {saved}"
    assert int(job.started_at) <= epoch <= time.time()
    (environ,) = environments_of(tmp_path, "torchrun")
    assert (environ["PORTAL_CHECKPOINT_DIR"], environ["PORTAL_CHECKPOINT_MINUTES"]) == (
        str(checkpoints),
        "15",
    )

    job = start_script(
        script, tmp_path, env={**env, "PORTAL_ATTEMPT": "2", "TRAIN_STEPS": str(saved + 20)}, cwd=work
    )
    assert job.finish(timeout_s=20) == 0, job.err
    ((_, resumed),) = RESUMED.findall(job.out)
    assert resumed == f"{checkpoints}/model.pt step {saved}"
    assert environments_of(tmp_path, "torchrun")[0]["PORTAL_ATTEMPT"] == "2"


def test_gromacs_checkpoints_on_its_interval_and_on_the_warning_then_resumes(tmp_path):
    params = {"checkpoint_minutes": 1}
    script = render_template("gromacs", params, nodes=1, gpus_per_node=2, backend_kind="slurm")
    checkpoints = tmp_path / "ck"
    cpt = checkpoints / "state.cpt"
    env = {**SLURM_ENV, **FAST, "PORTAL_CHECKPOINT_DIR": str(checkpoints)}

    job = start_script(script, tmp_path, env=env)
    # mdrun writes one every -cpt minutes; the script reports each once it is there.
    job.wait_for(lambda: markers(job.out), "a periodic checkpoint's marker")
    job.signal(signal.SIGUSR1)
    assert job.finish(timeout_s=20) == WARNED, job.err
    # srun would kill its tasks: Slurm itself hands mdrun the TERM, and mdrun saves and stops.
    assert calls_of(job.calls, "scancel") == [["--signal=TERM", "4242"]]
    stopped = int(re.search(r"stopped at step (\d+) on a signal", job.out)[1])
    assert int(cpt.read_text()) == stopped
    found = markers(job.out)
    assert len(found) >= 2 and {what for _, what in found} == {"state.cpt"}
    assert found[-1][0] == int(cpt.stat().st_mtime)
    assert (tmp_path / "work" / "md.cpt").read_text() == str(stopped)  # for a later job's -cpi

    job = start_script(script, tmp_path, env={**env, "PORTAL_ATTEMPT": "2", "FAKE_STEPS": str(stopped + 30)})
    assert job.finish(timeout_s=20) == 0, job.err
    (mdrun,) = calls_of(job.calls, "gmx_mpi")
    # This working directory has no md.log to append to: mdrun writes new parts.
    assert mdrun[mdrun.index("-cpi") :] == ["-cpi", str(cpt), "-noappend"]
    assert f"mdrun: resuming from {cpt} at step {stopped}" in job.out
    assert RESUMED.findall(job.out)[0][1] == str(cpt)


def test_lammps_writes_restarts_stops_at_the_warning_and_resumes(tmp_path):
    params = {"input": "in.lj", "checkpoint_minutes": 1}
    script = render_template("lammps", params, nodes=1, gpus_per_node=2, backend_kind="local")
    checkpoints = tmp_path / "ck"
    env = {**FAST, "PORTAL_CHECKPOINT_DIR": str(checkpoints)}

    job = start_script(script, tmp_path, env=env)
    # A restart file is whole once LAMMPS has begun the next one.
    job.wait_for(lambda: markers(job.out), "a periodic restart file's marker")
    assert markers(job.out)[0][1] == "restart.a"
    job.signal(signal.SIGUSR1)
    assert job.finish(timeout_s=20) == WARNED, job.err
    halted = int(re.search(r"met on step (\d+)", job.out)[1])
    assert int((checkpoints / "restart.final").read_text()) == halted
    assert markers(job.out)[-1][1] == "restart.final"
    assert (checkpoints / "latest").read_text() == "restart.final\n"

    job = start_script(script, tmp_path, env={**env, "PORTAL_ATTEMPT": "2", "FAKE_STEPS": str(halted + 30)})
    assert job.finish(timeout_s=20) == 0, job.err
    resume = checkpoints / "restart.resume"
    (lmp,) = calls_of(job.calls, "lmp")
    assert lmp[lmp.index("portal_resume") + 1 : lmp.index("portal_restart") + 2] == [
        "1",
        "-var",
        "portal_restart",
        str(resume),
    ]
    assert f"lmp: read_restart {resume}: step {halted}" in job.out
    assert RESUMED.findall(job.out)[0][1] == str(resume)
    assert not (checkpoints / "restart.final").exists()


def test_openfoam_writes_times_stops_at_the_warning_and_resumes(tmp_path):
    _, case = openfoam_case(tmp_path, with_dict=False)
    params = {"case_dir": "cases/cavity", "solver": "icoFoam", "ranks_per_node": 2, "checkpoint_minutes": 1}
    script = render_template("openfoam", params, nodes=1, gpus_per_node=2, backend_kind="local")
    checkpoints = tmp_path / "ck"
    env = {**FAST, "PORTAL_CHECKPOINT_DIR": str(checkpoints)}

    job = start_script(script, tmp_path, env=env)
    job.wait_for(lambda: markers(job.out), "a periodic time directory's marker")
    job.signal(signal.SIGUSR1)
    assert job.finish(timeout_s=20) == WARNED, job.err
    stopped = re.search(r"stopAt writeNow: wrote time (\d+)", job.out)[1]
    assert markers(job.out)[-1][1] == f"time {stopped}"
    for proc in ("processor0", "processor1"):
        assert (checkpoints / proc / stopped / "U").read_text() == stopped
    assert (checkpoints / "latest").read_text() == f"{stopped}\n"
    assert (case / "system" / "controlDict").read_text() == CONTROL_DICT  # no stopAt writeNow left
    assert calls_of(job.calls, "reconstructPar") == []  # no time for it: the next attempt goes on

    job = start_script(script, tmp_path, env={**env, "PORTAL_ATTEMPT": "2", "FAKE_STEPS": "20"})
    assert job.finish(timeout_s=20) == 0, job.err
    assert calls_of(job.calls, "decomposePar") == []  # the decomposed case is the checkpoint's
    assert ["-entry", "startTime", "-set", stopped, "system/controlDict"] in calls_of(
        job.calls, "foamDictionary"
    )
    assert f"Starting time loop from {stopped}" in job.out
    assert RESUMED.findall(job.out)[0][1] == f"time {stopped}"
    assert calls_of(job.calls, "reconstructPar") == [["-latestTime"]]
    assert (case / "system" / "controlDict").read_text() == CONTROL_DICT


def test_a_warning_before_the_application_starts_stops_the_job_at_once(tmp_path):
    # grompp in the foreground: the handler runs when it returns, and mdrun never starts.
    params = {"mdp": "md.mdp", "coordinates": "c.gro", "topology": "t.top"}
    script = render_template("gromacs", params, nodes=1, gpus_per_node=1, backend_kind="kubernetes")
    script = script.replace("gmx_mpi grompp", "kill -USR1 $$; gmx_mpi grompp", 1)
    done, calls = run_script(script, tmp_path, env={"PORTAL_CHECKPOINT_DIR": str(tmp_path / "ck")})
    assert done.returncode == WARNED
    assert [call[0] for call in calls] == ["gmx_mpi"]  # grompp only


# A LAMMPS input that keeps the portal's contract (README): it resumes from ${portal_restart},
# includes ${portal_checkpoint} once its box exists and runs `run N upto`.
PORTAL_AWARE_INPUT = """variable portal_resume index 0
variable portal_checkpoint index /dev/null
units lj
atom_style atomic
if "${portal_resume}" then "read_restart ${portal_restart}" else "lattice fcc 0.8442" &
  "region box block 0 5 0 5 0 5" "create_box 1 box" "create_atoms 1 box" "mass 1 1.0" &
  "velocity all create 3.0 87287 loop geom"
pair_style lj/cut 2.5
pair_coeff 1 1 1.0 1.0 2.5
fix 1 all nve
thermo 100
include ${portal_checkpoint}
run ${steps} upto
print "done at step $(step)"
"""


def test_real_lammps_halts_at_the_warning_and_resumes_from_its_restart_file(tmp_path):
    # The files the template writes for LAMMPS, read by LAMMPS itself (CI installs Debian's lammps).
    assert shutil.which("lmp"), "LAMMPS is required for this test: apt-get install -y lammps"
    fakebin = make_fakebin(tmp_path, real=("lmp",))
    work = tmp_path / "work"
    work.mkdir()
    (work / "in.lj").write_text(PORTAL_AWARE_INPUT)
    checkpoints = tmp_path / "ck"
    env = {
        # After the stand-ins, the system's tools: a lone MPI process starts Open MPI's orted.
        "PATH": f"{fakebin}:/usr/bin:/bin",
        "PORTAL_CHECKPOINT_DIR": str(checkpoints),
        "PORTAL_PREEMPT_SIGNAL": "USR1",
        "OMP_NUM_THREADS": "1",
    }

    def script(steps: int) -> str:
        params = {
            "input": "in.lj",
            "binary": "lmp",
            "accelerator": "none",
            "variables": {"steps": str(steps)},
        }
        return render_template("lammps", params, nodes=1, gpus_per_node=1, backend_kind="local")

    job = start_script(script(10**7), tmp_path, env=env, cwd=work)
    job.wait_for(lambda: re.search(r"^\s+200 ", job.out, re.M), "LAMMPS's step 200", timeout_s=60)
    job.signal(signal.SIGUSR1)
    assert job.finish(timeout_s=60) == WARNED, job.out + job.err
    halted = int(re.search(r"Fix halt condition for fix-id portal_halt met on step (\d+)", job.out)[1])
    # The first restart file at step 100, the last at the halt: both reported once whole.
    assert [what for _, what in markers(job.out)] == ["restart.a", "restart.final"]
    assert (checkpoints / "latest").read_text() == "restart.final\n"

    job = start_script(script(halted + 200), tmp_path, env={**env, "PORTAL_ATTEMPT": "2"}, cwd=work)
    assert job.finish(timeout_s=60) == 0, job.out + job.err
    assert "Reading restart file ..." in job.out
    assert RESUMED.findall(job.out)[0][1] == str(checkpoints / "restart.resume")
    assert f"done at step {halted + 200}" in job.out
