"""Pages of statements (a tenant's), the site report and the TCO view (platform admins)."""

from datetime import date

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils.formats import number_format
from django.utils.translation import get_language
from django.utils.translation import gettext as _
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from billing import money
from billing.money import as_text, rounded
from portal.core.errors import PortalError
from portal.core.staff import is_platform_admin, sees_all_tenants
from reports import tco
from reports.forms import CloudPriceFormSet, TcoExampleForm, TcoProfileForm, cloud_prices_of
from reports.selectors import statements_visible_to
from reports.serializers import SiteReportIn
from reports.site import site_report_of
from reports.statements import statement_view
from reports.tco_profiles import (
    COST_FIELDS,
    costs_of,
    figures_of,
    tco_example_load,
    tco_profile_change,
    tco_profile_create,
    tco_profile_delete,
    tco_profiles_visible_to,
)
from tenants.pages import form_errors_from, tenant_context, tenant_or_404

# --- Statements


def statement_chart(rows: list[dict], label: str) -> dict:
    """A bar chart's data for static/js/portal.js: names, and amounts rounded as shown."""
    names, values = [r["name"] for r in rows], [float(rounded(r["cost"])) for r in rows]
    return {"kind": "names", "label": label, "labels": names, "values": values}


@login_required
@require_GET
def statements(request: HttpRequest, slug: str) -> HttpResponse:
    """The tenant's statements, newest month first: every member reads them."""
    tenant = tenant_or_404(request, slug)
    language = get_language()
    rows = [
        {"statement": s, "cost_text": as_text(s.cost, language), "budget_text": as_text(s.budget, language)}
        for s in statements_visible_to(user=request.user).filter(tenant=tenant).order_by("-month")
    ]
    context = tenant_context(request, tenant) | {"section": "statements", "rows": rows}
    return render(request, "reports/statements.html", context)


@login_required
@require_GET
def statement(request: HttpRequest, slug: str, key: str) -> HttpResponse:
    """One statement, by its month (YYYY-MM) or id: totals against the budget, charts, the sums
    by GPU model, scenario and user, the grants, the lines; links to its PDF, CSV and XLSX."""
    tenant = tenant_or_404(request, slug)
    found = statements_visible_to(user=request.user).filter(tenant=tenant)
    if "-" in key:
        found = found.filter(month=date(int(key[:4]), int(key[5:]), 1))
    else:
        found = found.filter(pk=int(key))
    statement = get_object_or_404(found)
    view = statement_view(statement, language=get_language())
    context = tenant_context(request, tenant) | {
        "section": "statements",
        "statement": statement,
        "view": view,
        "chart_by_gpu_model": statement_chart(view["by_gpu_model"], _("Cost (%s)") % statement.currency),
        "chart_by_user": statement_chart(view["by_user"], _("Cost (%s)") % statement.currency),
        "pdf_languages": [("en", "English"), ("zh-hans", "简体中文")],
    }
    return render(request, "reports/statement.html", context)


# --- Site report


def site_report_charts(report) -> dict:
    """The page's charts for static/js/portal.js: GPU-hours and cost per day (bars), cost per
    tenant (bars, by name), each partition's allocation per day (lines, %)."""
    days = [row.key for row in report.usage["day"]]
    partitions: dict[str, dict] = {}
    for row in report.utilization:
        partitions.setdefault(row.partition, {})[row.day.isoformat()] = row.allocated_pct
    labels = sorted({row.day.isoformat() for row in report.utilization})
    return {
        "hours": {
            "label": _("GPU-hours"),
            "labels": days,
            "values": [float(r.gpu_hours) for r in report.usage["day"]],
        },
        "cost": {
            "label": _("Cost (%(currency)s)") % {"currency": report.currency},
            "labels": days,
            "values": [float(rounded(r.cost)) for r in report.usage["day"]],
        },
        "tenants": {
            "kind": "names",
            "label": _("Cost (%(currency)s)") % {"currency": report.currency},
            "labels": [r.key for r in report.top_tenants],
            "values": [float(rounded(r.cost)) for r in report.top_tenants],
        },
        "utilization": {
            "kind": "line",
            "unit": "%",
            "max": 100,
            "labels": labels,
            "series": [
                {"label": name, "values": [by_day.get(day) for day in labels]}
                for name, by_day in partitions.items()
            ],
        },
    }


