"""job.yaml: a job spec in YAML whose fields are POST /jobs/'s (docs/cli.md, The job file).

`load` reads the file, `apply_sets` applies `--set key=value` overrides, `check` finds what the
portal would refuse about the fields' types and forms, `check_parameters` checks a template's
parameters against its `parameters_schema` (JSON Schema, as the portal does), and
`idempotency_key` derives the Idempotency-Key from the spec. All of it before anything is sent.
Errors are `SpecError`: a field (`gpus`, `parameters.epochs`, …) and its messages.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import re
from pathlib import Path
from typing import Any

import yaml

from gpuportal.i18n import N_, _

SLUG = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\Z")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}\Z")
ENV_FORBIDDEN = {"CUDA_VISIBLE_DEVICES", "LD_PRELOAD", "LD_LIBRARY_PATH", "PATH", "HOME"}
ENV_FORBIDDEN_PREFIXES = ("SLURM_", "PORTAL_")
PRIORITIES = ("low", "normal", "high")
SHARES = ("whole", "mig", "slice", "shard")  # what each of `gpus` is (docs/api.md, Shares of a GPU)
SCRIPT_MAX_BYTES = 64 * 1024
ENV_MAX = 64
ENV_VALUE_MAX = 4096

# POST /jobs/'s fields: (kind, bounds). `script_file` is the CLI's own: read into `script`.
FIELDS: dict[str, tuple[str, Any]] = {
    "tenant": ("slug", None),
    "scenario": ("slug", None),
    "gpu_model": ("slug", None),
    "gpus": ("int", (1, 4096)),
    "nodes": ("int", (1, 512)),
    "share": ("choice", SHARES),
    "mig_profile": ("text", 32),
    "gpu_memory_mib": ("int", (0, 1 << 24)),
    "gpu_cores_pct": ("int", (0, 100)),
    "walltime_minutes": ("int", (1, 4320)),
    "name": ("name", None),
    "priority": ("choice", PRIORITIES),
    "env": ("env", None),
    "script": ("script", None),
    "script_file": ("path", None),
    "template": ("text", 64),
    "parameters": ("mapping", None),
    "cluster": ("slug", None),
    "partition": ("text", 64),
    # lending and restarts (docs/api.md, Lending between tenants): the portal caps max_restarts
    "preemptible": ("bool", None),
    "max_restarts": ("int", (0, 100)),
    "restart_exit_codes": ("codes", (1, 255)),
}
REQUIRED = ("tenant", "scenario", "gpu_model", "gpus", "walltime_minutes", "name")
TEXT_KINDS = {"slug", "name", "choice", "text", "script", "path"}


class SpecError(Exception):
    """The job file cannot be sent as it is: messages by field."""

    def __init__(self, errors: dict[str, list[str]], source: str = "job.yaml"):
        self.errors = errors
        self.source = source
        super().__init__("; ".join(f"{key}: {' '.join(msgs)}" for key, msgs in errors.items()))


def _add(errors: dict[str, list[str]], key: str, message: str) -> None:
    messages = errors.setdefault(key, [])
    if message not in messages:
        messages.append(message)


# --- Reading and overriding ------------------------------------------------------------------------


def load(path: Path) -> dict[str, Any]:
    """The spec in the file, a mapping (`script_file` still unread: see `resolve_script`)."""
    source = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError({"file": [_("No such file.")]}, source) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError({"file": [_("Cannot read it: {error}.").format(error=exc)]}, source) from None
    return loads(text, source)


def loads(text: str, source: str = "job.yaml") -> dict[str, Any]:
    """The spec in YAML text, a mapping."""
    try:
        spec = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = (
            _(" (line {line}, column {column})").format(line=mark.line + 1, column=mark.column + 1)
            if mark
            else ""
        )
        raise SpecError({"file": [_("Not valid YAML{where}.").format(where=where)]}, source) from None
    if spec is None:
        spec = {}
    if not isinstance(spec, dict):
        raise SpecError({"file": [_("Must be a mapping of the job's fields (tenant, scenario, …).")]}, source)
    return spec


def parse_set(item: str) -> tuple[list[str], str]:
    """`a.b=value` → (["a", "b"], "value"); ValueError when it has no `=` or an empty key part."""
    key, sep, value = item.partition("=")
    path = key.strip().split(".")
    if not sep or not all(part.strip() for part in path):
        raise ValueError(
            _(
                "--set takes key=value (a dotted key for nested fields, e.g. parameters.epochs=3): {item!r}"
            ).format(item=item)
        )
    return [part.strip() for part in path], value


def set_value(path: list[str], raw: str) -> Any:
    """The value of `--set`: text for the fields that are text (and `env.*`), else a YAML scalar
    (3 → 3, true → true, [a, b] → a list)."""
    if path[0] == "env" or (len(path) == 1 and FIELDS.get(path[0], ("", None))[0] in TEXT_KINDS):
        return raw
    try:
        return yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        return raw


def apply_sets(spec: dict[str, Any], items: list[str]) -> dict[str, Any]:
    """The spec with each `--set key=value` applied in order; SpecError names a bad one."""
    errors: dict[str, list[str]] = {}
    for item in items:
        try:
            path, raw = parse_set(item)
        except ValueError as exc:
            _add(errors, "--set", str(exc))
            continue
        target = spec
        for depth, part in enumerate(path[:-1]):
            child = target.get(part)
            if child is None:
                child = target[part] = {}
            if not isinstance(child, dict):
                _add(
                    errors,
                    ".".join(path[: depth + 1]),
                    _("Is not a mapping, so --set {key} cannot go inside it.").format(key=".".join(path)),
                )
                break
            target = child
        else:
            target[path[-1]] = set_value(path, raw)
    if errors:
        raise SpecError(errors, "--set")
    return spec


def resolve_script(spec: dict[str, Any], base: Path, source: str = "job.yaml") -> dict[str, Any]:
    """`script_file: train.sh` (relative to the job file's folder) read into `script`."""
    if "script_file" not in spec:
        return spec
    value = spec.pop("script_file")
    if not isinstance(value, str) or not value.strip():
        raise SpecError({"script_file": [_("Must be the path of a script file.")]}, source)
    if "script" in spec:
        raise SpecError({"script_file": [_("Give script or script_file, not both.")]}, source)
    path = (base / value).expanduser()
    try:
        spec["script"] = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        message = _("Cannot read {path}: {error}.").format(path=path, error=exc.__class__.__name__)
        raise SpecError({"script_file": [message]}, source) from None
    return spec


# --- Local checks --------------------------------------------------------------------------------


def _json_problem(value: Any) -> str | None:
    """Why a YAML value cannot be sent as JSON (dates and the like), if it cannot."""
    if isinstance(value, (datetime.date, datetime.datetime, datetime.time)):
        return _("Is a date or time in YAML; put it in quotes to send it as text.")
    if isinstance(value, (bytes, set, tuple)) or (isinstance(value, float) and value != value):
        return _("Cannot be sent as JSON.")
    if isinstance(value, float) and value in (float("inf"), float("-inf")):
        return _("Cannot be sent as JSON.")
    return None


def _walk_json(value: Any, key: str, errors: dict[str, list[str]]) -> None:
    problem = _json_problem(value)
    if problem:
        _add(errors, key, problem)
    elif isinstance(value, dict):
        for name, child in value.items():
            if not isinstance(name, str):
                _add(errors, key, _("Keys must be text: {name!r}.").format(name=name))
            else:
                _walk_json(child, f"{key}.{name}", errors)
    elif isinstance(value, list):
        for child in value:
            _walk_json(child, key, errors)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check(spec: dict[str, Any]) -> dict[str, list[str]]:
    """What the portal would refuse in the fields themselves (docs/api.md, Additions: jobs)."""
    errors: dict[str, list[str]] = {}
    for key in spec:
        if not isinstance(key, str) or key not in FIELDS:
            _add(
                errors, str(key), _("Unknown field. A job takes: {fields}.").format(fields=", ".join(FIELDS))
            )
    for key in REQUIRED:
        if spec.get(key) in (None, ""):
            _add(errors, key, _("This field is required."))
    for key, value in spec.items():
        if key not in FIELDS or value is None:
            continue
        _walk_json(value, key, errors)
        if key in errors:
            continue
        kind, bounds = FIELDS[key]
        if kind in TEXT_KINDS and not isinstance(value, str):
            _add(errors, key, _("Must be text."))
        elif kind == "slug" and not SLUG.match(value):
            _add(errors, key, _("Must be a slug: lowercase letters, digits and -."))
        elif kind == "name" and not NAME.match(value):
            _add(errors, key, _("Must be 1 to 64 of A-Z a-z 0-9 . _ -, starting with a letter or digit."))
        elif kind == "choice" and value not in bounds:
            _add(errors, key, _("Must be one of: {choices}.").format(choices=", ".join(bounds)))
        elif kind == "text" and (not value.strip() or len(value) > bounds or "\0" in value):
            _add(errors, key, _("Must be text of 1 to {max} characters.").format(max=bounds))
        elif kind == "int":
            low, high = bounds
            if not _is_int(value):
                _add(errors, key, _("Must be a whole number."))
            elif not low <= value <= high:
                _add(errors, key, _("Must be from {low} to {high}.").format(low=low, high=high))
        elif kind == "bool" and not isinstance(value, bool):
            _add(errors, key, _("Must be true or false."))
        elif kind == "codes" and (
            not isinstance(value, list)
            or len(value) > 8
            or not all(_is_int(code) and bounds[0] <= code <= bounds[1] for code in value)
        ):
            _add(errors, key, _("Must be a list of at most 8 exit codes from 1 to 255, e.g. [1, 42]."))
        elif kind == "mapping" and not isinstance(value, dict):
            _add(errors, key, _("Must be a mapping of parameter names to values."))
        elif kind == "env":
            _check_env(value, errors)
        elif kind == "script":
            _check_script(value, errors)
    nodes = spec.get("nodes", 1)
    if _is_int(spec.get("gpus")) and _is_int(nodes) and nodes >= 1 and spec["gpus"] % nodes:
        _add(errors, "gpus", _("Must divide evenly over the {nodes} nodes.").format(nodes=nodes))
    has_script, has_template = bool(spec.get("script")), bool(spec.get("template"))
    if has_script == has_template:
        _add(errors, "script", _("Give exactly one of script (or script_file) or template with parameters."))
    if "parameters" in spec and not has_template and "parameters" not in errors:
        _add(errors, "parameters", _("Parameters go with a template."))
    return errors


def _check_env(value: Any, errors: dict[str, list[str]]) -> None:
    if not isinstance(value, dict):
        _add(errors, "env", _("Must be a mapping of variable names to text."))
        return
    if len(value) > ENV_MAX:
        _add(errors, "env", _("At most {count} variables.").format(count=ENV_MAX))
    for name, text in value.items():
        key = f"env.{name}"
        if not isinstance(name, str) or not ENV_NAME.match(name):
            _add(errors, key, _("Not a variable name: a letter or _, then letters, digits and _."))
        elif name in ENV_FORBIDDEN or name.startswith(ENV_FORBIDDEN_PREFIXES):
            _add(
                errors, key, _("This variable is the scheduler's or the portal's own; a job may not set it.")
            )
        if not isinstance(text, str):
            _add(errors, key, _("Must be text (put numbers in quotes)."))
        elif len(text) > ENV_VALUE_MAX or "\0" in text:
            _add(errors, key, _("Must be text of at most {max} characters.").format(max=ENV_VALUE_MAX))


def _check_script(value: str, errors: dict[str, list[str]]) -> None:
    if not value.startswith("#!"):
        _add(errors, "script", _("Must start with #! (e.g. #!/bin/bash)."))
    if "\0" in value:
        _add(errors, "script", _("Must not hold a NUL byte."))
    if len(value.encode("utf-8")) > SCRIPT_MAX_BYTES:
        _add(errors, "script", _("Must be at most 64 KiB."))


def check_parameters(template: dict[str, Any], parameters: Any) -> dict[str, list[str]]:
    """The template's parameters against its `parameters_schema`, keyed `parameters.<name>` as
    the portal keys them (JSON Schema 2020-12, patterns with ECMA 262's `$`)."""
    from jsonschema import Draft202012Validator, ValidationError, validators

    def ecma_pattern(validator, pattern, instance, schema):
        if not validator.is_type(instance, "string"):
            return
        if pattern.endswith("$") and not pattern.endswith("\\$"):
            pattern = pattern[:-1] + r"\Z"
        if not re.search(pattern, instance):
            yield ValidationError(
                _("{value!r} does not match {pattern!r}").format(value=instance, pattern=pattern)
            )

    errors: dict[str, list[str]] = {}
    if not isinstance(parameters, dict):
        return {"parameters": [_("Must be a mapping of parameter names to values.")]}
    schema = template.get("parameters_schema") or {}
    known = list((schema.get("properties") or {}).keys())
    validator = validators.extend(Draft202012Validator, {"pattern": ecma_pattern})(schema)
    for error in sorted(validator.iter_errors(parameters), key=lambda e: [str(p) for p in e.path]):
        path = [str(part) for part in error.path]
        if not path and error.validator == "required":
            for name in error.validator_value:
                if name not in parameters:
                    _add(errors, f"parameters.{name}", _("This parameter is required."))
        elif not path and error.validator == "additionalProperties":
            for name in parameters:
                if name not in known:
                    _add(
                        errors,
                        f"parameters.{name}",
                        _("Unknown parameter. This template takes: {names}.").format(names=", ".join(known)),
                    )
        elif path:
            where = "".join(f"[{part}]" for part in path[1:])
            _add(errors, f"parameters.{path[0]}{where}", _schema_message(error))
        else:
            _add(errors, "parameters", _schema_message(error))
    return errors


TYPE_WORDS = {
    "string": N_("text"),
    "integer": N_("a whole number"),
    "number": N_("a number"),
    "boolean": N_("true or false"),
    "array": N_("a list"),
    "object": N_("a mapping"),
}


def _schema_message(error: Any) -> str:
    kind, value = error.validator, error.validator_value
    if kind == "type":
        words = [_(TYPE_WORDS.get(v, v)) for v in (value if isinstance(value, list) else [value])]
        return _("Must be {type}.").format(type=_(" or ").join(words))
    if kind == "minimum":
        return _("Must be at least {value}.").format(value=value)
    if kind == "maximum":
        return _("Must be at most {value}.").format(value=value)
    if kind == "minLength":
        return (
            _("Must not be empty.")
            if value == 1
            else _("Must be at least {value} characters long.").format(value=value)
        )
    if kind == "maxLength":
        return _("Must be at most {value} characters long.").format(value=value)
    if kind == "maxItems":
        return _("Must have at most {value} items.").format(value=value)
    if kind == "enum":
        return _("Must be one of: {choices}.").format(choices=", ".join(str(v) for v in value))
    if kind == "pattern":
        return _("Does not have the form this parameter takes ({pattern}).").format(pattern=value)
    return _("Is not valid: {message}").format(message=error.message)


# --- The Idempotency-Key -------------------------------------------------------------------------


def normalized(spec: dict[str, Any]) -> str:
    """The spec as canonical JSON: sorted keys, no spaces, UTF-8 as is."""
    return json.dumps(spec, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def idempotency_key(spec: dict[str, Any], key: str | None = None) -> str:
    """`gpuportal-<sha256>` of the normalized spec (and `--key`, when given): the same file sent
    twice is one job; a changed file, or another --key, is a new one."""
    digest = hashlib.sha256(normalized(spec).encode("utf-8"))
    if key:
        digest.update(b"\0" + key.encode("utf-8"))
    return "gpuportal-" + digest.hexdigest()
