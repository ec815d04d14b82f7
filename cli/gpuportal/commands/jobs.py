"""submit, ls, show, events, logs, cancel, usage: a tenant's jobs."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from gpuportal import output
from gpuportal.answers import JOB_STATES
from gpuportal.app import (
    DEFAULT_WAIT_S,
    EXIT_JOB_FAILED,
    EXIT_OK,
    StateChoice,
    app,
    complete_job,
    connect,
    follow_options,
    job_argument,
    job_id_type,
    json_option,
    state_line,
    tenant_option,
)
from gpuportal.client import Client
from gpuportal.follow import Budget, TooManyReconnects, WaitTimeout, follow_events, follow_log, wait_for_end
from gpuportal.i18n import _
from gpuportal.jobspec import SpecError
from gpuportal.sse import StreamEvent

# --- jobs ------------------------------------------------------------------------------------------


def share_text(job: dict[str, Any]) -> str:
    """What each of the job's GPUs is: a whole device, or a share of one and its fraction."""
    share = job.get("share", "whole")
    if share == "mig":
        text = f"MIG {job.get('mig_profile', '')}"
    elif share == "slice":
        mib, pct = job.get("gpu_memory_mib"), job.get("gpu_cores_pct")
        text = _("slice {mib} MiB / {pct}%").format(mib=mib, pct=pct)
    elif share == "shard":
        text = _("shard (no isolation)")
    else:
        return _("whole device")
    return _("{share}, {fraction} of a device").format(
        share=text, fraction=output.number(job.get("device_fraction"), 4)
    )


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
        (_("Share"), share_text(job)),
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
