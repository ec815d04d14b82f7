"""What the commands print: rich tables for people, the API's JSON with --json, and errors on
stderr. Every header and message goes through the catalog; values (names, reasons, scripts)
are printed as they are, never read as rich markup."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from gpuportal.errors import ApiError
from gpuportal.i18n import _

STATE_STYLES = {
    "COMPLETED": "green",
    "RUNNING": "cyan",
    "PENDING": "yellow",
    "QUEUED": "yellow",
    "SUBMITTING": "yellow",
    "CANCELLING": "magenta",
    "CANCELLED": "magenta",
}
FAILED_STYLE = "red"

_consoles: dict[bool, Any] = {}


def console(stderr: bool = False):
    """rich's Console on stdout (or stderr), made on first use: rich is imported only to print."""
    if stderr not in _consoles:
        from rich.console import Console

        # stderr carries messages only: a long one stays one line (soft wrap), as on stdout in say()
        _consoles[stderr] = Console(stderr=stderr, highlight=False, soft_wrap=stderr)
    return _consoles[stderr]


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, ensure_ascii=False, indent=2) + "\n")
    sys.stdout.flush()


def print_json_line(data: Any) -> None:
    sys.stdout.write(json.dumps(data, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def say(message: str, *, err: bool = False, style: str | None = None) -> None:
    from rich.text import Text

    console(err).print(Text(message, style=style or ""), soft_wrap=True)  # a line stays one line


def note(message: str) -> None:
    """A progress note, on stderr so that stdout stays the command's answer."""
    say(message, err=True, style="dim")


def warn(message: str) -> None:
    say(_("Warning: {message}").format(message=message), err=True, style="yellow")


def when(value: str | None) -> str:
    """An API time in the local zone, to the second; a date as it is; '' for none."""
    if not value:
        return ""
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return value
    if moment.tzinfo is None:
        return value
    return moment.astimezone().strftime("%Y-%m-%d %H:%M:%S")


def when_short(value: str | None) -> str:
    """An API time for a list: the time alone today, else the day (and the minute this year)."""
    full = when(value)
    if len(full) != 19:
        return full
    today = datetime.now().strftime("%Y-%m-%d")
    if full.startswith(today):
        return full[11:]
    return full[5:16] if full[:4] == today[:4] else full[:10]


def number(value: Any, places: int = 2) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return yes_no(value)
    if isinstance(value, float):
        return f"{value:,.{places}f}"
    return str(value)


def yes_no(value: bool | None) -> str:
    if value is None:
        return ""
    return _("yes") if value else _("no")


def state_text(state: str):
    from rich.text import Text

    from gpuportal.answers import END_STATES

    style = STATE_STYLES.get(state) or (FAILED_STYLE if state in END_STATES else "")
    return Text(state, style=style)


def _cell(value: Any):
    from rich.text import Text

    if isinstance(value, Text):
        return value
    return Text("" if value is None else str(value))


def table(
    headers: Sequence[str],
    rows: Iterable[Sequence[Any]],
    *,
    title: str | None = None,
    right: Iterable[int] = (),
    wrap: Iterable[int] = (),
) -> None:
    """A table of `rows` under `headers` (already translated): `right` aligns those columns
    right; `wrap` names the columns of long text that wrap when the terminal is narrow (the
    others keep to one line, cut short with … only if nothing else fits)."""
    from rich import box
    from rich.table import Table

    aligned, wrapped = set(right), set(wrap)
    if title:  # its own line: a title as wide as the table would wrap over narrow columns
        say(title, style="bold")
    grid = Table(
        box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True, header_style="bold"
    )
    for index, header in enumerate(headers):
        grid.add_column(
            header,
            justify="right" if index in aligned else "left",
            no_wrap=index not in wrapped,
            overflow="fold" if index in wrapped else "ellipsis",
        )
    for row in rows:
        grid.add_row(*(_cell(value) for value in row))
    console().print(grid)


def fields(pairs: Iterable[tuple[str, Any]], *, title: str | None = None) -> None:
    """One object as a two-column table: each field's (translated) name and its value."""
    from rich.table import Table

    grid = Table(title=title, box=None, show_header=False, pad_edge=False, title_justify="left")
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")
    for name, value in pairs:
        grid.add_row(_cell(name), _cell(value))
    console().print(grid)


def api_error(error: ApiError) -> None:
    """A refusal on stderr: its code and detail, then each field's messages."""
    from rich.text import Text

    err = console(stderr=True)
    status = f"HTTP {error.status}" if error.status else _("no answer")
    err.print(
        Text(
            _("Error: {code} ({status}): {detail}").format(
                code=error.code, status=status, detail=error.detail
            ),
            style="bold red",
        )
    )
    for key, messages in error.errors.items():
        for message in messages if isinstance(messages, list) else [messages]:
            err.print(Text(f"  {key}: {message}"))
    retry = error.problem.get("retry_after_s")
    if isinstance(retry, int):
        err.print(Text(_("  Retry after {seconds} s.").format(seconds=retry)))


def field_errors(source: str, errors: dict[str, list[str]]) -> None:
    """A job file's (or an argument's) problems on stderr, one line per field and message."""
    from rich.text import Text

    err = console(stderr=True)
    err.print(Text(_("Error: {source} cannot be sent:").format(source=source), style="bold red"))
    for key, messages in errors.items():
        for message in messages:
            err.print(Text(f"  {key}: {message}"))
