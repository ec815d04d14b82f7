"""Pages of the researcher portal about a tenant: home, the tenant switcher, quota (with the
sizing advisor), the team, and the clusters its jobs can run on. Like the API, a view parses,
scopes through a selector and renders; a tenant outside the caller's answers 404, so that
nothing leaks its existence (tenants.pages.tenant_or_404)."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.utils.translation import gettext as _
from django.views.decorators.http import require_GET, require_POST
from rest_framework.exceptions import Throttled
from rest_framework.fields import empty as drf_empty

from clusters import advisor
from clusters.selectors import scenario_list
from clusters.serializers import ADVICE_IN
from clusters.views import catalog_context
from portal.core.errors import PortalError
from tenants import roles, services
from tenants.forms import ADVICE_FIELDS, MemberAddForm, MemberRoleForm, QuotaRequestForm
from tenants.models import Membership, Role, Tenant
from tenants.pages import (
    error_message,
    form_errors_from,
    pick_scenario,
    require_or_403,
    tenant_context,
    tenant_or_404,
)
from tenants.permissions import member_candidate
from tenants.selectors import (
    granted_gpu_model_ids_of,
    grants_of,
    members_of,
    memberships_of,
    quota_requests_visible_to,
    tenant_identity_rows,
    tenants_visible_to,
)


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
    context = tenant_context(request, tenant) | {
        "section": "quota",
        "form": form,
        "scenarios": scenarios,
        "scenario": scenario,
        "ranking": ranking,
        "grants": grants_of(user=request.user, tenant=tenant),
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


@login_required
@require_GET
def clusters(request: HttpRequest, slug: str) -> HttpResponse:
    """The cluster catalog (clusters.views.catalog_context), each partition marked when the
    tenant's current grants cover its GPU model. Six queries whatever the number of clusters."""
    tenant = tenant_or_404(request, slug)
    covered = granted_gpu_model_ids_of(user=request.user, tenant=tenant, day=timezone.localdate())
    context = tenant_context(request, tenant) | catalog_context(user=request.user, covered=covered)
    return render(request, "clusters/list.html", context | {"section": "clusters"})
