"""`gpuportal`: the portal's REST API from the command line (docs/cli.md).

Exit codes: 0 done; 1 the job followed (`submit --wait`, `logs -f`) ended other than COMPLETED;
2 a usage error (bad arguments, an invalid job file, not logged in); 3 an API error (any 4xx or
5xx, or no answer); 4 `--timeout` (or the reconnects allowed) ran out before the job ended;
130 interrupted.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Callable
from ipaddress import ip_address
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import click

from gpuportal import __version__, config, output
from gpuportal.client import JOB_STATES, ApiError, Client, StreamEvent, normalize_url
from gpuportal.follow import Budget, TooManyReconnects, WaitTimeout, follow_events, follow_log, wait_for_end
from gpuportal.i18n import N_, _, translate_click
from gpuportal.jobspec import SpecError

translate_click()

EXIT_OK, EXIT_JOB_FAILED, EXIT_USAGE, EXIT_API, EXIT_TIMEOUT, EXIT_INTERRUPTED = 0, 1, 2, 3, 4, 130
DEFAULT_WAIT_S = 24 * 3600.0
DEFAULT_RECONNECTS = 300  # the portal ends a stream after 5 minutes: about a day of following
COMPLETION_TIMEOUT_S = 3.0
TOKEN_NAME = "gpuportal on {host}"  # noqa: S105  (a name for the token, not one)

ADVISOR_INPUTS = {
    "ai": N_(
        "params_b (required), precision (bf16|fp16|fp32|fp8), method (full|lora), tokens_b, target_days"
    ),
    "md": N_("atoms and ns_per_day (required), simulated_ns or days, timestep_fs"),
    "cfd": N_("cells_m and iterations (required), precision (fp64|mixed), target_days"),
}


class UsageProblem(click.ClickException):
    """A usage error that needs no usage text: not logged in, a bad URL, a missing input."""

    exit_code = EXIT_USAGE


class App(click.Group):
    """The command group: turns the API's refusals, a bad job file, a wait that ran out and ^C
    into their exit codes."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ApiError as exc:
            output.api_error(exc)
            ctx.exit(EXIT_API)
        except SpecError as exc:
            output.field_errors(exc.source, exc.errors)
            ctx.exit(EXIT_USAGE)
        except TooManyReconnects as exc:
            if exc.last_error is None:  # the streams ended as they do, too often: like a timeout
                output.say(
                    _("Gave up: the stream was reconnected --max-reconnects times."),
                    err=True,
                    style="bold yellow",
                )
                ctx.exit(EXIT_TIMEOUT)
            output.say(
                _("Gave up: the stream failed after --max-reconnects reconnects."), err=True, style="bold red"
            )
            output.api_error(exc.last_error)
            ctx.exit(EXIT_API)
        except WaitTimeout:
            output.say(_("Timed out: --timeout passed before the end."), err=True, style="bold yellow")
            ctx.exit(EXIT_TIMEOUT)
        except click.exceptions.Abort:
            output.say(_("Aborted."), err=True)
            ctx.exit(EXIT_USAGE)
        except KeyboardInterrupt:
            output.say(_("Interrupted."), err=True)
            ctx.exit(EXIT_INTERRUPTED)


CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


@click.group(
    cls=App,
    context_settings=CONTEXT,
    help=_(
        "The GPU portal from the command line: your tenants, quota and jobs.\n\n"
        "Start with `gpuportal login`. Every command takes --json for the API's own JSON. "
        "Exit codes: 0 done, 1 the job followed failed, 2 usage error, 3 API error, 4 timed out."
    ),
)
@click.version_option(__version__, "-V", "--version", prog_name="gpuportal")
def app() -> None:
    pass


# --- Shared options and helpers ------------------------------------------------------------------


def json_option(function: Callable) -> Callable:
    return click.option(
        "--json", "as_json", is_flag=True, help=_("Print the API's JSON instead of a table.")
    )(function)


def settings_or_usage() -> config.Settings:
    try:
        return config.resolve()
    except ValueError as exc:
        raise UsageProblem(str(exc)) from None


