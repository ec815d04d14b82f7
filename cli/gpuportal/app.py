"""The `gpuportal` command group, and what its commands share: exit codes, options, the client
of the configured portal, completion of tenants and jobs. The commands are in commands/."""

from __future__ import annotations

from collections.abc import Callable
from ipaddress import ip_address
from typing import Any
from urllib.parse import urlsplit

import click

from gpuportal import __version__, config, output
from gpuportal.client import Client
from gpuportal.errors import ApiError
from gpuportal.follow import TooManyReconnects, WaitTimeout
from gpuportal.i18n import _, translate_click
from gpuportal.jobspec import SpecError

translate_click()

EXIT_OK, EXIT_JOB_FAILED, EXIT_USAGE, EXIT_API, EXIT_TIMEOUT, EXIT_INTERRUPTED = 0, 1, 2, 3, 4, 130
DEFAULT_WAIT_S = 24 * 3600.0
DEFAULT_RECONNECTS = 300  # the portal ends a stream after 5 minutes: about a day of following
COMPLETION_TIMEOUT_S = 3.0
TOKEN_NAME = "gpuportal on {host}"  # noqa: S105  (a name for the token, not one)


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
