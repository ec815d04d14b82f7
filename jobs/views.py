"""Pages of a tenant's jobs: the dashboard, the job list, the job page and its cancel button.

The same rule as jobs/api.py: parse, scope through jobs_visible_to(), check the role, call one
service, render. The live parts are htmx fragments that poll every few seconds while a job
shown is active, and stop polling (their re-render carries no trigger) once all have ended."""

import re
from datetime import timedelta
from decimal import Decimal
from itertools import pairwise

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotAllowed, QueryDict
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.cache import patch_vary_headers
from django.utils.translation import gettext as _
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_POST

from billing import money
from billing.budgets import budget_delete, budget_set
from billing.models import BudgetPeriod
from clusters.selectors import cluster_list, scenario_list
from clusters.shares import SHARD_WARNING, Share
from jobs import services
from jobs.budgets import budget_of, budgets_of
from jobs.costs import costs_of, estimate
from jobs.filters import JobFilter
from jobs.forms import PARAM_PREFIX, BudgetForm, JobSubmitForm
from jobs.job_templates import templates_for
from jobs.models import Job, JobGpuSample, JobState, Priority
from jobs.selectors import (
    gpu_efficiency_of,
    gpu_latest_of,
    gpu_samples_of,
    job_events_of,
    job_is_own_or_managed,
    jobs_visible_to,
    lending_panel_of,
    usage_of,
)
from jobs.states import END_STATES
from portal.core.errors import Conflict, Forbidden, Invalid, PortalError, Unavailable
from portal.core.serializers import ID_LOOKUP
from tenants import roles
from tenants.models import Tenant
from tenants.pages import (
    error_message,
    form_errors_from,
    grant_rows,
    pick_scenario,
    require_or_403,
    tenant_context,
    tenant_or_404,
)
from tenants.selectors import grants_active_of, grants_not_ended_of, members_of

ID_RE = re.compile(ID_LOOKUP)
PAGE_ROWS = 50
LOG_LINES = 200
USAGE_DAYS = 30
RECENT_EVENTS = 10
DASHBOARD_JOBS = 20
ACTIVE_STATES = [state for state in JobState.values if state not in END_STATES]
# The filters the list offers as controls; the API's other filters (cluster, dates) work too.
FILTER_KEYS = ("state", "scenario", "submitted_by")


def _is_htmx(request: HttpRequest) -> bool:
    return request.headers.get("HX-Request") == "true"


def _vary(response: HttpResponse) -> HttpResponse:
    patch_vary_headers(response, ["HX-Request"])
    return response


def _plain(value: Decimal) -> str:
    """A ledger figure without its trailing zeros: 0.5 rather than 0.5000, 10 rather than 1E+1."""
    return f"{value.normalize():f}"


def _job_or_404(request: HttpRequest, tenant: Tenant, job_id: int) -> Job:
    return get_object_or_404(jobs_visible_to(user=request.user).filter(tenant=tenant), pk=job_id)


# --- The job rows: the list page, the dashboard, and the fragment that refreshes them


def _int_param(request: HttpRequest, name: str) -> int | None:
    # ASCII digits, at most 18 (a bigint): str.isdigit takes "²", which int() refuses.
    value = request.GET.get(name, "")
    return int(value) if ID_RE.fullmatch(value) else None


def _rows_page(jobs, *, before: int | None, after: int | None, limit: int) -> tuple[list[Job], dict]:
    """One page of at most `limit` jobs, newest first, by keyset on the id (an indexed, unique key)."""
    if after is not None:
        rows = list(jobs.filter(pk__gt=after).order_by("id")[: limit + 1])
        newer = rows[limit - 1].pk if len(rows) > limit else None
        rows = rows[:limit][::-1]
        older = rows[-1].pk if rows else None
    else:
        if before is not None:
            jobs = jobs.filter(pk__lt=before)
        rows = list(jobs.order_by("-id")[: limit + 1])
        older = rows[limit - 1].pk if len(rows) > limit else None
        rows = rows[:limit]
        newer = rows[0].pk if rows and before is not None else None
    return rows, {"older": older, "newer": newer}


