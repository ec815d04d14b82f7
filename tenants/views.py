"""Pages of the researcher portal about a tenant: home, the tenant switcher, quota (with the
sizing advisor), the team, and the clusters its jobs can run on. Like the API, a view parses,
scopes through a selector and renders; a tenant outside the caller's answers 404, so that
nothing leaks its existence."""

from datetime import date

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.utils.formats import number_format
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext
from django.views.decorators.http import require_GET, require_POST
from rest_framework.exceptions import Throttled
from rest_framework.fields import empty as drf_empty

from clusters import advisor
from clusters.selectors import cluster_list, gpu_model_list, scenario_list
from clusters.serializers import ADVICE_IN
from portal.core.errors import Forbidden, Invalid, PortalError
from portal.core.staff import is_platform_admin
from tenants import roles, services
from tenants.forms import ADVICE_FIELDS, MemberAddForm, MemberRoleForm, QuotaRequestForm
from tenants.models import Membership, Role, Tenant
from tenants.permissions import member_candidate, require
from tenants.selectors import (
    grants_visible_to,
    members_of,
    memberships_of,
    quota_requests_visible_to,
    tenant_identity_rows,
    tenant_perms,
    tenants_visible_to,
)

# What a page says for each error a service raises, by its machine code (portal/core/errors.py).
# The service's own detail (English) is shown beneath it.
ERROR_MESSAGES = {
    "conflict": gettext_lazy("This cannot be done in the object's current state."),
    "permission_denied": gettext_lazy("Your role in this team does not allow this."),
    "invalid": gettext_lazy("Some of the input is not valid."),
    "no_quota": gettext_lazy("Your team has no quota grant that covers this."),
    "quota_exhausted": gettext_lazy("Your team's quota grant is used up for this."),
    "tenant_suspended": gettext_lazy("This team is suspended: it can read but not submit."),
    "last_owner": gettext_lazy("A team needs at least one owner."),
    "unavailable": gettext_lazy("The cluster cannot be reached right now. Please try again shortly."),
}


def error_message(exc: PortalError) -> str:
    return str(ERROR_MESSAGES.get(exc.code, gettext_lazy("The request could not be completed.")))


def require_or_403(user, tenant: Tenant, perm: str) -> None:
    """tenants.permissions.require, answered as a page's 403 (with the service's detail)."""
    try:
        require(user, tenant, perm)
    except Forbidden as exc:
        raise PermissionDenied(exc.detail) from None


def form_errors_from(form, exc: PortalError) -> None:
    """A service's error on the form: each field's messages next to its field, the rest on top."""
    if isinstance(exc, Invalid):
        for name, errors in exc.extra["errors"].items():
            field, _dot, part = name.partition(".")
            for error in errors:
                if field in form.fields:
                    form.add_error(field, f"{part}: {error}" if part else error)
                else:
                    form.add_error(None, f"{name}: {error}")
        return
    form.add_error(None, f"{error_message(exc)} {exc.detail}")


def pick_scenario(request: HttpRequest, scenarios) -> tuple[list, object]:
    """The scenarios, and the one the form names (POST, or GET ?scenario=); a GET without one
    takes the first. None when a POST names none that exists."""
    scenarios = list(scenarios)
    data = request.POST if request.method == "POST" else request.GET
    scenario = next((s for s in scenarios if s.slug == data.get("scenario")), None)
    if scenario is None and scenarios and request.method == "GET":
        scenario = scenarios[0]
    return scenarios, scenario


def tenant_or_404(request: HttpRequest, slug: str) -> Tenant:
    return get_object_or_404(tenants_visible_to(user=request.user), slug=slug)


def tenant_context(request: HttpRequest, tenant: Tenant | None) -> dict:
    """What the header of every page of a tenant shows: the switcher, the caller's role, and
    the tenant's permissions (which decide the controls a page offers)."""
    role, perms = None, frozenset()
    if tenant is not None:
        membership = memberships_of(user=request.user).filter(tenant=tenant).first()
        if membership:
            role = membership.get_role_display()
        else:  # staff who see every tenant; only platform admins act in it
            role = _("Platform admin") if is_platform_admin(request.user) else _("Staff (read-only)")
        perms = tenant_perms(user=request.user, tenant=tenant)
    return {
        "tenant": tenant,
        "switcher_tenants": tenants_visible_to(user=request.user).only("slug", "name").order_by("slug"),
        "my_role": role,
        "can_submit": roles.SUBMIT_JOB in perms,
        "can_request_quota": roles.REQUEST_QUOTA in perms,
        "can_manage_members": roles.MANAGE_MEMBERS in perms,
        "can_change_tenant": roles.CHANGE in perms,
    }