@login_required
@require_GET
def site_report(request: HttpRequest) -> HttpResponse:
    """The site report over a range of days (platform staff who see every tenant; 403 others)."""
    if not sees_all_tenants(request.user):
        raise PermissionDenied(_("Only platform staff may see the site report."))
    query = SiteReportIn(data=request.GET)
    context = tenant_context(request, None) | {"section": "site-report", "currency": money.currency()}
    if not query.is_valid():
        errors = [f"{name}: {' '.join(str(e) for e in errs)}" for name, errs in query.errors.items()]
        context |= {"errors": errors, "start": request.GET.get("from", ""), "end": request.GET.get("to", "")}
        return render(request, "reports/site.html", context, status=400)
    data = query.validated_data
    report = site_report_of(user=request.user, start=data["from"], end=data["to"], top=data["top"])
    context |= {
        "report": report,
        "start": data["from"].isoformat(),
        "end": data["to"].isoformat(),
        "charts": site_report_charts(report),
        "usage_groups": [
            (group, title, report.usage[group])
            for group, title in (
                ("tenant", _("By tenant")),
                ("gpu_model", _("By GPU model")),
                ("scenario", _("By scenario")),
                ("cluster", _("By cluster")),
                ("partition", _("By partition")),
            )
        ],
        "export_query": f"from={data['from'].isoformat()}&to={data['to'].isoformat()}&top={data['top']}",
    }
    return render(request, "reports/site.html", context)


# --- TCO


def require_platform_admin_page(request: HttpRequest) -> None:
    if not is_platform_admin(request.user):
        raise PermissionDenied(_("Only platform admins may see the TCO view."))


def tco_chart(row) -> dict:
    """The chart's figures (as the page rounds them): cost per delivered GPU-hour at 10–100 %,
    each cloud price, and where it breaks even."""
    return {
        "currency": money.currency(),
        "label": str(_("Cost per delivered GPU-hour")),
        "curve": [[str(u * 100), money.as_api(cost)] for u, cost in tco.curve(costs_of(row.profile))],
        "clouds": [
            {
                "label": cloud.provider,
                "price": money.as_api(cloud.per_gpu_hour),
                "break_even": None if cloud.never_breaks_even else str(round(cloud.break_even * 100, 2)),
            }
            for cloud in row.figures.clouds
        ],
    }


def tco_percent(ratio) -> str:
    return f"{number_format(round(ratio * 100, 1), 1)} %"


def tco_shown(row) -> dict:
    """The figures as the page shows them: money in the site's currency for the reader's language
    (rounded half to even), ratios as percentages."""
    figures = row.figures
    return {
        "cost_per_gpu_hour": money.as_text(figures.cost_per_gpu_hour),  # "" for none (utilization 0)
        "measured": tco_percent(row.measured_utilization),
        "utilization": tco_percent(figures.utilization),
        "yearly": money.as_text(figures.yearly.total),
        "depreciation": money.as_text(figures.yearly.depreciation),
        "power": money.as_text(figures.yearly.power),
        "staff": money.as_text(figures.yearly.staff),
        "space": money.as_text(figures.yearly.space),
        "clouds": [
            {
                "provider": cloud.provider,
                "price": money.as_text(cloud.per_gpu_hour),
                "break_even": None if cloud.never_breaks_even else tco_percent(cloud.break_even),
                "cloud_yearly": money.as_text(cloud.cloud_yearly),
                "saving": None if cloud.saving_pct is None else tco_percent(cloud.saving_pct / 100),
            }
            for cloud in figures.clouds
        ],
    }