def rows_context(request: HttpRequest, tenant: Tenant, jobs, *, query: QueryDict, limit: int) -> dict:
    """The rows, whether any is active (then the fragment polls), and the fragment's URL."""
    before, after = _int_param(request, "before"), _int_param(request, "after")
    rows, paging = _rows_page(jobs, before=before, after=after, limit=limit)
    return {
        "jobs": rows,
        "paging": paging,
        "any_active": any(job.state not in END_STATES for job in rows),
        "rows_url": f"{reverse('job-rows', args=[tenant.slug])}?{query.urlencode()}",
    }


def _filtered(request: HttpRequest, tenant: Tenant) -> tuple[JobFilter, QueryDict]:
    """The API's JobFilter over the tenant's jobs; the tenant comes from the URL, not the query."""
    params = request.GET.copy()
    params.pop("tenant", None)
    query = params.copy()
    states = query.getlist("state")
    if "active" in states:  # the list's "waiting or running" choice: every state before an end
        query.setlist("state", [s for s in states if s != "active"] + ACTIVE_STATES)
    filterset = JobFilter(query, queryset=jobs_visible_to(user=request.user).filter(tenant=tenant))
    return filterset, params


def _list_page_query(params: QueryDict, **change) -> str:
    query = params.copy()
    for key in ("before", "after"):
        query.pop(key, None)
    for key, value in change.items():
        query[key] = value
    return query.urlencode()


@login_required
@require_GET
def job_list(request: HttpRequest, slug: str) -> HttpResponse:
    tenant = tenant_or_404(request, slug)
    filterset, params = _filtered(request, tenant)
    valid = filterset.is_valid()
    jobs = filterset.qs if valid else Job.objects.none()
    context = tenant_context(request, tenant) | rows_context(
        request, tenant, jobs, query=params, limit=PAGE_ROWS
    )
    paging = context["paging"]
    selected_users = params.getlist("submitted_by")
    members = [m.user.username for m in members_of(tenant=tenant).order_by("user__username")]
    context |= {
        "section": "jobs",
        "filter_errors": [] if valid else [str(e) for errors in filterset.errors.values() for e in errors],
        "states": JobState.choices,
        "scenarios": scenario_list().only("slug", "name"),
        "submitters": members + [u for u in selected_users if u and u not in members],
        "selected": {key: params.getlist(key) for key in FILTER_KEYS},
        "filtered": any(value for key in FILTER_KEYS for value in params.getlist(key)),
        "older_query": _list_page_query(params, before=paging["older"]) if paging["older"] else None,
        "newer_query": _list_page_query(params, after=paging["newer"]) if paging["newer"] else None,
    }
    return render(request, "jobs/list.html", context)


@never_cache
@login_required
@require_GET
def job_rows(request: HttpRequest, slug: str) -> HttpResponse:
    """The rows alone, for htmx to swap in place of the table body every few seconds."""
    tenant = tenant_or_404(request, slug)
    filterset, params = _filtered(request, tenant)
    jobs = filterset.qs if filterset.is_valid() else Job.objects.none()
    limit = PAGE_ROWS if request.GET.get("view") != "dashboard" else DASHBOARD_JOBS
    context = {"tenant": tenant} | rows_context(request, tenant, jobs, query=params, limit=limit)
    return _vary(render(request, "jobs/_rows.html", context | {"compact": limit == DASHBOARD_JOBS}))


# --- The dashboard


def _usage_series(rows: list[dict], start, days: int) -> dict:
    by_day = {row["key"]: row["gpu_hours"] for row in rows}
    labels = [(start + timedelta(days=i)).isoformat() for i in range(days)]
    return {
        "labels": labels,
        "values": [round(by_day.get(day, 0.0), 4) for day in labels],
        "label": _("GPU-hours"),
    }


