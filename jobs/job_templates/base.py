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