@login_required
@require_GET
def home(request: HttpRequest) -> HttpResponse:
    """The first of the caller's teams, or a page that says how to join one."""
    first = memberships_of(user=request.user).first()
    slug = first.tenant.slug if first else None
    if slug is None:
        slug = tenants_visible_to(user=request.user).order_by("slug").values_list("slug", flat=True).first()
    if slug is not None:
        return redirect("dashboard", slug=slug)
    return render(request, "home.html", tenant_context(request, None))


@login_required
@require_GET
def tenant_switch(request: HttpRequest) -> HttpResponse:
    """The header's switcher, a plain GET form so that it works without JavaScript; it keeps
    the section the caller was looking at."""
    tenant = tenant_or_404(request, request.GET.get("tenant", ""))
    return redirect(SWITCH_SECTIONS.get(request.GET.get("section", ""), "dashboard"), slug=tenant.slug)


# The header's `section` of a page, and the page of the same section in another team.
SWITCH_SECTIONS = {
    "jobs": "job-list",
    "submit": "job-new",
    "quota": "quota",
    "team": "team",
    "clusters": "clusters",
}


def grant_rows(grants, today: date) -> list[dict]:
    """Each grant with three bars: GPUs in use, GPU-hours used (and reserved), days left."""
    rows = []
    for grant in grants:
        total_days = (grant.ends_on - grant.starts_on).days + 1
        days_left = min(max((grant.ends_on - today).days + 1, 0), total_days)
        used_pct = _pct(grant.gpu_hours_used, grant.gpu_hours)
        gpus_pct = _pct(grant.gpus_in_use, grant.gpus)
        bars = [
            _bar(
                f"grant-{grant.pk}-gpus",
                _("GPUs in use"),
                _("%(used)s of %(limit)s") % {"used": grant.gpus_in_use, "limit": grant.gpus},
                now=grant.gpus_in_use,
                limit=grant.gpus,
                pct=gpus_pct,
                level=_level(gpus_pct),
            ),
            _bar(
                f"grant-{grant.pk}-hours",
                _("GPU-hours used"),
                _("%(used)s of %(limit)s (%(reserved)s reserved)")
                % {
                    "used": _num(grant.gpu_hours_used, 1),
                    "limit": _num(grant.gpu_hours, 0),
                    "reserved": _num(grant.gpu_hours_reserved, 1),
                },
                now=round(float(grant.gpu_hours_used), 2),
                limit=float(grant.gpu_hours),
                pct=used_pct,
                extra=min(_pct(grant.gpu_hours_reserved, grant.gpu_hours), 100 - used_pct),
                level=_level(_pct(grant.gpu_hours_used + grant.gpu_hours_reserved, grant.gpu_hours)),
            ),
            _bar(
                f"grant-{grant.pk}-days",
                _("Days left"),
                ngettext("%(left)s day left of %(total)s", "%(left)s days left of %(total)s", days_left)
                % {"left": days_left, "total": total_days},
                now=days_left,
                limit=total_days,
                pct=_pct(days_left, total_days),
                level="high" if days_left <= 7 else ("mid" if days_left <= 14 else "time"),
            ),
        ]
        rows.append({"grant": grant, "upcoming": grant.starts_on > today, "bars": bars})
    return rows


def _bar(bar_id: str, label: str, text: str, *, now, limit, pct: int, level: str, extra: int = 0) -> dict:
    return {
        "id": bar_id, "label": label, "text": text, "now": now, "max": limit, "pct": pct, "extra": extra,
        "level": level,
    }  # fmt: skip


def _num(value, places: int) -> str:
    return number_format(round(value, places), places)  # number_format alone truncates


