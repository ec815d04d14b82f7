"""What every job template shares: the dataclass, parameter validation with readable errors,
the schema fragments for common parameter kinds, and the launch lines per backend.

Pure Python: no Django, so the API, the services and the tests use it alike.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from jsonschema import Draft202012Validator, ValidationError, validators

BACKEND_KINDS = ("slurm", "local", "kubernetes")
# The accelerator vendors, as clusters.models.Vendor names them (GpuModel.vendor). Spelled out here
# because this module imports no Django; tests/jobs/test_job_templates_vendors.py holds the two
# together.
VENDORS = ("nvidia", "amd", "hygon", "huawei", "cambricon")
VENDOR_NAMES = {
    "nvidia": "NVIDIA",
    "amd": "AMD",
    "hygon": "Hygon",
    "huawei": "Huawei Ascend",
    "cambricon": "Cambricon",
}
MAX_NODES = 1024
MAX_GPUS_PER_NODE = 64

q = shlex.quote  # every parameter value passes through it, whatever the schema already allows


class TemplateInvalid(Exception):
    """The template, its parameters or the requested shape cannot be rendered. `errors` maps a
    field (`template`, `nodes`, `gpus_per_node`, `gpu_model`, `parameters.<name>`) to readable
    messages, the shape of the API's problem+json `errors`."""

    def __init__(self, errors: dict[str, list[str]]):
        self.errors = errors
        super().__init__("; ".join(f"{key}: {' '.join(msgs)}" for key, msgs in errors.items()))


# --- Schema fragments -------------------------------------------------------------------------

# A path inside the tenant's working directory (the job's cwd): no leading '/', no '..' segment,
# and no leading '-' so that no tool can read it as an option.
RELPATH = r"^(?!(?:.*/)?\.\.(?:/|$))[A-Za-z0-9_.][A-Za-z0-9_.+/-]*$"
# An absolute path to an installed environment script, e.g. /opt/openfoam11/etc/bashrc.
BASHRC = r"^(?!.*/\.\.(?:/|$))/(?:[A-Za-z0-9_.+-]+/)*etc/bashrc$"
# One argument to the user's own program: any printable text. It reaches the program as one
# argument through shlex.quote; control characters (newlines) would only garble logs.
ARG = r"^[^\x00-\x1f\x7f]*$"
# A variable name, and a plain word for a tool's own option values: no quotes, spaces or '$',
# and no leading '-', which tools would read as an option.
VAR_NAME = r"^[A-Za-z_][A-Za-z0-9_]{0,63}$"
WORD = r"^[A-Za-z0-9_.+][A-Za-z0-9_.+:,/=-]*$"

PATTERN_HELP = {
    RELPATH: "Must be a path inside the job's working directory: letters, digits and _ . + - /, "
    "not starting with '/' or '-', with no '..' part.",
    BASHRC: "Must be an absolute path ending in /etc/bashrc, with no '..' part.",
    ARG: "Must be printable text without newlines or other control characters.",
    VAR_NAME: "Must be a name of letters, digits and _, not starting with a digit.",
    WORD: "Must be letters, digits and _ . + : , / = -, not starting with '-'.",
}


def relpath(title: str, description: str, **extra: Any) -> dict[str, Any]:
    return {
        "type": "string",
        "title": title,
        "description": description,
        "minLength": 1,
        "maxLength": 255,
        "pattern": RELPATH,
        **extra,
    }


def python_script(description: str) -> dict[str, Any]:
    return relpath("Python script", description, examples=["train.py"])


ARGS = {
    "type": "array",
    "title": "Arguments",
    "description": "Arguments to the program, each passed as one literal argument.",
    "items": {"type": "string", "maxLength": 1024, "pattern": ARG},
    "maxItems": 128,
    "default": [],
}

RANKS_PER_NODE = {
    "type": "integer",
    "title": "MPI ranks per node",
    "minimum": 1,
    "maximum": 256,
    "description": "Default: one per GPU. More suit CPU builds (one per core).",
}

