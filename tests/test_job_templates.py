"""Job templates (jobs/job_templates): the published schemas, the scripts rendered per backend,
and that no parameter value reaches the shell as code.

Scripts are executed with bash against stand-ins for the real tools: tiny executables named
torchrun, mpirun, srun, scontrol, gmx_mpi, lmp … that record the argv they were given (what
the real command would receive) and, for the launchers, start the program they launch.
"""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from jobs.job_templates import BACKEND_KINDS, TEMPLATES, TemplateInvalid, render_template, templates_for

# The least each template needs, and every parameter set.
MINIMAL = {
    "python": {"script": "train.py"},
    "torchrun": {"script": "train.py"},
    "horovod": {"script": "train.py"},
    "gromacs": {},
    "lammps": {"input": "in.lj"},
    "openfoam": {},
}
FULL = {
    "python": {"script": "src/train.py", "args": ["--lr", "3e-4", "a b"], "venv": "venv"},
    "torchrun": {
        "script": "src/train.py",
        "args": ["--epochs=2", "it's"],
        "venv": ".venv",
        "rdzv_port": 29400,
        "max_restarts": 2,
    },
    "horovod": {"script": "train.py", "args": ["--batch", "64"], "venv": "env/hvd"},
    "gromacs": {
        "deffnm": "run1/md",
        "mdp": "md.mdp",
        "coordinates": "conf.gro",
        "topology": "topol.top",
        "maxwarn": 1,
        "nonbonded": "cpu",
        "pme": "cpu",
        "nsteps": 1000,
        "resume": False,
    },
    "lammps": {
        "input": "in.lj",
        "binary": "lmp_mpi",
        "accelerator": "gpu",
        "variables": {"n": "10", "T": "1.5e0"},
        "ranks_per_node": 8,
    },
    "openfoam": {
        "case_dir": "cases/cavity",
        "solver": "icoFoam",
        "bashrc": "/opt/openfoam11/etc/bashrc",
        "block_mesh": True,
        "decompose_method": "simple",
        "ranks_per_node": 2,
    },
}

FAKE_TOOLS = [
    "torchrun",
    "mpirun",
    "srun",
    "scontrol",
    "python3",
    "gmx_mpi",
    "lmp",
    "lmp_mpi",
    "lmp_kokkos_cuda_mpi",
    "blockMesh",
    "decomposePar",
    "foamDictionary",
    "reconstructPar",
    "icoFoam",
    "simpleFoam",
]
# Real tools the scripts use themselves; touch is there so that an injected `touch` would work.
REAL_TOOLS = ["sed", "cat", "touch"]

FAKE = """#!{python}
import json, os, sys

name = os.path.basename(sys.argv[0])
args = sys.argv[1:]
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(json.dumps([name, *args]) + "\\n")
if name == "scontrol" and args[:2] == ["show", "hostnames"]:
    print("node-a\\nnode-b\\nnode-c")
elif name in ("srun", "mpirun"):
    # Skip the launcher's own options and start the program once, as rank 0 would be.
    i = 0
    while i < len(args) and args[i].startswith("-"):
        i += 2 if name == "mpirun" else 1
    os.execvp(args[i], args[i:])
"""


def cases():
    for slug, template in TEMPLATES.items():
        for kind in BACKEND_KINDS:
            shapes = [1, 3] if kind in template.multi_node_backends else [1]
            for nodes in shapes:
                for label, params in (("minimal", MINIMAL[slug]), ("full", FULL[slug])):
                    yield pytest.param(slug, kind, nodes, params, id=f"{slug}-{kind}-{nodes}n-{label}")


def make_fakebin(tmp_path: Path) -> Path:
    fakebin = tmp_path / "fakebin"
    if fakebin.exists():
        return fakebin
    fakebin.mkdir()
    for name in FAKE_TOOLS:
        tool = fakebin / name
        tool.write_text(FAKE.format(python=sys.executable))
        tool.chmod(0o755)
    for name in REAL_TOOLS:
        (fakebin / name).symlink_to(shutil.which(name))
    return fakebin