def _level(pct: int) -> str:
    return "high" if pct >= 90 else ("mid" if pct >= 75 else "")


def _pct(part, whole) -> int:
    return 0 if not whole else max(0, min(100, round(100 * float(part) / float(whole))))


# --- Quota: requests and grants


def advice_context(scenario, data) -> dict:
    """The sizing advisor of the quota page for the scenario, on what the person typed: the
    inputs (typed value, else the advisor's default), the errors of the fields given, the
    fields still missing, and the advice once the input is whole. The API's serializer
    validates, so the page and POST /scenarios/{slug}/advise/ agree."""
    fields = ADVICE_FIELDS.get(scenario.advisor) if scenario else None
    if not fields:
        return {"advice_fields": None}
    serializer_class = ADVICE_IN[scenario.advisor]
    declared = serializer_class().fields
    given = {f.name: data[f.name].strip() for f in fields if data.get(f.name, "").strip()}
    serializer = serializer_class(data=given)
    valid = serializer.is_valid()
    errors = {} if valid else serializer.errors
    inputs = []
    for f in fields:
        default = declared[f.name].default
        value = given.get(f.name, "" if default is drf_empty else default)
        inputs.append({"field": f, "id": f"advice-{f.name}", "value": value})
    labels = {f.name: f.label for f in fields}
    missing = [labels[name] for name, errs in errors.items() if any(e.code == "required" for e in errs)]
    shown = [
        f"{labels.get(name, '')}: {error}" if name in labels else str(error)
        for name, errs in errors.items()
        for error in errs
        if error.code != "required"
    ]
    advice = None
    if valid:
        gpus = [entry.gpu_model for entry in scenario.ranking.all()]
        advice = advisor.advise(advisor=scenario.advisor, job=serializer.job(), gpus=gpus)
    names = {entry.gpu_model.slug: entry.gpu_model.name for entry in scenario.ranking.all()}
    options = [{"option": o, "name": names.get(o.gpu_model)} for o in getattr(advice, "options", [])]
    return {
        "advice_fields": inputs,
        "advice": advice,
        "advice_options": options,
        "advice_missing": missing,
        "advice_errors": shown,
    }


@login_required
@require_GET
def quota_advise(request: HttpRequest, slug: str) -> HttpResponse:
    """The advisor's answer alone, for the quota page's live update (htmx) as the person types."""
    tenant = tenant_or_404(request, slug)
    scenario = get_object_or_404(scenario_list(), slug=request.GET.get("scenario", ""))
    context = {"tenant": tenant, "scenario": scenario} | advice_context(scenario, request.GET)
    return render(request, "tenants/_advice_result.html", context)


@login_required
def quota(request: HttpRequest, slug: str) -> HttpResponse:
    """The tenant's grants and quota requests; owners and managers request more by scenario."""
    tenant = tenant_or_404(request, slug)
    if request.method not in ("GET", "POST"):
        return HttpResponseNotAllowed(["GET", "POST"])
    if request.method == "POST":
        require_or_403(request.user, tenant, roles.REQUEST_QUOTA)
    scenarios, scenario = pick_scenario(request, scenario_list())
    ranking = list(scenario.ranking.all()) if scenario else []
    form = QuotaRequestForm(request.POST if request.method == "POST" else None, ranking=ranking)
    status = 200
    if request.method == "POST":
        if scenario is None:
            form.add_error(None, _("Choose a scenario."))
        if form.is_valid():
            by_slug = {r.gpu_model.slug: r.gpu_model for r in ranking}
            fields = {k: v for k, v in form.cleaned_data.items() if k != "gpu_model"}
            try:
                created = services.quota_request_create(
                    actor=request.user, tenant=tenant, scenario=scenario,
                    gpu_model=by_slug[form.cleaned_data["gpu_model"]], **fields,
                )  # fmt: skip
            except PortalError as exc:
                form_errors_from(form, exc)
            else:
                messages.success(request, _("Quota request %(id)s sent.") % {"id": created.pk})
                return redirect("quota", slug=tenant.slug)
        status = 400
    today = timezone.localdate()
    grants = grants_visible_to(user=request.user).filter(tenant=tenant).order_by("-ends_on", "id")
    context = tenant_context(request, tenant) | {
        "section": "quota",
        "form": form,
        "scenarios": scenarios,
        "scenario": scenario,
        "ranking": ranking,
        "grants": grants,
        "today": today,
        "requests": quota_requests_visible_to(user=request.user).filter(tenant=tenant),
        **advice_context(scenario, request.GET),
    }
    return render(request, "tenants/quota.html", context, status=status)