@login_required
@require_GET
def dashboard(request: HttpRequest, slug: str) -> HttpResponse:
    """Per grant its bars, the running and waiting jobs, 30 days of usage, the latest events."""
    tenant = tenant_or_404(request, slug)
    today = timezone.localdate()
    grants = grants_not_ended_of(user=request.user, tenant=tenant, day=today)
    start = today - timedelta(days=USAGE_DAYS - 1)
    usage = usage_of(user=request.user, tenant_slug=tenant.slug, start=start, end=today, group_by="day")
    series = _usage_series(usage, start, USAGE_DAYS)
    active = jobs_visible_to(user=request.user).filter(tenant=tenant, state__in=ACTIVE_STATES)
    query = QueryDict(mutable=True)
    query["state"] = "active"
    query["view"] = "dashboard"
    context = tenant_context(request, tenant) | rows_context(
        request, tenant, active, query=query, limit=DASHBOARD_JOBS
    )
    query.pop("view")
    context |= {
        "section": "dashboard",
        "compact": True,
        "grant_rows": grant_rows(grants, today),
        "usage": series,
        "usage_rows": list(zip(series["labels"], series["values"], strict=True)),
        "usage_total": round(sum(series["values"]), 4),
        "events": job_events_of(user=request.user, tenant=tenant)[:RECENT_EVENTS],
        "active_query": query.urlencode(),
        "efficiency_rows": _efficiency_rows(list(active.filter(state=JobState.RUNNING)[:DASHBOARD_JOBS])),
        "gpu_keep_days": settings.GPU_SAMPLE_KEEP_DAYS,
        # None for a tenant in no cohort: the panel is left out
        "lending": lending_panel_of(tenant=tenant, days=USAGE_DAYS),
        "budget_rows": budget_rows(budgets_of(tenant=tenant)),
    }
    return render(request, "jobs/dashboard.html", context)


def _efficiency_rows(running: list[Job]) -> list[dict]:
    """Each running job with its GPU efficiency (mean utilization over its kept readings) and its
    latest reading; a job not read yet shows as such."""
    efficiency = gpu_efficiency_of(running)
    return [{"job": job, **efficiency.get(job.pk, {})} for job in running]


# --- GPU telemetry of one job (jobs/services/telemetry.py)