def run_script(script: str, tmp_path: Path, *, env: dict[str, str] | None = None, cwd: Path | None = None):
    """Run the script with bash, only the fakes on PATH; the completed process and the calls made."""
    fakebin = make_fakebin(tmp_path)
    log = tmp_path / "calls.jsonl"
    log.write_text("")
    path = tmp_path / "job.sh"
    path.write_text(script)
    work = cwd or tmp_path / "work"
    work.mkdir(exist_ok=True)
    done = subprocess.run(
        ["/bin/bash", str(path)],
        cwd=work,
        env={"PATH": str(fakebin), "FAKE_LOG": str(log), "OMP_NUM_THREADS": "4", **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    return done, calls


def calls_of(calls, name):
    return [call[1:] for call in calls if call[0] == name]


def invalid(slug, params, *, nodes=1, gpus_per_node=4, backend_kind="slurm") -> dict[str, list[str]]:
    with pytest.raises(TemplateInvalid) as raised:
        render_template(slug, params, nodes=nodes, gpus_per_node=gpus_per_node, backend_kind=backend_kind)
    return raised.value.errors


SLURM_ENV = {"SLURM_JOB_NODELIST": "node-[a-c]", "SLURM_JOB_ID": "4242", "SLURM_CPUS_ON_NODE": "16"}


# --- Catalogue and schemas ----------------------------------------------------------------------


def test_templates_for_each_seeded_scenario():
    assert [t.slug for t in templates_for("ai-training")] == ["python", "torchrun", "horovod"]
    assert [t.slug for t in templates_for("molecular-dynamics")] == ["gromacs", "lammps"]
    assert [t.slug for t in templates_for("cfd")] == ["openfoam"]
    assert templates_for("no-such-scenario") == []


def test_multi_node_templates_and_where_they_span_nodes():
    assert not TEMPLATES["python"].multi_node
    assert TEMPLATES["torchrun"].multi_node_backends == {"slurm", "kubernetes"}
    for slug in ("horovod", "gromacs", "lammps", "openfoam"):
        assert TEMPLATES[slug].multi_node_backends == {"slurm"}


def string_schemas(schema):
    """Every schema of a string value inside a parameters schema, with the parameter's name."""
    for name, prop in schema["properties"].items():
        for sub in (
            prop,
            prop.get("items", {}),
            prop.get("additionalProperties", {}),
            prop.get("propertyNames"),
        ):
            if sub and (sub.get("type") == "string" or "pattern" in sub):
                yield name, sub


@pytest.mark.parametrize("slug", list(TEMPLATES))
def test_schema_is_strict_draft_2020_12(slug):
    schema = TEMPLATES[slug].parameters_schema
    Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["additionalProperties"] is False
    for name, sub in string_schemas(schema):
        assert "enum" in sub or ("pattern" in sub and ("maxLength" in sub or "{0," in sub["pattern"])), name
        if "pattern" in sub:
            assert sub["pattern"].startswith("^") and sub["pattern"].endswith("$"), name
    for name, prop in schema["properties"].items():
        assert prop.get("title") or prop.get("description"), f"{name} has neither title nor description"
        if "default" in prop:
            Draft202012Validator(prop).validate(prop["default"])


# --- Rendering ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("slug", "kind", "nodes", "params"), list(cases()))
def test_renders_a_script_that_bash_and_shellcheck_accept(slug, kind, nodes, params, tmp_path):
    script = render_template(slug, params, nodes=nodes, gpus_per_node=4, backend_kind=kind)
    assert script.startswith("#!/bin/bash\n")
    assert "set -euo pipefail\n" in script
    path = tmp_path / "job.sh"
    path.write_text(script)
    syntax = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stderr
    # Required, not skipped: CI installs shellcheck (apt-get install shellcheck).
    shellcheck = shutil.which("shellcheck")
    assert shellcheck, "shellcheck is required for these tests: apt-get install -y shellcheck"
    lint = subprocess.run(
        [shellcheck, "-S", "warning", "-s", "bash", str(path)], capture_output=True, text=True
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_defaults_from_the_schema_are_applied():
    script = render_template("torchrun", {"script": "t.py"}, nodes=2, gpus_per_node=8, backend_kind="slurm")
    assert '--rdzv_endpoint="$rdzv_host":29500' in script
    assert "--max_restarts=0" in script
    gromacs = render_template("gromacs", {}, nodes=1, gpus_per_node=1, backend_kind="local")
    assert "gmx_mpi mdrun -deffnm md " in gromacs
    assert "-nb gpu -pme auto -cpi" in gromacs
    assert "grompp" not in gromacs


def test_numbers_are_rendered_as_whole_numbers():
    # JSON Schema counts 29400.0 as an integer; the script must still say 29400.
    script = render_template(
        "torchrun", {"script": "t.py", "rdzv_port": 29400.0}, nodes=2, gpus_per_node=1, backend_kind="slurm"
    )
    assert ":29400 " in script
    assert "29400.0" not in script


def test_single_node_torchrun_uses_a_standalone_rendezvous():
    for kind in BACKEND_KINDS:
        script = render_template("torchrun", {"script": "t.py"}, nodes=1, gpus_per_node=2, backend_kind=kind)
        assert "torchrun --standalone --nnodes=1 --nproc_per_node=2 " in script
        assert "srun" not in script


def test_unknown_backend_kind_is_a_programming_error():
    with pytest.raises(ValueError):
        render_template("python", {"script": "t.py"}, nodes=1, gpus_per_node=1, backend_kind="pbs")


# --- Validation errors --------------------------------------------------------------------------


def test_unknown_template():
    errors = invalid("tensorflow", {})
    assert list(errors) == ["template"]
    assert "torchrun" in errors["template"][0]


def test_missing_required_parameter():
    assert invalid("torchrun", {}) == {"parameters.script": ["This parameter is required."]}
    assert "parameters.input" in invalid("lammps", {})


def test_wrong_types():
    errors = invalid("torchrun", {"script": 7, "args": "--lr 1", "rdzv_port": "29500", "max_restarts": True})
    assert set(errors) == {
        "parameters.script",
        "parameters.args",
        "parameters.rdzv_port",
        "parameters.max_restarts",
    }
    assert errors["parameters.rdzv_port"] == ["Must be a whole number."]
    assert "parameters.resume" in invalid("gromacs", {"resume": "yes"})


def test_parameters_must_be_an_object():
    assert list(invalid("python", ["train.py"])) == ["parameters"]


def test_unknown_parameter_is_named():
    errors = invalid("torchrun", {"script": "t.py", "scirpt": "t.py"})
    assert list(errors) == ["parameters.scirpt"]
    assert "script" in errors["parameters.scirpt"][0]


def test_numbers_out_of_range():
    errors = invalid("torchrun", {"script": "t.py", "rdzv_port": 80, "max_restarts": 11})
    assert errors == {
        "parameters.max_restarts": ["Must be at most 10."],
        "parameters.rdzv_port": ["Must be at least 1024."],
    }
    assert "parameters.rdzv_port" in invalid("torchrun", {"script": "t.py", "rdzv_port": 65536})
    assert "parameters.ranks_per_node" in invalid("openfoam", {"ranks_per_node": 0})
    assert "parameters.maxwarn" in invalid("gromacs", {"maxwarn": -1})


@pytest.mark.parametrize(
    "path", ["/etc/passwd", "../x.py", "a/../../b.py", "a/..", "..", "-rf", "", "~/t.py", "a b.py", "t.py\n"]
)
def test_paths_outside_the_working_directory_or_odd_are_refused(path):
    errors = invalid("python", {"script": path})
    assert list(errors) == ["parameters.script"]


@pytest.mark.parametrize("path", ["train.py", "src/train.py", "./train.py", ".hidden/a_b-c+1.py", "a..b.py"])
def test_plain_relative_paths_are_accepted(path):
    assert render_template("python", {"script": path}, nodes=1, gpus_per_node=1, backend_kind="local")


def test_enums_and_bashrc_pattern():
    errors = invalid(
        "openfoam", {"solver": "rm", "bashrc": "/opt/of/../../etc/bashrc", "decompose_method": "x"}
    )
    assert set(errors) == {"parameters.solver", "parameters.bashrc", "parameters.decompose_method"}
    assert "icoFoam" in errors["parameters.solver"][0]
    assert "parameters.bashrc" in invalid("openfoam", {"bashrc": "opt/of/etc/bashrc"})
    assert "parameters.bashrc" in invalid("openfoam", {"bashrc": "/opt/of/etc/profile"})


def test_grompp_inputs_come_together():
    errors = invalid("gromacs", {"mdp": "md.mdp"})
    assert errors == {
        "parameters.coordinates": ["Required when 'mdp' is given."],
        "parameters.topology": ["Required when 'mdp' is given."],
    }


def test_lammps_variables_are_names_and_plain_words():
    errors = invalid("lammps", {"input": "in.lj", "variables": {"1x": "2"}})
    assert list(errors) == ["parameters.variables"]
    # LAMMPS would read a value starting with '-' as its next switch.
    assert "parameters.variables" in invalid("lammps", {"input": "in.lj", "variables": {"T": "-1"}})
    assert "parameters.variables" in invalid("lammps", {"input": "in.lj", "variables": {"T": "a b"}})


def test_list_items_are_named_in_the_message():
    errors = invalid("python", {"script": "t.py", "args": ["ok", "bad\nline"]})
    assert errors == {
        "parameters.args": ["Item 2: Must be printable text without newlines or other control characters."]
    }


def test_single_node_template_refuses_several_nodes():
    errors = invalid("python", {"script": "t.py"}, nodes=2)
    assert list(errors) == ["nodes"]


@pytest.mark.parametrize(
    ("slug", "kind"), [("torchrun", "local"), ("horovod", "kubernetes"), ("openfoam", "local")]
)
def test_multi_node_only_where_the_backend_can_span_nodes(slug, kind):
    assert list(invalid(slug, MINIMAL[slug], nodes=2, backend_kind=kind)) == ["nodes"]


def test_shape_errors_and_parameter_errors_come_together():
    errors = invalid("python", {"script": "/abs.py"}, nodes=0, gpus_per_node=0)
    assert set(errors) == {"nodes", "gpus_per_node", "parameters.script"}
    assert list(invalid("python", {"script": "t.py"}, nodes=1, gpus_per_node=True)) == ["gpus_per_node"]


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
