"""tenants, quota, advise, templates: what a tenant has, and what it may ask for."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from gpuportal import output
from gpuportal.app import UsageProblem, app, connect, json_option, tenant_option
from gpuportal.i18n import N_, _
from gpuportal.jobspec import SpecError

ADVISOR_INPUTS = {
    "ai": N_(
        "params_b (required), precision (bf16|fp16|fp32|fp8), method (full|lora), tokens_b, target_days"
    ),
    "md": N_("atoms and ns_per_day (required), simulated_ns or days, timestep_fs"),
    "cfd": N_("cells_m and iterations (required), precision (fp64|mixed), target_days"),
}

# --- tenants, quota, advise, templates -----------------------------------------------------------


@app.command(
    help=_("The tenants you belong to (all of them for platform admins)."), short_help=_("Your tenants.")
)
@json_option
def tenants(as_json) -> None:
    with connect() as client:
        rows = client.tenants()
    if as_json:
        output.print_json(rows)
        return
    output.table(
        [_("Tenant"), _("Name"), _("Tier"), _("State"), _("Contact"), _("Created")],
        [
            (
                t["slug"],
                t["name"],
                t.get("tier", ""),
                t.get("state", ""),
                t.get("contact_email", ""),
                output.when(t.get("created"))[:10],
            )
            for t in rows
        ],
        wrap=(1,),
    )


@app.command(
    help=_("Your tenants' quota grants: GPUs at once and GPU-hours, used and left."),
    short_help=_("Quota grants: GPUs and GPU-hours left."),
)
@tenant_option
@click.option("--all", "show_all", is_flag=True, help=_("Also grants that are not active today."))
@json_option
def quota(tenant, show_all, as_json) -> None:
    with connect() as client:
        rows = client.quotas(tenant=tenant, active=None if show_all else True)
    if as_json:
        output.print_json(rows)
        return
    columns = [  # (header, right-aligned, value)
        (_("ID"), False, lambda q: q["id"]),
        (_("Tenant"), False, lambda q: q["tenant"]),
        (_("Scenario"), False, lambda q: q["scenario"]),
        (_("GPU model"), False, lambda q: q["gpu_model"]),
        (_("GPUs in use"), True, lambda q: f"{q['gpus_in_use']}/{q['gpus']}"),
        (_("GPU-hours left"), True,
         lambda q: f"{output.number(q['gpu_hours_remaining'])} / {output.number(q['gpu_hours'], 0)}"),
        (_("Used"), True, lambda q: output.number(q["gpu_hours_used"])),
        (_("Reserved"), True, lambda q: output.number(q["gpu_hours_reserved"])),
        (_("Until"), False, lambda q: q["ends_on"]),
    ]  # fmt: skip
    if show_all:  # then some are not active today: say which
        columns += [
            (_("From"), False, lambda q: q["starts_on"]),
            (_("Active"), False, lambda q: output.yes_no(q["active"])),
        ]
    if len({q["tenant"] for q in rows}) <= 1:  # one tenant: no column for it
        del columns[1]
    output.table(
        [header for header, _right, _value in columns],
        [[value(q) for _header, _right, value in columns] for q in rows],
        right=[index for index, (_header, right, _value) in enumerate(columns) if right],
    )
    if not rows:
        output.note(_("No grants. Your tenant's owner or manager asks for quota on the portal."))


@app.command(
    short_help=_("Size a job: GPUs and GPU-hours per GPU model."),
    help=_(
        "Size a job with the scenario's advisor: GPUs, nodes and GPU-hours on each GPU model.\n\n"
        "Give the advisor's inputs with --set name=value (or a YAML file with -f), e.g.\n"
        "`gpuportal advise ai-training --set params_b=7 --set tokens_b=20`."
    ),
)
@click.argument("scenario", metavar="SCENARIO")
@click.option(
    "--set",
    "-s",
    "sets",
    multiple=True,
    metavar="NAME=VALUE",
    help=_("An input of the advisor (repeatable)."),
)
@click.option(
    "--file",
    "-f",
    "path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help=_("A YAML file of the advisor's inputs."),
)
@click.option("--verbose", "-v", is_flag=True, help=_("Also print each option's arithmetic."))
@json_option
def advise(scenario, sets, path, verbose, as_json) -> None:
    inputs = advisor_inputs(path, sets)
    with connect() as client:
        if not inputs:
            advisor = client.scenario(scenario).get("advisor") or ""
            if advisor not in ADVISOR_INPUTS:
                raise UsageProblem(_("{scenario} has no sizing advisor.").format(scenario=scenario))
            raise UsageProblem(
                _(
                    "Give the advisor's inputs with --set, e.g. --set params_b=7. "
                    "{scenario} (advisor {advisor}) takes: {inputs}; and gpus_per_node, max_gpus."
                ).format(scenario=scenario, advisor=advisor, inputs=_(ADVISOR_INPUTS[advisor]))
            )
        advice = client.advise(scenario, inputs)
    if as_json:
        output.print_json(advice)
        return
    output.table(
        [_("GPU model"), _("GPUs"), _("Nodes"), _("GPU-hours")],
        [(o["gpu_model"], o["gpus"], o["nodes"], output.number(o["gpu_hours"])) for o in advice["options"]],
        title=_("Options for {scenario}, best first").format(scenario=scenario),
        right=(1, 2, 3),
    )
    if not advice["options"]:
        output.note(_("No GPU model can run this job within max_gpus."))
    if verbose:
        for option in advice["options"]:
            output.say(f"{option['gpu_model']}:", style="bold")
            for step in option.get("arithmetic", []):
                output.say(f"  {step}")
    if advice.get("assumptions"):
        output.say(_("Assumptions:"), style="bold")
        for line in advice["assumptions"]:
            output.say(f"  • {line}")


def advisor_inputs(path: Path | None, sets: tuple[str, ...]) -> dict[str, Any]:
    """The advisor's inputs from -f's YAML file, then each --set name=value (YAML scalars)."""
    import yaml

    inputs: dict[str, Any] = {}
    if path:
        try:
            loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            raise SpecError({"file": [_("Not valid YAML.")]}, str(path)) from None
        if not isinstance(loaded, dict):
            raise SpecError({"file": [_("Must be a mapping of the advisor's inputs.")]}, str(path))
        inputs.update(loaded)
    for item in sets:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise UsageProblem(_("--set takes name=value: {item!r}").format(item=item))
        try:
            inputs[name.strip()] = yaml.safe_load(value) if value.strip() else ""
        except yaml.YAMLError:
            inputs[name.strip()] = value
    return inputs


def describe_type(schema: dict[str, Any]) -> str:
    if "enum" in schema:
        return " | ".join(str(v) for v in schema["enum"])
    kind = schema.get("type", "")
    if kind == "array":
        return _("list of {type}").format(type=describe_type(schema.get("items") or {}))
    return " | ".join(kind) if isinstance(kind, list) else str(kind)


def default_of(schema: dict[str, Any]) -> str:
    if "default" not in schema:
        return ""
    value = schema["default"]
    return repr(value) if isinstance(value, str) else str(value)


@app.command(
    short_help=_("Job templates, or one template's parameters."),
    help=_(
        "The job templates (per scenario); with a SLUG, that template's parameters: what the job "
        "file's `parameters` take."
    ),
)
@click.argument("slug", required=False, metavar="[SLUG]")
@click.option("--scenario", metavar="SLUG", help=_("Only this scenario's templates."))
@json_option
def templates(slug, scenario, as_json) -> None:
    with connect() as client:
        rows = client.templates(scenario=scenario)
    if slug:
        rows = [t for t in rows if t["slug"] == slug]
        if not rows:
            raise UsageProblem(_("No template {slug!r}; `gpuportal templates` lists them.").format(slug=slug))
    if as_json:
        output.print_json(rows[0] if slug else rows)
        return
    if not slug:
        output.table(
            [_("Template"), _("Scenario"), _("Name"), _("Description")],
            [(t["slug"], t["scenario"], t["name"], t["description"]) for t in rows],
            wrap=(3,),
        )
        return
    template = rows[0]
    schema = template["parameters_schema"] or {}
    required = set(schema.get("required") or [])
    output.say(f"{template['name']} ({template['slug']}, {template['scenario']})", style="bold")
    output.say(template["description"])
    output.table(
        [_("Parameter"), _("Type"), _("Required"), _("Default"), _("Description")],
        [
            (
                name,
                describe_type(prop),
                output.yes_no(name in required),
                default_of(prop),
                prop.get("description") or prop.get("title") or "",
            )
            for name, prop in (schema.get("properties") or {}).items()
        ],
        wrap=(1, 3, 4),
    )
