"""Job templates of the simulation codes (GROMACS, LAMMPS, OpenFOAM): what each tool is run with,
OpenFOAM's decomposition and its environment, the defaults without parameters."""

from jobs.job_templates import render_template
from tests.job_templates_support import (
    CONTROL_DICT,
    SLURM_ENV,
    calls_of,
    openfoam_case,
    run_script,
)

# --- What the launchers receive -----------------------------------------------------------------


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


# What the template sets in the case's controlDict for a run, with the default interval.
WRITE_EVERY_15_MINUTES = [
    ["foamDictionary", "-entry", "writeControl", "-set", "clockTime", "system/controlDict"],
    ["foamDictionary", "-entry", "writeInterval", "-set", "900", "system/controlDict"],
    ["foamDictionary", "-entry", "runTimeModifiable", "-set", "true", "system/controlDict"],
]


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


def test_no_parameters_means_the_defaults():
    script = render_template("openfoam", None, nodes=1, gpus_per_node=2, backend_kind="local")
    assert "mpirun -np 2 -bind-to none -map-by slot simpleFoam -parallel" in script
