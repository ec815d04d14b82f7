"""Job templates: injection attempts stay inert, and what each launcher receives."""

import shutil
from pathlib import Path

import pytest

from jobs.job_templates import TEMPLATES, TemplateInvalid, render_template
from tests.job_templates_support import MINIMAL, SLURM_ENV, calls_of, invalid, run_script

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