@login_required
@require_POST
def quota_withdraw(request: HttpRequest, slug: str, request_id: int) -> HttpResponse:
    tenant = tenant_or_404(request, slug)
    quota_request = get_object_or_404(
        quota_requests_visible_to(user=request.user).filter(tenant=tenant), pk=request_id
    )
    require_or_403(request.user, tenant, roles.REQUEST_QUOTA)
    try:
        services.quota_request_withdraw(actor=request.user, request=quota_request)
    except PortalError as exc:
        messages.error(request, f"{error_message(exc)} {exc.detail}", extra_tags=exc.code)
    else:
        messages.success(request, _("Quota request %(id)s withdrawn.") % {"id": quota_request.pk})
    return redirect("quota", slug=tenant.slug)


# --- Team


def _require_manage(user, tenant: Tenant, *touched_roles: str) -> None:
    """As the API: managers manage members; making or unmaking an owner takes an owner."""
    require_or_403(user, tenant, roles.MANAGE_MEMBERS)
    if Role.OWNER in touched_roles:
        require_or_403(user, tenant, roles.CHANGE)


def _team_page(request: HttpRequest, tenant: Tenant, form: MemberAddForm | None = None, status: int = 200):
    context = tenant_context(request, tenant) | {
        "section": "team",
        "members": members_of(tenant=tenant).order_by("user__username"),
        "cluster_accounts": tenant_identity_rows(tenant=tenant),
        "form": form or MemberAddForm(),
        "roles": Role.choices,
    }
    return render(request, "tenants/team.html", context, status=status)


@login_required
@require_GET
def team(request: HttpRequest, slug: str) -> HttpResponse:
    return _team_page(request, tenant_or_404(request, slug))


@login_required
@require_POST
def member_add(request: HttpRequest, slug: str) -> HttpResponse:
    tenant = tenant_or_404(request, slug)
    require_or_403(request.user, tenant, roles.MANAGE_MEMBERS)
    form = MemberAddForm(request.POST)
    status, retry_after = 400, None
    if form.is_valid():
        _require_manage(request.user, tenant, form.cleaned_data["role"])
        try:
            user = member_candidate(request.user, form.cleaned_data["username"])
            membership = services.membership_add(
                actor=request.user, tenant=tenant, user=user, role=form.cleaned_data["role"]
            )
        except Throttled as exc:
            form.add_error(
                None,
                _("Too many usernames that name no one. Try again in %(minutes)s minutes.")
                % {"minutes": max(1, round(exc.wait / 60))},
            )
            status, retry_after = 429, exc.wait
        except PortalError as exc:
            form_errors_from(form, exc)
        else:
            messages.success(
                request, _("%(username)s joined as %(role)s.")
                % {"username": membership.user.username, "role": membership.get_role_display()},
            )  # fmt: skip
            return redirect("team", slug=tenant.slug)
    response = _team_page(request, tenant, form, status=status)
    if retry_after is not None:
        response["Retry-After"] = str(retry_after)
    return response


def _membership_or_404(request: HttpRequest, tenant: Tenant, username: str) -> Membership:
    return get_object_or_404(
        Membership.objects.filter(tenant=tenant).select_related("user", "tenant"), user__username=username
    )


@login_required
@require_POST
def member_role(request: HttpRequest, slug: str, username: str) -> HttpResponse:
    tenant = tenant_or_404(request, slug)
    require_or_403(request.user, tenant, roles.MANAGE_MEMBERS)
    membership = _membership_or_404(request, tenant, username)
    form = MemberRoleForm(request.POST)
    if not form.is_valid():
        messages.error(request, _("Choose one of the roles."))
        return redirect("team", slug=tenant.slug)
    _require_manage(request.user, tenant, membership.role, form.cleaned_data["role"])
    try:
        membership = services.membership_change_role(
            actor=request.user, membership=membership, role=form.cleaned_data["role"]
        )
    except PortalError as exc:
        messages.error(request, f"{error_message(exc)} {exc.detail}", extra_tags=exc.code)
    else:
        messages.success(
            request, _("%(username)s is now %(role)s.")
            % {"username": username, "role": membership.get_role_display()},
        )  # fmt: skip
    return redirect("team", slug=tenant.slug)