VENV = relpath(
    "Virtual environment",
    "A Python virtualenv or conda env in the working directory, "
    "activated before the run (its bin/activate is sourced).",
    examples=["venv"],
)


def checkpoint_minutes(description: str) -> dict[str, Any]:
    """The checkpoint interval parameter, with what the template's tool does at that interval."""
    return {
        "type": "integer",
        "title": "Checkpoint every (minutes)",
        "minimum": 1,
        "maximum": 1440,
        # Sites that run preemptible work advise checkpoints every 10 to 30 minutes: a preemption
        # without warning (a failed node) loses at most this much.
        "default": 15,
        "description": description + " The job also saves one when it is warned of a preemption, and a "
        "restarted attempt resumes from the newest (PORTAL_CHECKPOINT_DIR).",
    }


def schema(properties: dict[str, Any], *, required: Iterable[str] = (), **extra: Any) -> dict[str, Any]:
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": properties,
        "required": list(required),
        "additionalProperties": False,
        **extra,
    }


# --- Validation -------------------------------------------------------------------------------


def _ecma_pattern(validator, pattern, instance, schema):
    # JSON Schema patterns are ECMA 262, where `$` matches only at the very end; Python's `$`
    # also matches before a final newline, so re.search('^[a-z]+$', 'ls\n') passes. `\Z` is
    # the ECMA meaning, and clients that read the published schema see plain `$`.
    if not validator.is_type(instance, "string"):
        return
    if pattern.endswith("$") and not pattern.endswith("\\$"):
        pattern = pattern[:-1] + r"\Z"
    if not re.search(pattern, instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


Validator = validators.extend(Draft202012Validator, {"pattern": _ecma_pattern})

_TYPE_WORDS = {
    "string": "text",
    "integer": "a whole number",
    "number": "a number",
    "boolean": "true or false",
    "array": "a list",
    "object": "an object",
}


def _message(error: ValidationError) -> str:
    kind, value = error.validator, error.validator_value
    if kind == "type":
        return f"Must be {_TYPE_WORDS.get(value, value)}."
    if kind == "minimum":
        return f"Must be at least {value}."
    if kind == "maximum":
        return f"Must be at most {value}."
    if kind == "minLength":
        return "Must not be empty." if value == 1 else f"Must be at least {value} characters long."
    if kind == "maxLength":
        return f"Must be at most {value} characters long."
    if kind == "maxItems":
        return f"Must have at most {value} items."
    if kind == "maxProperties":
        return f"Must have at most {value} entries."
    if kind == "enum":
        return "Must be one of: " + ", ".join(str(v) for v in value) + "."
    if kind == "pattern":
        return PATTERN_HELP.get(value, "Contains characters that are not allowed here.")
    return "Is not valid."


def _where(path: list[Any]) -> str:
    """Where inside a list or mapping parameter the error is, as a message prefix."""
    if not path:
        return ""
    step = path[0]
    return f"Item {step + 1}: " if isinstance(step, int) else f"Entry {str(step)[:64]!r}: "


def validate_params(schema: dict[str, Any], params: Any) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """The parameters with the schema's defaults filled in, and the errors by field."""
    errors: dict[str, list[str]] = {}

    def add(key: str, message: str) -> None:
        messages = errors.setdefault(key, [])
        if message not in messages:
            messages.append(message)

    if not isinstance(params, dict):
        return {}, {"parameters": ["Must be an object of parameter names to values."]}
    known = schema["properties"]
    for error in sorted(Validator(schema).iter_errors(params), key=lambda e: [str(p) for p in e.path]):
        path = list(error.path)
        if not path and error.validator == "required":
            for name in error.validator_value:
                if name not in params:
                    add(f"parameters.{name}", "This parameter is required.")
        elif not path and error.validator == "additionalProperties":
            for name in params:
                if name not in known:
                    add(
                        f"parameters.{str(name)[:64]}",
                        "Unknown parameter. This template takes: " + ", ".join(known) + ".",
                    )
        elif not path and error.validator == "dependentRequired":
            for name, needed in error.validator_value.items():
                for other in needed:
                    if name in params and other not in params:
                        add(f"parameters.{other}", f"Required when {name!r} is given.")
        elif path:
            add(f"parameters.{path[0]}", _where(path[1:]) + _message(error))
        else:
            add("parameters", _message(error))
    if errors:
        return {}, errors
    filled = {name: spec["default"] for name, spec in known.items() if "default" in spec}
    filled.update(params)
    return filled, {}


# --- Rendering --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    """Where and how wide the job runs, and on whose devices: what a template renders against,
    beside its parameters."""

    nodes: int
    gpus_per_node: int
    backend_kind: str
    vendor: str = "nvidia"

    @property
    def multi(self) -> bool:
        return self.nodes > 1


Renderer = Callable[[dict[str, Any], Shape], list[str]]
# Errors of valid parameters that a shape or vendor rules out, by field (the LAMMPS CUDA build on
# an AMD GPU).
Checker = Callable[[dict[str, Any], Shape], dict[str, list[str]]]


def _listed(names: Iterable[str]) -> str:
    """'A', 'A or B', 'A, B or C'."""
    names = list(names)
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


@dataclass(frozen=True)
class JobTemplate:
    """One scenario's way to run a tool, rendered to a bash batch script per backend.

    `multi_node_backends` names the backends on which the template spans several nodes; every
    template runs on one node on every backend. `vendors` names the accelerator vendors whose
    devices the tool has a build for; on any other the template refuses to render (field
    `gpu_model`) rather than start a job that cannot use the devices it is charged for.
    """

    slug: str
    scenario: str
    name: str
    description: str
    parameters_schema: dict[str, Any]
    renderer: Renderer = field(repr=False, compare=False)
    multi_node_backends: frozenset[str] = frozenset()
    vendors: frozenset[str] = frozenset(VENDORS)
    checker: Checker | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        Validator.check_schema(self.parameters_schema)
        if not self.vendors <= set(VENDORS):
            raise ValueError(f"unknown vendors {sorted(self.vendors - set(VENDORS))}")

    @property
    def multi_node(self) -> bool:
        return bool(self.multi_node_backends)

    def render(
        self, *, params: Any, nodes: int, gpus_per_node: int, backend_kind: str, vendor: str = "nvidia"
    ) -> str:
        """The batch script for `vendor`'s devices. Validates first, so no path renders unchecked
        values; raises TemplateInvalid with every problem found at once."""
        if backend_kind not in BACKEND_KINDS:
            raise ValueError(f"unknown backend kind {backend_kind!r}")  # a caller's bug, not input
        if vendor not in VENDORS:
            raise ValueError(f"unknown vendor {vendor!r}")  # GpuModel.vendor has choices
        errors = self._shape_errors(nodes, gpus_per_node, backend_kind)
        errors.update(self._vendor_errors(vendor))
        values, param_errors = validate_params(self.parameters_schema, {} if params is None else params)
        errors.update(param_errors)
        shape = Shape(nodes=nodes, gpus_per_node=gpus_per_node, backend_kind=backend_kind, vendor=vendor)
        if not errors and self.checker is not None:
            errors.update(self.checker(values, shape))
        if errors:
            raise TemplateInvalid(errors)
        return "\n".join(self.renderer(values, shape)) + "\n"

    def _vendor_errors(self, vendor: str) -> dict[str, list[str]]:
        if vendor in self.vendors:
            return {}
        names = [VENDOR_NAMES[name] for name in VENDORS if name in self.vendors]
        return {
            "gpu_model": [
                f"The {self.name} template has no build for {VENDOR_NAMES[vendor]} accelerators: it runs on "
                f"{_listed(names)} devices. Choose a GPU model of one of those vendors."
            ]
        }

    def _shape_errors(self, nodes: Any, gpus_per_node: Any, backend_kind: str) -> dict[str, list[str]]:
        errors: dict[str, list[str]] = {}
        for key, value, most in (
            ("nodes", nodes, MAX_NODES),
            ("gpus_per_node", gpus_per_node, MAX_GPUS_PER_NODE),
        ):
            if isinstance(value, bool) or not isinstance(value, int):
                errors[key] = ["Must be a whole number."]
            elif not 1 <= value <= most:
                errors[key] = [f"Must be between 1 and {most}."]
        if "nodes" in errors or nodes == 1:
            return errors
        if not self.multi_node:
            errors["nodes"] = [f"The {self.name} template runs on one node."]
        elif backend_kind not in self.multi_node_backends:
            where = " or ".join(sorted(self.multi_node_backends))
            errors["nodes"] = [
                f"The {self.name} template spans several nodes only on {where} clusters; "
                f"on a {backend_kind} cluster it runs on one node."
            ]
        return errors


def header(template: str, shape: Shape) -> list[str]:
    # The backend inserts its `export NAME=value` lines right after the shebang.
    return [
        "#!/bin/bash",
        f"# Rendered by the GPU portal from the {template} template for a {shape.backend_kind} cluster: "
        f"{shape.nodes} node(s) x {shape.gpus_per_node} GPU(s).",
        "set -euo pipefail",
        "",
    ]


def source_lines(path: str, what: str) -> list[str]:
    """Source an environment script that predates `set -u` (virtualenv, conda and OpenFOAM
    scripts read unset variables and let commands fail), and stop if it is missing: with `set +e`
    a missing file would otherwise go unnoticed."""
    return [
        f"if [[ ! -f {q(path)} ]]; then",
        f"  echo {q(f'{what} not found: {path}')} >&2",
        "  exit 1",
        "fi",
        "set +eu",
        "# shellcheck source=/dev/null",
        f"source {q(path)}",
        "set -eu",
        "",
    ]


def venv_lines(values: dict[str, Any]) -> list[str]:
    if "venv" not in values:
        return []
    return source_lines(values["venv"].rstrip("/") + "/bin/activate", "Virtual environment")


def mpi_launch(shape: Shape, *, ranks_per_node: int) -> tuple[list[str], str]:
    """Setup lines and the launcher prefix that start ranks_per_node ranks on each node.

    Slurm: srun, which places ranks by the allocation and wires MPI through PMI, so the MPI
    library need not know Slurm. Elsewhere: Open MPI's mpirun on this one node (the kubernetes
    backend runs one pod per job; MPI across pods would need the MPI Operator)."""
    ranks = shape.nodes * ranks_per_node
    if shape.backend_kind == "slurm":
        setup = [
            # An srun step gets only the CPUs it asks for (one per task by default), so each
            # rank asks for its share of the node's allocation; OMP_NUM_THREADS uses them.
            f"cpus_per_rank=$(( SLURM_CPUS_ON_NODE / {ranks_per_node} ))",
            "if (( cpus_per_rank < 1 )); then cpus_per_rank=1; fi",
            "",
        ]
        return setup, (
            f"srun --nodes={shape.nodes} --ntasks={ranks} --ntasks-per-node={ranks_per_node} "
            '--cpus-per-task="$cpus_per_rank"'
        )
    # Open MPI binds ranks to single cores by default, which would stack every OpenMP thread
    # of a rank on one core; the tools pin their own threads.
    return [], f"mpirun -np {ranks} -bind-to none -map-by slot"


# --- Checkpoints and preemption ---------------------------------------------------------------
#
# The checkpoint contract (README, "The checkpoint contract for job scripts"): the backend sets
# PORTAL_CHECKPOINT_DIR (the same directory for every attempt of a job), PORTAL_ATTEMPT and
# PORTAL_PREEMPT_SIGNAL, the signal that warns the job some time before it is stopped (Slurm:
# USR1 to this batch shell alone, --signal=B:USR1@grace; Kubernetes: TERM to the pod's first
# process, this shell; local: TERM to the job's whole process group). The script has the
# application save a checkpoint there every checkpoint_minutes and when warned, prints
# `PORTAL_CHECKPOINT <epoch> <what>` once a checkpoint is whole and `PORTAL_RESUMED <epoch> <what>`
# when it resumes from one; the portal reads both from the log.


def checkpoint_lines(values: dict[str, Any]) -> list[str]:
    """The contract's variables, for the script and the application alike, and the directory."""
    return [
        # A job from before the contract keeps its checkpoints in the tenant's scratch, one
        # directory per scheduler job: a job's name need not be unique, its id is, and Slurm keeps
        # the id when it requeues the job itself.
        'export PORTAL_CHECKPOINT_DIR="${PORTAL_CHECKPOINT_DIR:-${PORTAL_SCRATCH:-$PWD}/checkpoints/'
        'job-${SLURM_JOB_ID:-${PORTAL_JOB_ID:-$HOSTNAME}}}"',
        'export PORTAL_ATTEMPT="${PORTAL_ATTEMPT:-1}"',
        f"export PORTAL_CHECKPOINT_MINUTES={int(values['checkpoint_minutes'])}",
        'mkdir -p -- "$PORTAL_CHECKPOINT_DIR"',
        "",
    ]