def connect(*, timeout_s: float | None = None) -> Client:
    """A client for the configured portal: GPUPORTAL_URL/GPUPORTAL_TOKEN, else the stored login."""
    settings = settings_or_usage()
    if not settings.url:
        raise UsageProblem(_("No portal URL: run `gpuportal login`, or set GPUPORTAL_URL."))
    if not settings.token:
        raise UsageProblem(_("Not logged in: run `gpuportal login`, or set GPUPORTAL_TOKEN."))
    if settings.token_from == "config" and config.too_open():  # noqa: S105  (where it came from)
        path = config.config_path()
        output.warn(_("{path} can be read by others; run: chmod 600 {path}").format(path=path))
    try:
        return Client(
            settings.url,
            settings.token,
            timeout_s=timeout_s or settings.timeout_s,
            ca_bundle=settings.ca_bundle,
        )
    except ValueError as exc:
        raise UsageProblem(str(exc)) from None


def job_id_type(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None and not (value.isascii() and value.isdigit() and len(value) <= 18):
        raise click.BadParameter(_("An id is a number, e.g. 42."))
    return value


class StateChoice(click.Choice):
    """A job state, in any case (running → RUNNING), listed as the API spells them."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        return super().convert(str(value).upper(), param, ctx)


class Duration(click.ParamType):
    """Seconds, or a number with s, m or h (90, 90s, 15m, 2h)."""

    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, (int, float)):
            return float(value)
        text = str(value).strip().lower()
        scale = {"s": 1, "m": 60, "h": 3600}.get(text[-1:])
        try:
            seconds = float(text[:-1] if scale else text) * (scale or 1)
        except ValueError:
            seconds = -1.0
        if not 0 < seconds <= 30 * 24 * 3600:
            self.fail(_("{value!r} is not a duration (e.g. 90, 15m, 2h).").format(value=value), param, ctx)
        return seconds


def complete_tenant(ctx: click.Context, param: click.Parameter, incomplete: str) -> list:
    """The caller's tenant slugs, for the shell's completion (none when the portal is away)."""
    from click.shell_completion import CompletionItem

    try:
        with connect(timeout_s=COMPLETION_TIMEOUT_S) as client:
            tenants = client.me()["tenants"]
    except (ApiError, click.ClickException, OSError):
        return []
    return [CompletionItem(t["slug"], help=t["name"]) for t in tenants if t["slug"].startswith(incomplete)]


def complete_job(ctx: click.Context, param: click.Parameter, incomplete: str) -> list:
    """The ids of the caller's latest jobs, for the shell's completion."""
    from click.shell_completion import CompletionItem

    try:
        with connect(timeout_s=COMPLETION_TIMEOUT_S) as client:
            jobs = client.jobs(limit=20)
    except (ApiError, click.ClickException, OSError):
        return []
    return [
        CompletionItem(j["id"], help=f"{j['name']} {j['state']}")
        for j in jobs
        if j["id"].startswith(incomplete)
    ]


def job_argument(function: Callable) -> Callable:
    return click.argument("job_id", metavar="ID", callback=job_id_type, shell_complete=complete_job)(function)


def tenant_option(function: Callable) -> Callable:
    return click.option(
        "--tenant",
        "-t",
        metavar="SLUG",
        shell_complete=complete_tenant,
        help=_("Only this tenant (its slug)."),
    )(function)


def follow_options(function: Callable) -> Callable:
    function = click.option(
        "--max-reconnects",
        type=click.IntRange(0, 100000),
        default=DEFAULT_RECONNECTS,
        show_default=True,
        help=_("Reconnect the event stream at most this often (the portal ends one every 5 minutes)."),
    )(function)
    return click.option(
        "--timeout",
        "timeout_s",
        type=Duration(),
        default=None,
        metavar="DURATION",
        help=_("Stop following after this long (90, 15m, 2h)."),
    )(function)


def loopback(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ip_address(host).is_loopback
    except ValueError:
        return False


def state_line(data: dict[str, Any]) -> str:
    """`12:01:03  job 42 train  PENDING → RUNNING  (started)` for a job event."""
    at = output.when(data.get("at") or "")[11:] or "--:--:--"
    job = _("job {id}").format(id=data.get("job", ""))
    name = data.get("name") or ""
    moved = f"{data.get('from_state') or '·'} → {data.get('to_state', '')}"
    reason = f"  ({data['reason']})" if data.get("reason") else ""
    return f"{at}  {job} {name}  {moved}{reason}".replace("   ", "  ")


# --- login, logout, whoami -------------------------------------------------------------------------


@app.command(
    short_help=_("Log in and store a token (mode 0600)."),
    help=_(
        "Log in to the portal and store a token in your config folder (mode 0600).\n\n"
        "Asks for the URL (unless --url or GPUPORTAL_URL gives it), the username and the password "
        "(hidden), or reads the password from stdin with --password-stdin. With --token, stores a "
        "token made on the portal's Tokens page instead (`--token -` reads it from stdin)."
    ),
)
@click.option("--url", help=_("The portal, e.g. https://gpu.example.org."))
@click.option("--username", "-u", help=_("Your portal username."))
@click.option("--password-stdin", is_flag=True, help=_("Read the password from the first line of stdin."))
@click.option(
    "--token",
    "supplied_key",
    metavar="TOKEN",
    help=_("Store this API token instead ('-': read it from stdin)."),
)
@click.option(
    "--name", "token_name", metavar="NAME", help=_("A name for the new token (default: gpuportal on <host>).")
)
@click.option(
    "--scope",
    type=click.Choice(["read", "submit", "admin"]),
    help=_("The new token's scope (default: the widest you may hold)."),
)
@click.option(
    "--expires-in-days",
    type=click.IntRange(1, 3650),
    help=_("The new token's lifetime in days (default: the portal's, 90)."),
)
@json_option
def login(url, username, password_stdin, supplied_key, token_name, scope, expires_in_days, as_json) -> None:
    settings = settings_or_usage()
    stored = settings.stored
    reads_stdin = password_stdin or supplied_key == "-"
    if not url and settings.url and (settings.url_from == "env" or reads_stdin):
        url = settings.url  # GPUPORTAL_URL, or the stored one when stdin is for the secret
    if not url:
        url = click.prompt(_("Portal URL"), default=settings.url, err=True)
    try:
        url = normalize_url(url)
    except ValueError as exc:
        raise UsageProblem(str(exc)) from None
    if url.startswith("http://") and not loopback(url):
        output.warn(
            _("{url} is plain HTTP: your password and token cross the network unencrypted.").format(url=url)
        )
    created = None
    if supplied_key:
        token = sys.stdin.readline().strip() if supplied_key == "-" else supplied_key.strip()
        if not token:
            raise UsageProblem(_("No token given."))
        with client_for(url, token, settings) as client:
            username = client.me()["username"]
    else:
        if not username:
            username = click.prompt(_("Username"), default=stored.get("username") or None, err=True)
        if password_stdin:
            password = sys.stdin.readline().rstrip("\r\n")
        else:
            password = click.prompt(_("Password"), hide_input=True, err=True)
        if not password:
            raise UsageProblem(_("No password given."))
        name = token_name or TOKEN_NAME.format(host=socket.gethostname())[:100]
        with client_for(url, None, settings) as client:
            created = client.token_create(
                username, password, name=name, scope=scope, expires_in_days=expires_in_days
            )
        token = created["token"]
    record = {"url": url, "token": token, "username": username}
    if created:
        record |= {
            "token_id": created["id"],
            "scope": created.get("scope", ""),
            "expires": created.get("expires", ""),
        }
    path = config.save(record)
    revoke_replaced(stored, url, token)
    if as_json:
        public = {k: v for k, v in created.items() if k != "token"} if created else None
        output.print_json({"url": url, "username": username, "token": public, "config": str(path)})
    else:
        output.say(_("Logged in to {url} as {username}.").format(url=url, username=username), style="green")
        if created:
            output.say(
                _("Token {name!r} ({scope}) stored in {path}; it expires {expires}.").format(
                    name=created["name"],
                    scope=created.get("scope", ""),
                    path=path,
                    expires=output.when(created.get("expires")),
                )
            )
        else:
            output.say(_("Token stored in {path}.").format(path=path))
    if os.environ.get(config.ENV_TOKEN):
        output.warn(_("GPUPORTAL_TOKEN is set: it overrides the stored token until you unset it."))


def client_for(url: str, token: str | None, settings: config.Settings) -> Client:
    try:
        return Client(url, token, timeout_s=settings.timeout_s, ca_bundle=settings.ca_bundle)
    except ValueError as exc:
        raise UsageProblem(str(exc)) from None


def revoke_replaced(stored: dict[str, Any], url: str, token: str) -> None:
    """The token an earlier `login` made for this portal, revoked once a new one replaced it
    (best effort: one that does not answer stays until it expires)."""
    if not (stored.get("token_id") and stored.get("token") and stored.get("token") != token):
        return
    if stored.get("url") != url:
        return
    try:
        with Client(url, stored["token"], timeout_s=10) as client:
            client.token_delete(str(stored["token_id"]))
    except (ApiError, ValueError):
        pass


@app.command(
    help=_("Forget the stored token, and revoke it on the portal if `gpuportal login` made it."),
    short_help=_("Forget (and revoke) the stored token."),
)
@json_option
def logout(as_json) -> None:
    stored = config.load()
    revoked, error = False, None
    if stored.get("token") and stored.get("token_id") and stored.get("url"):
        try:
            with Client(stored["url"], stored["token"], timeout_s=settings_or_usage().timeout_s) as client:
                client.token_delete(str(stored["token_id"]))
            revoked = True
        except ApiError as exc:
            if exc.status not in (401, 404):  # already revoked or expired: nothing left to revoke
                error = exc
        except ValueError:
            pass
    removed = config.remove()
    if as_json:
        output.print_json({"removed": removed, "revoked": revoked, "config": str(config.config_path())})
    elif removed:
        output.say(_("Logged out: removed {path}.").format(path=config.config_path()))
        if revoked:
            output.say(_("The token was revoked on the portal."))
    else:
        output.say(_("Not logged in: nothing stored."))
    if error is not None:
        output.warn(_("The token could not be revoked on the portal; revoke it on its Tokens page."))
        output.api_error(error)
        raise click.exceptions.Exit(EXIT_API)


@app.command(
    help=_("Who you are on the portal: your account, and your tenants with your role in each."),
    short_help=_("Your account and tenants."),
)
@json_option
def whoami(as_json) -> None:
    with connect() as client:
        me = client.me()
    if as_json:
        output.print_json(me)
        return
    settings = settings_or_usage()
    sources = {"env": _("environment"), "config": _("config file")}
    output.fields(
        [
            (_("Portal"), f"{client.url}  ({sources.get(settings.url_from, '')})"),
            (_("Username"), me["username"]),
            (_("Email"), me.get("email", "")),
            (_("Staff roles"), ", ".join(me.get("staff_roles") or []) or _("none")),
            (_("Platform admin"), output.yes_no(me.get("platform_admin"))),
            (_("Token from"), sources.get(settings.token_from, "")),
        ]
    )
    output.say("")
    output.table(
        [_("Tenant"), _("Name"), _("Role")],
        [(t["slug"], t["name"], t["role"]) for t in me["tenants"]],
        title=_("Tenants"),
    )


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


# --- jobs ------------------------------------------------------------------------------------------


def print_job(job: dict[str, Any], *, script: bool = False) -> None:
    pairs = [
        (_("ID"), job["id"]),
        (_("Name"), job["name"]),
        (_("Tenant"), job["tenant"]),
        (_("State"), output.state_text(job["state"])),
        (_("Reason"), job.get("reason", "")),
        (_("Scenario"), job["scenario"]),
        (_("GPU model"), job["gpu_model"]),
        (_("GPUs"), job["gpus"]),
        (_("Nodes"), job.get("nodes", 1)),
        (_("Walltime (min)"), job["walltime_minutes"]),
        (_("Priority"), job.get("priority", "")),
        (_("Cluster"), job.get("cluster", "")),
        (_("Partition"), job.get("partition", "")),
        (_("Scheduler id"), job.get("backend_id", "")),
        (_("Submitted by"), job.get("submitted_by") or ""),
        (_("Created"), output.when(job.get("created"))),
        (_("Started"), output.when(job.get("started_at"))),
        (_("Finished"), output.when(job.get("finished_at"))),
        (_("Exit code"), output.number(job.get("exit_code"))),
        (_("GPU-hours"), output.number(job.get("gpu_hours"), 4)),
        (_("GPU-hours reserved"), output.number(job.get("gpu_hours_reserved"))),
    ]
    if job.get("raw_state"):
        pairs.append((_("Scheduler state"), job["raw_state"]))
    if job.get("node_list"):
        pairs.append((_("Nodes used"), job["node_list"]))
    if job.get("template"):
        pairs.append((_("Template"), job["template"]))
        pairs.append(
            (_("Parameters"), ", ".join(f"{k}={v}" for k, v in (job.get("parameters") or {}).items()))
        )
    if job.get("env"):
        pairs.append((_("Environment"), ", ".join(sorted(job["env"]))))  # names only: values may be secrets
    output.fields(pairs)
    if script and job.get("script"):
        output.say(_("Script:"), style="bold")
        click.echo(job["script"].rstrip("\n"))


def ended(job_id: str, state: str, exit_code: Any, *, err: bool = False) -> None:
    code = "-" if exit_code is None else str(exit_code)
    output.say(
        _("Job {id} ended {state} (exit code {code}).").format(id=job_id, state=state, code=code),
        err=err,
        style="green" if state == "COMPLETED" else "bold red",
    )


def read_spec(path: Path, sets: tuple[str, ...]) -> tuple[dict[str, Any], str]:
    """The job file (or stdin for '-') with --set applied and script_file read, checked."""
    from gpuportal import jobspec

    if str(path) == "-":
        source, base = "stdin", Path.cwd()
        spec = jobspec.loads(sys.stdin.read(), source)
    else:
        source, base = str(path), path.parent
        spec = jobspec.load(path)
    spec = jobspec.apply_sets(spec, list(sets))
    spec = jobspec.resolve_script(spec, base, source)
    errors = jobspec.check(spec)
    if errors:
        raise SpecError(errors, source)
    return spec, source


@app.command(
    short_help=_("Submit a job from a YAML file (--wait: follow it)."),
    help=_(
        "Submit the job described in a YAML file (docs/cli.md, The job file).\n\n"
        "The spec is checked before anything is sent: the fields' types and forms, and a template's "
        "parameters against its schema. Its Idempotency-Key is the sha256 of the spec, so sending "
        "the same file twice gives the same job; --key makes another. --wait follows the job to "
        "its end: exit code 0 if it COMPLETED, 1 otherwise."
    ),
)
@click.option(
    "--file",
    "-f",
    "path",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help=_("The job file (YAML); '-' reads stdin."),
)
@click.option(
    "--set",
    "-s",
    "sets",
    multiple=True,
    metavar="KEY=VALUE",
    help=_("Set a field (repeatable); dotted for parameters and env: parameters.epochs=3."),
)
@click.option(
    "--key",
    metavar="TEXT",
    help=_("Mixed into the Idempotency-Key: the same file with another --key is a new job."),
)
@click.option("--dry-run", is_flag=True, help=_("Check the job and print the request; send nothing."))
@click.option(
    "--wait", "-w", is_flag=True, help=_("Follow the job until it ends; exit code 1 unless it COMPLETED.")
)
@follow_options
@json_option
def submit(path, sets, key, dry_run, wait, timeout_s, max_reconnects, as_json) -> None:
    from gpuportal import jobspec

    spec, source = read_spec(path, sets)
    with connect() as client:
        if spec.get("template"):
            check_template(client, spec, source)
        idempotency_key = jobspec.idempotency_key(spec, key)
        if dry_run:
            if not as_json:
                output.say(_("Checked; nothing sent. Idempotency-Key: {key}").format(key=idempotency_key))
            output.print_json({"body": spec, "idempotency_key": idempotency_key})
            return
        job, created = client.submit(spec, idempotency_key=idempotency_key)
        if not as_json:
            if created:
                output.say(
                    _("Submitted job {id} ({state}).").format(id=job["id"], state=job["state"]), style="green"
                )
            else:
                output.say(
                    _(
                        "Job {id} was submitted before from this spec (the same Idempotency-Key): "
                        "not submitted again."
                    ).format(id=job["id"]),
                    style="yellow",
                )
        if not wait:
            if as_json:
                output.print_json(job)
            else:
                output.note(_("Follow it: gpuportal logs -f {id}").format(id=job["id"]))
            return
        budget = Budget(DEFAULT_WAIT_S if timeout_s is None else timeout_s, max_reconnects)
        done = wait_for_end(
            client, job, budget, lambda data: output.note(state_line(data | {"name": job["name"]}))
        )
    if as_json:
        output.print_json(done)
    else:
        ended(done["id"], done["state"], done.get("exit_code"))
    raise click.exceptions.Exit(EXIT_OK if done["state"] == "COMPLETED" else EXIT_JOB_FAILED)


def check_template(client: Client, spec: dict[str, Any], source: str) -> None:
    """The template exists for the scenario, and the parameters fit its schema (SpecError if not)."""
    from gpuportal import jobspec

    found = [t for t in client.templates(scenario=spec["scenario"]) if t["slug"] == spec["template"]]
    if not found:
        message = _(
            "No template {slug!r} for scenario {scenario!r}; `gpuportal templates --scenario {scenario}` "
            "lists them."
        ).format(slug=spec["template"], scenario=spec["scenario"])
        raise SpecError({"template": [message]}, source)
    errors = jobspec.check_parameters(found[0], spec.get("parameters", {}))
    if errors:
        raise SpecError(errors, source)


@app.command(
    "ls",
    help=_("List jobs, newest first (the pages are followed up to --limit)."),
    short_help=_("List jobs."),
)
@tenant_option
@click.option(
    "--state",
    "states",
    multiple=True,
    type=StateChoice(JOB_STATES),
    help=_("Only jobs in this state (repeatable)."),
)
@click.option("--scenario", metavar="SLUG", help=_("Only this scenario's jobs."))
@click.option(
    "--limit",
    "-n",
    type=click.IntRange(1, 10000),
    default=50,
    show_default=True,
    help=_("At most this many jobs."),
)
@json_option
def list_jobs(tenant, states, scenario, limit, as_json) -> None:
    with connect() as client:
        rows = client.jobs(tenant=tenant, states=list(states), scenario=scenario, limit=limit)
    if as_json:
        output.print_json(rows)
        return
    headers = [
        _("ID"),
        _("Tenant"),
        _("Name"),
        _("State"),
        _("Reason"),
        _("GPUs"),
        _("Cluster"),
        _("Submitted by"),
        _("Created"),
    ]
    table = [
        [
            j["id"],
            j["tenant"],
            j["name"],
            output.state_text(j["state"]),
            j.get("reason", ""),
            f"{j['gpus']}× {j['gpu_model']}",
            j.get("cluster", ""),
            j.get("submitted_by") or "",
            output.when_short(j["created"]),
        ]
        for j in rows
    ]
    if len({j["tenant"] for j in rows}) <= 1:  # one tenant: no column for it
        del headers[1]
        for line in table:
            del line[1]
    output.table(headers, table, right=(0,), wrap=(headers.index(_("Reason")),))
    if not rows:
        output.note(_("No jobs."))


@app.command(
    help=_("One job: its fields, state and figures (--script: also its script)."), short_help=_("One job.")
)
@job_argument
@click.option("--script", "with_script", is_flag=True, help=_("Also print the job's script."))
@json_option
def show(job_id, with_script, as_json) -> None:
    with connect() as client:
        job = client.job(job_id)
    if as_json:
        output.print_json(job)
    else:
        print_job(job, script=with_script)


@app.command(
    short_help=_("A job's events; --follow: live events."),
    help=_(
        "A job's events (its state changes). With --follow, the live events of your tenants (of "
        "--tenant, or of the job ID until it ends), resumed after each reconnect."
    ),
)
@click.argument("job_id", metavar="[ID]", required=False, callback=job_id_type, shell_complete=complete_job)
@click.option("--follow", "-f", is_flag=True, help=_("Follow the live event stream."))
@click.option(
    "--since",
    metavar="EVENT_ID",
    callback=job_id_type,
    help=_("With --follow: first the events after this event id (a line's `id` in --json)."),
)
@tenant_option
@follow_options
@json_option
def events(job_id, follow, since, tenant, timeout_s, max_reconnects, as_json) -> None:
    if not job_id and not follow:
        raise click.UsageError(_("Give a job ID, or --follow."))
    if since and not follow:
        raise click.UsageError(_("--since goes with --follow."))
    with connect() as client:
        name = ""
        if job_id:
            rows = client.job_events(job_id)
            if not follow:
                if as_json:
                    output.print_json(rows)
                    return
                output.table(
                    [_("At"), _("From"), _("To"), _("Reason"), _("Scheduler state")],
                    [
                        (
                            output.when(e["at"]),
                            e.get("from_state") or "",
                            output.state_text(e["to_state"]),
                            e.get("reason", ""),
                            e.get("raw_state", ""),
                        )
                        for e in rows
                    ],
                    wrap=(3,),
                )
                return
            job = client.job(job_id)
            tenant, name = job["tenant"], job["name"]
            for row in rows:
                if as_json:
                    output.print_json_line({"event": "job", "id": None, "data": row | {"job": job_id}})
                else:
                    output.say(state_line(row | {"job": job_id, "name": name}))

        def shown(event: StreamEvent) -> None:
            if as_json:
                output.print_json_line({"event": event.event, "id": event.id, "data": event.data})
            elif event.event == "reset":
                output.warn(
                    _(
                        "More events were missed than the portal replays: `gpuportal ls` shows the jobs "
                        "as they are now."
                    )
                )
            else:
                where = "" if job_id or tenant else f"  [{event.data.get('tenant', '')}]"
                output.say(state_line(event.data) + where)

        def opened() -> None:
            if not as_json:
                output.note(_("Following events (Ctrl-C stops)…"))

        budget = Budget(timeout_s, max_reconnects)
        try:
            follow_events(client, budget, shown, tenant=tenant, job_id=job_id, since=since, on_open=opened)
        except (WaitTimeout, TooManyReconnects) as exc:
            if job_id or (isinstance(exc, TooManyReconnects) and exc.last_error):
                raise
            # Following the tenant's events ends when its --timeout or reconnects are spent: done.


@app.command(
    short_help=_("A job's output; -f: follow it to the end."),
    help=_(
        "A job's output: the last --tail lines, or with -f the lines as they come until the job ends "
        "(exit code 1 unless it COMPLETED)."
    ),
)
@job_argument
@click.option("--follow", "-f", is_flag=True, help=_("Follow the log until the job ends."))
@click.option(
    "--tail",
    "-n",
    type=click.IntRange(1, 5000),
    default=100,
    show_default=True,
    help=_("How many of the last lines."),
)
@follow_options
@json_option
def logs(job_id, follow, tail, timeout_s, max_reconnects, as_json) -> None:
    with connect() as client:
        if not follow:
            log = client.job_log(job_id, tail=tail)
            if as_json:
                output.print_json(log)
                return
            for line in log["lines"]:
                click.echo(line)
            if log["truncated"]:
                output.note(_("(earlier lines not shown: --tail up to 5000)"))
            return

        def shown(event: StreamEvent, fresh: list[str]) -> None:
            if as_json:
                output.print_json_line({"event": event.event, "id": event.id, "data": event.data})
            elif event.event == "log":
                if event.data.get("truncated"):
                    output.note(_("[… lines were cut here …]"))
                for line in fresh:
                    click.echo(line)
            elif event.event == "state":
                reason = f" ({event.data['reason']})" if event.data.get("reason") else ""
                output.note(
                    _("job {id}: {state}").format(id=job_id, state=event.data.get("state", "")) + reason
                )
            elif event.event == "unavailable":
                output.warn(
                    _("the log cannot be read now: {detail}").format(detail=event.data.get("detail", ""))
                )

        end = follow_log(client, job_id, Budget(timeout_s, max_reconnects), shown)
    if not as_json:
        ended(job_id, end.get("state", ""), end.get("exit_code"), err=True)
    raise click.exceptions.Exit(EXIT_OK if end.get("state") == "COMPLETED" else EXIT_JOB_FAILED)


@app.command(
    help=_("Cancel a job. One that has ended cannot be (the API's 409 conflict)."),
    short_help=_("Cancel a job."),
)
@job_argument
@json_option
def cancel(job_id, as_json) -> None:
    with connect() as client:
        job = client.cancel(job_id)
    if as_json:
        output.print_json(job)
        return
    output.say(_("Cancel asked for job {id}: it is {state} now.").format(id=job["id"], state=job["state"]))


@app.command(
    help=_("GPU-hours of finished jobs by day, user or GPU model (default: the last 30 days)."),
    short_help=_("GPU-hours used."),
)
@tenant_option
@click.option(
    "--from",
    "start",
    type=click.DateTime(["%Y-%m-%d"]),
    metavar="YYYY-MM-DD",
    help=_("First day (default: 29 days before --to)."),
)
@click.option(
    "--to",
    "end",
    type=click.DateTime(["%Y-%m-%d"]),
    metavar="YYYY-MM-DD",
    help=_("Last day (default: today)."),
)
@click.option(
    "--group-by",
    type=click.Choice(["day", "user", "gpu_model"]),
    default="day",
    show_default=True,
    help=_("What each row adds up."),
)
@json_option
def usage(tenant, start, end, group_by, as_json) -> None:
    with connect() as client:
        answer = client.usage(
            tenant=tenant,
            start=start.date().isoformat() if start else None,
            end=end.date().isoformat() if end else None,
            group_by=group_by,
        )
    if as_json:
        output.print_json(answer)
        return
    rows = answer["results"]
    key = {"day": _("Day"), "user": _("User"), "gpu_model": _("GPU model")}[group_by]
    total = sum(float(r["gpu_hours"]) for r in rows)
    output.table(
        [key, _("GPU-hours")],
        [
            *[(r["key"], output.number(r["gpu_hours"], 4)) for r in rows],
            (_("Total"), output.number(total, 4)),
        ],
        right=(1,),
    )


# --- completion ------------------------------------------------------------------------------------


@app.command(
    short_help=_("Print the shell completion script."),
    help=_(
        "Print the completion script for bash, zsh or fish. Install it once:\n\n"
        "bash: gpuportal completion bash > ~/.local/share/bash-completion/completions/gpuportal\n\n"
        "zsh: gpuportal completion zsh > ~/.zfunc/_gpuportal (with fpath+=~/.zfunc before compinit "
        "in ~/.zshrc)"
    ),
)
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
def completion(shell) -> None:
    from click.shell_completion import get_completion_class

    complete = get_completion_class(shell)
    assert complete is not None
    click.echo(complete(app, {}, "gpuportal", "_GPUPORTAL_COMPLETE").source())


def main() -> None:
    app(prog_name="gpuportal")


if __name__ == "__main__":  # pragma: no cover
    main()