@login_required
@require_POST
def member_remove(request: HttpRequest, slug: str, username: str) -> HttpResponse:
    tenant = tenant_or_404(request, slug)
    membership = _membership_or_404(request, tenant, username)
    if membership.user_id != request.user.id:  # anyone may leave; removing others takes the role
        _require_manage(request.user, tenant, membership.role)
    try:
        services.membership_remove(actor=request.user, membership=membership)
    except PortalError as exc:
        messages.error(request, f"{error_message(exc)} {exc.detail}", extra_tags=exc.code)
        return redirect("team", slug=tenant.slug)
    messages.success(request, _("%(username)s was removed from the team.") % {"username": username})
    if membership.user_id == request.user.id:
        return redirect("home")
    return redirect("team", slug=tenant.slug)


# --- Clusters: where the team's jobs can run

# The health columns on top of what cluster_list loads; never a connection or secret column.
# health_detail is the backend's own words (hosts, users, paths): platform admins' only.
CLUSTER_COLUMNS = ("id", "slug", "name", "kind", "healthy", "health_checked_at")
CLUSTER_ADMIN_COLUMNS = (*CLUSTER_COLUMNS, "health_detail")
GPU_MODEL_COLUMNS = (
    "id", "slug", "vendor", "name", "memory_gb", "fp64_tflops", "fp16_tflops", "memory_bandwidth_gbs",
)  # fmt: skip


def walltime_text(minutes: int) -> str:
    """60 → "1 h", 2160 → "1 d 12 h", 90 → "1 h 30 min": what a researcher plans a job by."""
    days, rest = divmod(minutes, 24 * 60)
    hours, mins = divmod(rest, 60)
    parts = []
    if days:
        parts.append(_("%(days)s d") % {"days": days})
    if hours:
        parts.append(_("%(hours)s h") % {"hours": hours})
    if mins:
        parts.append(_("%(minutes)s min") % {"minutes": mins})
    return " ".join(parts)


@login_required
@require_GET
def clusters(request: HttpRequest, slug: str) -> HttpResponse:
    """Clusters with partitions, each partition marked when the tenant's current grants cover its
    GPU model; then the GPU models' figures. Six queries whatever the number of clusters. Why a
    cluster is unhealthy is for platform admins: the backend's words name hosts, users and paths."""
    tenant = tenant_or_404(request, slug)
    health_detail = is_platform_admin(request.user)
    columns = CLUSTER_ADMIN_COLUMNS if health_detail else CLUSTER_COLUMNS
    today = timezone.localdate()
    covered = set(
        grants_visible_to(user=request.user)
        .filter(tenant=tenant, starts_on__lte=today, ends_on__gte=today)
        .values_list("gpu_model_id", flat=True)
    )
    gpu_models = list(gpu_model_list().only(*GPU_MODEL_COLUMNS).order_by("vendor", "name", "slug"))
    # cluster_list loads only the GPU model's slug with a partition: the names come from the
    # models above, so that no partition row fetches its model on its own.
    model_names = {m.pk: m.name for m in gpu_models}
    rows = [
        {
            "cluster": cluster,
            "partitions": [
                {
                    "partition": p,
                    "gpu_model": model_names.get(p.gpu_model_id, p.gpu_model.slug),
                    "walltime": walltime_text(p.max_walltime_minutes),
                    "covered": p.gpu_model_id in covered,
                }
                for p in cluster.partitions.all()
            ],
        }
        for cluster in cluster_list().only(*columns).order_by("slug")
    ]
    context = tenant_context(request, tenant) | {
        "section": "clusters",
        "clusters": rows,
        "gpu_models": gpu_models,
        "show_health_detail": health_detail,
    }
    return render(request, "clusters/list.html", context)