def preempt_lines(stop: list[str]) -> list[str]:
    """The handler of the preemption warning: `stop` asks the application, started later as $app,
    to save a checkpoint and exit. Once per job: Slurm's TERM at the end, or a second warning,
    must not ask again (a third TERM makes mdrun abort without a checkpoint)."""
    return [
        'app=""',
        "preempted=0",
        'preempt_signal=""',
        "on_preempt() {",
        "  if (( preempted )); then return; fi",
        "  preempted=1",
        "  preempt_signal=$1",
        '  echo "Warned of preemption (SIG$1): saving a checkpoint, then stopping." >&2',
        *(f"  {line}" for line in stop),
        "}",
        'read -r -a preempt_signals <<< "${PORTAL_PREEMPT_SIGNAL:-USR1 TERM}"',
        'for signal in "${preempt_signals[@]}"; do',
        "  if [[ ! $signal =~ ^[A-Z][A-Z0-9]*$ ]]; then continue; fi",
        "  # shellcheck disable=SC2064 # expanded now: the handler is told which signal came",
        '  trap "on_preempt $signal" "$signal"',
        "done",
        "",
    ]


def forward_lines(shape: Shape, *, srun: bool, mpirun: bool = False) -> list[str]:
    """The stop request for an application that saves a checkpoint on SIGTERM (mdrun, torchrun and
    its workers, a training script): the TERM goes where the backend's warning did not.

    srun answers a TERM by killing its tasks (SIGKILL: Slurm's src/srun/srun.c, _forward_signal),
    so Slurm signals the tasks of the job's steps itself; `scancel --signal` leaves the batch
    step, this shell, out unless told --batch or --full (scancel(1)). Open MPI's mpirun answers a
    TERM by killing its ranks a few seconds later (mpirun(1), Signal Propagation), and GROMACS
    wants the signal on a rank, not on mpirun (mdrun's help, Halting running simulations), so the
    ranks get it: the launcher's children. On the local cluster the warning reached the whole
    process group, the application included: nothing to forward."""
    if shape.backend_kind == "local":
        return [":  # the local cluster's SIGTERM reached the application too"]
    if srun:
        return [
            'scancel --signal=TERM "$SLURM_JOB_ID" || echo "scancel failed: the job stops unsaved." >&2',
        ]
    if mpirun:
        return [
            "local ranks=()",
            "if [[ -n $app && -r /proc/$app/task/$app/children ]]; then",
            '  read -r -a ranks < "/proc/$app/task/$app/children" || true',
            "fi",
            'if [[ -n $app ]]; then kill -TERM "${ranks[@]:-$app}" 2>/dev/null || true; fi',
        ]
    return ['if [[ -n $app ]]; then kill -TERM "$app" 2>/dev/null || true; fi']


