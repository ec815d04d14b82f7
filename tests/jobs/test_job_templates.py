"""Job templates (jobs/job_templates): the published schemas, the scripts rendered per backend,
and that no parameter value reaches the shell as code.

Scripts are executed with bash against stand-ins for the real tools: tiny executables named
torchrun, mpirun, srun, scontrol, gmx_mpi, lmp … that record the argv they were given (what
the real command would receive) and, for the launchers, start the program they launch.
"""

import shutil
import subprocess

import pytest
from jsonschema import Draft202012Validator

from jobs.job_templates import BACKEND_KINDS, TEMPLATES, render_template, templates_for
from tests.job_templates_support import MINIMAL, cases, invalid

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
    assert '-nb gpu -pme auto -cpt 15 -cpo "$cpt" ${mdrun_resume[@]+"${mdrun_resume[@]}"} &' in gromacs
    assert "mdrun_resume=(-cpi)" in gromacs  # resume: an earlier job's md.cpt
    assert "grompp" not in gromacs
    for slug in TEMPLATES:
        script = render_template(slug, MINIMAL[slug], nodes=1, gpus_per_node=1, backend_kind="local")
        assert "export PORTAL_CHECKPOINT_MINUTES=15\n" in script


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


# --- Checkpoints ----------------------------------------------------------------------------------


@pytest.mark.parametrize("slug", list(TEMPLATES))
def test_every_template_takes_a_checkpoint_interval(slug):
    spec = TEMPLATES[slug].parameters_schema["properties"]["checkpoint_minutes"]
    assert (spec["type"], spec["minimum"], spec["maximum"], spec["default"]) == ("integer", 1, 1440, 15)
    assert "PORTAL_CHECKPOINT_DIR" in spec["description"]


@pytest.mark.parametrize("slug", list(TEMPLATES))
@pytest.mark.parametrize(
    ("value", "message"),
    [
        (0, "Must be at least 1."),
        (1441, "Must be at most 1440."),
        ("15", "Must be a whole number."),
        (True, "Must be a whole number."),
        (2.5, "Must be a whole number."),
        (None, "Must be a whole number."),
    ],
)
def test_checkpoint_minutes_out_of_range_or_not_a_number_is_named(slug, value, message):
    assert invalid(slug, {**MINIMAL[slug], "checkpoint_minutes": value}) == {
        "parameters.checkpoint_minutes": [message]
    }


# What each tool is told of a 30-minute interval.
INTERVAL_30 = {
    "python": [],
    "torchrun": [],
    "horovod": [],
    "gromacs": ['-cpt 30 -cpo "$cpt"'],
    "lammps": ["ceil(1800 * elapsed / (cpu + 1e-9))", "restart v_portal_next $ck/restart.a $ck/restart.b"],
    "openfoam": [
        "foamDictionary -entry writeControl -set clockTime system/controlDict",
        "foamDictionary -entry writeInterval -set 1800 system/controlDict",
    ],
}


@pytest.mark.parametrize("slug", list(TEMPLATES))
def test_the_interval_reaches_the_program_and_the_tool(slug):
    params = {**MINIMAL[slug], "checkpoint_minutes": 30}
    for kind in BACKEND_KINDS:
        script = render_template(slug, params, nodes=1, gpus_per_node=2, backend_kind=kind)
        assert "export PORTAL_CHECKPOINT_MINUTES=30\n" in script
        for wanted in INTERVAL_30[slug]:
            assert wanted in script, wanted
        # The shell stays to hear the warning: Slurm's USR1 goes to the batch shell alone.
        assert "\nexec " not in script
        assert 'read -r -a preempt_signals <<< "${PORTAL_PREEMPT_SIGNAL:-USR1 TERM}"' in script
        assert 'trap "on_preempt $signal" "$signal"' in script


@pytest.mark.parametrize(
    ("slug", "kind", "nodes", "forward"),
    [
        # srun would kill its tasks on a TERM of its own: Slurm signals the steps' tasks.
        ("gromacs", "slurm", 2, 'scancel --signal=TERM "$SLURM_JOB_ID"'),
        ("horovod", "slurm", 1, 'scancel --signal=TERM "$SLURM_JOB_ID"'),
        ("torchrun", "slurm", 2, 'scancel --signal=TERM "$SLURM_JOB_ID"'),
        # mpirun would kill its ranks soon after a TERM: the ranks get it.
        ("gromacs", "kubernetes", 1, 'read -r -a ranks < "/proc/$app/task/$app/children"'),
        ("horovod", "kubernetes", 1, 'kill -TERM "${ranks[@]:-$app}"'),
        ("torchrun", "kubernetes", 3, 'kill -TERM "$app"'),
        ("torchrun", "slurm", 1, 'kill -TERM "$app"'),
        ("python", "kubernetes", 1, 'kill -TERM "$app"'),
        # The local cluster's TERM reached the whole process group.
        ("gromacs", "local", 1, ":  # the local cluster's SIGTERM reached the application too"),
        ("python", "local", 1, ":  # the local cluster's SIGTERM reached the application too"),
        # LAMMPS and OpenFOAM stop through their own files, everywhere.
        ("lammps", "slurm", 2, ': > "$ck/stop"'),
        ("openfoam", "kubernetes", 1, "foamDictionary -entry stopAt -set writeNow system/controlDict"),
    ],
)
def test_the_warning_is_passed_on_where_the_backend_did_not_send_it(slug, kind, nodes, forward):
    script = render_template(slug, MINIMAL[slug], nodes=nodes, gpus_per_node=2, backend_kind=kind)
    handler = script[script.index("on_preempt() {") : script.index("\n}\n", script.index("on_preempt() {"))]
    assert forward in handler
    if kind == "local":
        assert "kill -TERM" not in handler and "scancel" not in handler


def test_lammps_variables_may_not_take_the_template_s_names():
    errors = invalid("lammps", {"input": "in.lj", "variables": {"portal_restart": "x"}})
    assert errors == {"parameters.variables": ["Names starting with portal_ are the template's own."]}