def _gpu_context(job: Job) -> dict:
    """The job's GPU charts: one canvas each, its data as a json_script (static/js/portal.js)."""
    samples = gpu_samples_of(job)
    if not samples:
        return {"gpu_samples": []}
    # A short run's readings are seconds apart; a long one's span days.
    short = samples[-1].at - samples[0].at < timedelta(hours=2)
    shape = "%H:%M:%S" if short else "%m-%d %H:%M"
    # A stretch without readings (the source did not answer) shows as a gap, not a line across.
    steps = sorted(later.at - earlier.at for earlier, later in pairwise(samples))
    gap = steps[len(steps) // 2] * 2.5 if steps else None
    points: list[JobGpuSample | None] = []
    for earlier, sample in zip([None, *samples], samples, strict=False):
        if earlier is not None and gap and sample.at - earlier.at > gap:
            points.append(None)
        points.append(sample)
    labels = [timezone.localtime(point.at).strftime(shape) if point else "" for point in points]

    def chart(key: str, title: str, unit: str, series: dict[str, str], maximum: float | None = None) -> dict:
        return {
            "id": f"gpu-{key}",
            "kind": "line",
            "title": title,
            "unit": unit,
            "max": maximum,
            "labels": labels,
            "series": [
                {"label": label, "values": [getattr(point, field) if point else None for point in points]}
                for field, label in series.items()
            ],
        }

    utilization = {
        "utilization_pct": _("mean"),
        "utilization_min_pct": _("least busy GPU"),
        "utilization_max_pct": _("busiest GPU"),
    }
    charts = [
        chart("utilization", _("Utilization"), "%", utilization, 100),
        chart("memory", _("Memory used"), "%", {"memory_used_pct": _("memory used")}, 100),
        chart("temperature", _("Temperature (hottest GPU)"), "°C", {"temperature_c": _("temperature")}),
        chart("power", _("Power"), "W", {"power_w": _("power")}),
    ]
    # A chart whose figure the source never reported (nvidia-smi without power, say) is left out.
    charts = [c for c in charts if any(v is not None for s in c["series"] for v in s["values"])]
    overall = gpu_efficiency_of([job]).get(job.pk, {})
    return {
        "gpu_samples": samples,
        "gpu_charts": charts,
        "gpu_recent": gpu_latest_of(job, count=10),
        "gpu_efficiency": overall.get("mean_pct"),
        "gpu_readings": overall.get("readings", 0),
    }


# --- One job


def _live_context(request: HttpRequest, job: Job) -> dict:
    ended = job.state in END_STATES
    detailed = job_is_own_or_managed(user=request.user, job=job)
    elapsed = None
    if job.started_at:
        elapsed = (job.finished_at or timezone.now()) - job.started_at
    return {
        "job": job,
        "ended": ended,
        "detailed": detailed,
        # CANCELLING has been asked for already: the button would only repeat the request.
        "can_cancel": detailed and not ended and job.state != JobState.CANCELLING,
        "events": job.events.all(),
        "elapsed": _duration(elapsed) if elapsed is not None else None,
        "device_fraction": _plain(job.device_fraction),
        "device_gpus": _plain(job.device_gpus),
        # Running jobs have no charge yet: device-equivalent GPUs × time so far, an estimate.
        "gpu_hours_so_far": round(float(job.device_gpus) * elapsed.total_seconds() / 3600, 2)
        if elapsed and not ended
        else None,
        "cost": money.as_text(costs_of([(job.pk, job)])[job.pk]),
    } | _attempts_context(job, ended=ended)


def _attempts_context(job: Job, *, ended: bool) -> dict:
    """A restarted job's attempts: the ended ones as JobAttempt rows (one query, none for a job
    on its first attempt), and the current one, which has no row until it ends, from the job."""
    attempts = list(job.attempts.all()) if job.attempt > 1 else []
    current = None
    if job.attempt > 1 and not ended and all(a.number != job.attempt for a in attempts):
        current = {"number": job.attempt, "node_list": job.node_list, "started_at": job.started_at}
    now = timezone.now()
    return {
        "attempts": attempts,
        "current_attempt": current,
        "attempts_allowed": job.max_restarts + 1,
        # warned for its lender: the stop is still ahead while the job runs
        "stops_at": job.stop_at if job.stop_at and not ended else None,
        "backoff_until": job.restart_after
        if job.restart_after and job.state == JobState.QUEUED and job.restart_after > now
        else None,
    }


def _duration(delta: timedelta) -> str:
    seconds = max(int(delta.total_seconds()), 0)
    return f"{seconds // 3600}:{seconds // 60 % 60:02}:{seconds % 60:02}"


def _log_context(job: Job) -> dict:
    ended = job.state in END_STATES
    try:
        tail = services.job_log_tail(job=job, lines=LOG_LINES)
    except Unavailable:
        if ended:
            text = _("The output cannot be read from cluster %(cluster)s right now. Reload the page later.")
        else:
            text = _("The output cannot be read from cluster %(cluster)s right now. Trying again.")
        return {"job": job, "ended": ended, "log_error": text % {"cluster": job.cluster.name}}
    return {"job": job, "ended": ended, "lines": tail.lines, "truncated": tail.truncated}


@login_required
@require_GET
def job_detail(request: HttpRequest, slug: str, job_id: int) -> HttpResponse:
    tenant = tenant_or_404(request, slug)
    job = _job_or_404(request, tenant, job_id)
    context = tenant_context(request, tenant) | _live_context(request, job) | _log_context(job)
    context |= _gpu_context(job)
    return render(request, "jobs/detail.html", context | {"section": "jobs", "log_lines": LOG_LINES})


@never_cache
@login_required
@require_GET
def job_live(request: HttpRequest, slug: str, job_id: int) -> HttpResponse:
    """State, cancel button, resources and timeline: the part of the job page that changes."""
    tenant = tenant_or_404(request, slug)
    job = _job_or_404(request, tenant, job_id)
    return _vary(render(request, "jobs/_live.html", {"tenant": tenant} | _live_context(request, job)))


@never_cache
@login_required
@require_GET
def job_log(request: HttpRequest, slug: str, job_id: int) -> HttpResponse:
    tenant = tenant_or_404(request, slug)
    job = _job_or_404(request, tenant, job_id)
    return _vary(
        render(request, "jobs/_log.html", {"tenant": tenant, "log_lines": LOG_LINES} | _log_context(job))
    )


@login_required
@require_POST
def job_cancel(request: HttpRequest, slug: str, job_id: int) -> HttpResponse:
    """Cancel through jobs.services.job_cancel. A role that may not cancel this job gets 403, even
    from a hand-made POST; a job that has already ended is a conflict, shown as a message."""
    tenant = tenant_or_404(request, slug)
    job = _job_or_404(request, tenant, job_id)
    status = 200
    try:
        job = services.job_cancel(actor=request.user, job=job)
    except Forbidden:  # a hand-made POST: the page never offers the button (job_is_own_or_managed)
        raise PermissionDenied(_("Your role allows cancelling only your own jobs.")) from None
    except Conflict as exc:
        status = 409
        messages.error(
            request,
            _("Job %(id)s has already ended; there is nothing to cancel.") % {"id": job.pk},
            extra_tags=exc.code,
        )
    except PortalError as exc:
        status = exc.status
        messages.error(request, error_message(exc), extra_tags=exc.code)
    else:
        messages.success(request, _("Job %(id)s: cancellation requested.") % {"id": job.pk})
    if not _is_htmx(request):
        return redirect("job-detail", slug=tenant.slug, job_id=job.pk)
    # htmx swaps the live part in place, and the message out of band into the page's flash area
    # (a 409 is swapped too: base.html's htmx-config says so).
    job = _job_or_404(request, tenant, job_id)
    context = {"tenant": tenant, "flash_oob": True} | _live_context(request, job)
    return _vary(render(request, "jobs/_live.html", context, status=status))


# --- Submit


def _submit_choices(request: HttpRequest, tenant: Tenant, scenario) -> tuple[list, list]:
    """The tenant's active grants for the scenario (the GPU models and shares the form offers),
    and its templates."""
    if scenario is None:
        return [], []
    grants = grants_active_of(user=request.user, tenant=tenant, day=timezone.localdate()).filter(
        scenario=scenario
    )
    return list(grants), templates_for(scenario.slug)


def _enabled_partitions() -> list:
    """The enabled clusters' partitions, each with its cluster: where the form's shares come from."""
    return [partition for cluster in cluster_list() for partition in cluster.partitions.all()]


def _submit_form(request: HttpRequest, tenant: Tenant, *, refresh: bool = False) -> dict:
    """The submit form for the scenario asked (GET ?scenario= or the POSTed one), bound to a POST.

    With `refresh` (the live check): when the model, the partition or the share changed since
    the page drew the share fields, or the template since it drew the parameters (their hidden
    share_context and parameters_for say which), the data takes what the new choices offer (a
    partition and a share they give, the template's defaults) and those parts are drawn again."""
    scenarios, scenario = pick_scenario(request, scenario_list().only("slug", "name"))
    grants, templates = _submit_choices(request, tenant, scenario)
    partitions = _enabled_partitions() if grants else []
    data = request.POST if request.method == "POST" else None

    def form_of(data) -> JobSubmitForm:
        return JobSubmitForm(data, grants=grants, partitions=partitions, templates=templates)

    form = form_of(data)
    parts = {"refresh_share": False, "refresh_parameters": False}
    if refresh and data is not None:
        if form.share_context != data.get("share_context"):
            data, parts["refresh_share"] = form.normalized(data), True
            form = form_of(data)
        if (data.get("template") or "") != data.get("parameters_for"):
            data, parts["refresh_parameters"] = form.with_template_defaults(data), True
            form = form_of(data)
    if request.method == "POST" and scenario is None:
        form.add_error(None, _("Choose a scenario."))
    context = {"form": form, "data": data, "scenarios": scenarios, "scenario": scenario}
    restarts = {"most": settings.JOB_MAX_RESTARTS, "preemptible": settings.JOB_PREEMPTIBLE_RESTARTS}
    return parts | context | {"shard_warning": SHARD_WARNING, "restarts": restarts}


def _job_request(tenant: Tenant, scenario, form: JobSubmitForm) -> services.JobRequest:
    data = form.cleaned_data
    gpu_model = next(m for m in form.gpu_models if m.slug == data["gpu_model"])
    return services.JobRequest(
        tenant=tenant,
        scenario=scenario,
        gpu_model=gpu_model,
        share=Share(data["share"], data["mig_profile"], data["gpu_memory_mib"], data["gpu_cores_pct"]),
        cluster=data["cluster"],
        **{k: data[k] for k in SUBMIT_FIELDS},
    )


def _errors_on_form(form: JobSubmitForm, exc: PortalError) -> None:
    """A service's error on the form, each next to its field: a template's `parameters.<name>`
    on that parameter's own field, `gpus_per_node` (a template's shape) on the GPUs."""
    if isinstance(exc, Invalid):
        errors = {}
        for name, messages_ in exc.extra["errors"].items():
            field, _dot, part = name.partition(".")
            if field == "parameters" and PARAM_PREFIX + part in form.fields:
                name = PARAM_PREFIX + part
            elif name == "gpus_per_node":
                name = "gpus"
            errors.setdefault(name, []).extend(messages_)
        exc = Invalid(errors)
    form_errors_from(form, exc)


@login_required
def job_new(request: HttpRequest, slug: str) -> HttpResponse:
    """The submit form, by scenario: GET ?scenario= picks it; POST submits through job_submit."""
    tenant = tenant_or_404(request, slug)
    if request.method not in ("GET", "POST"):
        return HttpResponseNotAllowed(["GET", "POST"])
    if request.method == "POST":
        require_or_403(request.user, tenant, roles.SUBMIT_JOB)
    parts = _submit_form(request, tenant)
    form, status = parts["form"], 200
    if request.method == "POST":
        if form.is_valid():
            try:
                job, _created = services.job_submit(
                    user=request.user, request=_job_request(tenant, parts["scenario"], form)
                )
            except PortalError as exc:
                _errors_on_form(form, exc)
            else:
                messages.success(request, _("Job %(id)s submitted.") % {"id": job.pk})
                return redirect("job-detail", slug=tenant.slug, job_id=job.pk)
        status = 400
    context = tenant_context(request, tenant) | parts | {"section": "submit"}
    return render(request, "jobs/new.html", context, status=status)


@login_required
@require_POST
def job_check(request: HttpRequest, slug: str) -> HttpResponse:
    """The submit form's check as the person types (htmx): the errors of each field filled in,
    and a preview of what would run (partition, share, resources, device-equivalent GPU-hours,
    the script), built by job_preview with the same rules as job_submit and nothing written.
    The share fields and the template's parameters come back too when what they depend on
    changed (_submit_form's refresh)."""
    tenant = tenant_or_404(request, slug)
    require_or_403(request.user, tenant, roles.SUBMIT_JOB)
    parts = _submit_form(request, tenant, refresh=True)
    form, data, preview = parts["form"], parts["data"], None
    if form.is_valid():
        job_request = _job_request(tenant, parts["scenario"], form)
        try:
            preview = services.job_preview(request=job_request)
        except PortalError as exc:
            _errors_on_form(form, exc)
    # While the person types, a field left empty is not yet an error; one filled in wrongly is.
    shown = form.shown_field_names()
    touched = {name for name in shown if data.get(name, "").strip()}
    field_errors = [(form[name], form.errors.get(name, []) if name in touched else []) for name in shown]
    context = parts | {"tenant": tenant, "preview": preview, "field_errors": field_errors}
    if preview is not None:
        context["priority_label"] = Priority(preview.priority).label
        context["share"] = job_request.share
        context["fraction"] = _plain(preview.device_fraction)
        context["devices"] = _plain(form.cleaned_data["gpus"] * preview.device_fraction)
        context["cost_at_most"] = money.as_text(
            estimate(gpu_model_id=job_request.gpu_model.pk, share=job_request.share.kind, tier=tenant.tier,
                     gpu_hours=preview.gpu_hours)
        )  # fmt: skip
    return _vary(render(request, "jobs/_check.html", context))


SUBMIT_FIELDS = (
    "gpus",
    "nodes",
    "walltime_minutes",
    "name",
    "priority",
    "env",
    "script",
    "template",
    "parameters",
    "partition",
    "preemptible",
    "max_restarts",
    "restart_exit_codes",
)


# --- Budgets


def budget_rows(statuses) -> list[dict]:
    """Each budget with a bar: spent, and reserved as the lighter segment; figures as money."""
    rows = []
    for status in statuses:
        budget, amount = status.budget, float(status.budget.amount)
        spent_pct = min(100, max(0, round(100 * float(status.spent) / amount)))
        total_pct = min(100, max(0, round(float(status.percent))))
        text = _("%(spent)s spent and %(reserved)s reserved of %(amount)s") % {
            "spent": money.as_text(status.spent), "reserved": money.as_text(status.reserved),
            "amount": money.as_text(budget.amount),
        }  # fmt: skip
        label = (
            _("Budget of %(month)s") % {"month": status.period_start.strftime("%Y-%m")}
            if budget.period == BudgetPeriod.MONTH
            else _("Budget of grant %(id)s") % {"id": budget.grant_id}
        )
        bar = {
            "id": f"budget-{budget.pk}", "label": label, "text": text, "now": round(float(status.total), 2),
            "max": amount, "pct": spent_pct, "extra": max(0, total_pct - spent_pct),
            "level": "high" if total_pct >= 100 else ("mid" if total_pct >= 80 else ""),
        }  # fmt: skip
        rows.append({"status": status, "bar": bar, "left": money.as_text(status.left),
                     "percent": round(float(status.percent), 1)})  # fmt: skip
    return rows


@login_required
def budget(request: HttpRequest, slug: str) -> HttpResponse:
    """The tenant's budgets, each with its bar and figures; its owners and managers set the
    month's or a grant's budget (billing.budgets.budget_set) or remove one."""
    tenant = tenant_or_404(request, slug)
    if request.method not in ("GET", "POST"):
        return HttpResponseNotAllowed(["GET", "POST"])
    today = timezone.localdate()
    grants = grants_not_ended_of(user=request.user, tenant=tenant, day=today).select_related(
        "scenario", "gpu_model"
    )
    form, status = BudgetForm(request.POST or None, grants=grants), 200
    if request.method == "POST":
        require_or_403(request.user, tenant, roles.MANAGE_MEMBERS)
        if "remove" in request.POST:
            value = request.POST["remove"]
            found = budget_of(tenant=tenant, budget_id=int(value)) if ID_RE.fullmatch(value) else None
            if found is None:
                raise Http404
            budget_delete(actor=request.user, budget=found)
            messages.success(request, _("The budget is removed."))
            return redirect("budget", slug=tenant.slug)
        if form.is_valid():
            try:
                budget_set(actor=request.user, tenant=tenant, amount=form.cleaned_data["amount"],
                           hard=form.cleaned_data["hard"], grant_id=form.grant_id())  # fmt: skip
            except PortalError as exc:
                form_errors_from(form, exc)
            else:
                messages.success(request, _("The budget is saved."))
                return redirect("budget", slug=tenant.slug)
        status = 400
    context = tenant_context(request, tenant) | {
        "section": "budget", "form": form, "budget_rows": budget_rows(budgets_of(tenant=tenant)),
        "currency": money.currency(),
    }  # fmt: skip
    return render(request, "jobs/budget.html", context, status=status)