def launch_lines(command: str, *, poll: bool) -> list[str]:
    """Start the application in the background, so that this shell can run the handler while it
    works (bash runs a trap only between commands, and `wait` is one it can leave), and wait for
    it: `status` is its exit status. With `poll`, record_checkpoints (the template's) runs every
    PORTAL_CHECKPOINT_POLL_S seconds and prints the markers of the checkpoints written since."""
    waiting = (
        [
            'checkpoint_poll_s="${PORTAL_CHECKPOINT_POLL_S:-10}"',
            "if [[ ! $checkpoint_poll_s =~ ^[0-9]+(\\.[0-9]+)?$ ]]; then checkpoint_poll_s=10; fi",
            "wait_app() {",
            "  local ticker",
            '  while kill -0 "$app" 2>/dev/null; do',
            '    sleep "$checkpoint_poll_s" &',
            "    ticker=$!",
            "    wait -n || true  # the application, the ticker or a trapped signal",
            '    kill "$ticker" 2>/dev/null || true',
            '    wait "$ticker" 2>/dev/null || true',
            "    record_checkpoints",
            "  done",
            '  wait "$app"',
            "}",
        ]
        if poll
        else [
            "wait_app() {",
            '  while kill -0 "$app" 2>/dev/null; do',
            '    wait "$app" || true  # a trapped signal ends the wait early: the application goes on',
            "  done",
            '  wait "$app"',
            "}",
        ]
    )
    return [
        *waiting,
        'if (( preempted )); then exit $(( 128 + $(kill -l "$preempt_signal") )); fi',
        f"{command} &",
        "app=$!",
        "status=0",
        "wait_app || status=$?",
    ]