def tco_page(request, *, selected=None, form=None, prices=None, new_form=None, new_prices=None, status=200):
    profiles = list(tco_profiles_visible_to(user=request.user))
    if selected is None and profiles:
        wanted = request.GET.get("profile", "")
        selected = next((p for p in profiles if str(p.pk) == wanted), profiles[0])
    row = figures_of([selected])[0] if selected is not None else None
    if selected is not None and form is None:
        initial = {name: getattr(selected, name) for name in COST_FIELDS}
        initial |= {"name": selected.name, "cluster": selected.cluster, "gpu_model": selected.gpu_model}
        form = TcoProfileForm(initial=initial, prefix="edit")
        prices = CloudPriceFormSet(
            initial=[
                {"provider": p.provider, "per_gpu_hour": p.per_gpu_hour} for p in selected.cloud_prices.all()
            ],
            prefix="edit-cloud",
        )
    context = tenant_context(request, None) | {
        "profiles": profiles,
        "selected": selected,
        "row": row,
        "chart": tco_chart(row) if row is not None else None,
        "shown": tco_shown(row) if row is not None else None,
        "form": form,
        "prices": prices,
        "new_form": new_form or TcoProfileForm(prefix="new"),
        "new_prices": new_prices or CloudPriceFormSet(prefix="new-cloud"),
        "example_form": TcoExampleForm(),
        "currency": money.currency(),
        "published_saving_pct": tco.PUBLISHED_SAVING_PCT,
    }
    return render(request, "reports/tco.html", context, status=status)


@login_required
@require_http_methods(["GET", "POST"])
def tco_view(request: HttpRequest) -> HttpResponse:
    """The TCO view (GET); a new profile (POST)."""
    require_platform_admin_page(request)
    if request.method == "GET":
        return tco_page(request)
    form = TcoProfileForm(request.POST, prefix="new")
    prices = CloudPriceFormSet(request.POST, prefix="new-cloud")
    if form.is_valid() and prices.is_valid():
        try:
            profile = tco_profile_create(
                actor=request.user, **form.cleaned_data, cloud_prices=cloud_prices_of(prices)
            )
        except PortalError as exc:
            form_errors_from(form, exc)
        else:
            messages.success(request, _("The TCO profile is saved."))
            return redirect(f"{reverse('tco')}?profile={profile.pk}")
    return tco_page(request, new_form=form, new_prices=prices, status=400)


@login_required
@require_POST
def tco_save(request: HttpRequest, profile_id: str) -> HttpResponse:
    require_platform_admin_page(request)
    profile = get_object_or_404(tco_profiles_visible_to(user=request.user), pk=int(profile_id))
    form = TcoProfileForm(request.POST, prefix="edit")
    prices = CloudPriceFormSet(request.POST, prefix="edit-cloud")
    if form.is_valid() and prices.is_valid():
        try:
            tco_profile_change(
                actor=request.user, profile=profile, **form.cleaned_data, cloud_prices=cloud_prices_of(prices)
            )
        except PortalError as exc:
            form_errors_from(form, exc)
        else:
            messages.success(request, _("The TCO profile is saved."))
            return redirect(f"{reverse('tco')}?profile={profile.pk}")
    return tco_page(request, selected=profile, form=form, prices=prices, status=400)


@login_required
@require_POST
def tco_delete(request: HttpRequest, profile_id: str) -> HttpResponse:
    require_platform_admin_page(request)
    profile = get_object_or_404(tco_profiles_visible_to(user=request.user), pk=int(profile_id))
    tco_profile_delete(actor=request.user, profile=profile)
    messages.success(request, _("The TCO profile is deleted."))
    return redirect("tco")


@login_required
@require_POST
def tco_example(request: HttpRequest) -> HttpResponse:
    """The example of published figures, as the site's profile."""
    require_platform_admin_page(request)
    form = TcoExampleForm(request.POST)
    if not form.is_valid():
        messages.error(request, " ".join(str(e) for errors in form.errors.values() for e in errors))
        return redirect("tco")
    try:
        profile = tco_example_load(actor=request.user, rate=form.cleaned_data["rate"])
    except PortalError as exc:
        messages.error(request, exc.detail)
        return redirect("tco")
    messages.success(request, _("The example is loaded: change its figures to your own."))
    return redirect(f"{reverse('tco')}?profile={profile.pk}")