def exit_lines() -> list[str]:
    """A job stopped on a warning exits as one killed by that signal, so that no scheduler reads
    the attempt as the job's completion; otherwise with the application's status."""
    return [
        'if (( preempted )); then exit $(( 128 + $(kill -l "$preempt_signal") )); fi',
        'exit "$status"',
    ]


def tracker_lines(*, newest: list[str], done: list[str]) -> list[str]:
    """For applications that write checkpoints in place (LAMMPS's restart files, OpenFOAM's time
    directories): a checkpoint is whole once the application has begun the next one, or has
    exited with status 0. `newest` prints the newest checkpoint's name (function newest_checkpoint),
    `done` records a whole one, $1, in the ledger $ck/latest, which a later attempt resumes from,
    and prints its marker (function checkpoint_done)."""
    return [
        "newest_checkpoint() {",
        *(f"  {line}" for line in newest),
        "}",
        "checkpoint_done() {",
        *(f"  {line}" for line in done),
        '  printf \'%s\\n\' "$1" > "$ck/latest.tmp"',
        '  mv -f -- "$ck/latest.tmp" "$ck/latest"',
        "}",
        "record_checkpoints() {",
        "  local newest",
        "  newest=$(newest_checkpoint)",
        '  if [[ -n $newest && $newest != "$ck_seen" ]]; then',
        "    ck_seen=$newest",
        '    if [[ -n $ck_pending ]]; then checkpoint_done "$ck_pending"; fi',
        "    ck_pending=$newest",
        "  fi",
        "}",
    ]


def tracker_start_lines() -> list[str]:
    """Just before the application starts: what is there now is no checkpoint of this run."""
    return ["ck_seen=$(newest_checkpoint)", 'ck_pending=""']


def tracker_end_lines() -> list[str]:
    return [
        "record_checkpoints",
        'if (( status == 0 )) && [[ -n $ck_pending ]]; then checkpoint_done "$ck_pending"; fi',
    ]
