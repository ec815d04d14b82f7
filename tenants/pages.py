"""What the portal's pages share, tenants' and jobs' alike: the tenant a page is about (404
outside the caller's tenants) and its header, a role check answered as a 403, a service's errors
on a form or in a message, the scenario picker, and a grant's bars."""

from datetime import date

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest
from django.shortcuts import get_object_or_404
from django.utils.formats import number_format
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext

from portal.core.errors import Forbidden, Invalid, PortalError
from portal.core.staff import is_platform_admin
from tenants import roles
from tenants.models import Tenant
from tenants.permissions import require
from tenants.selectors import memberships_of, tenant_perms, tenants_visible_to

# What a page says for each error a service raises, by its machine code (portal/core/errors.py).
# The service's own detail (English) is shown beneath it.
ERROR_MESSAGES = {
    "conflict": gettext_lazy("This cannot be done in the object's current state."),
    "permission_denied": gettext_lazy("Your role in this team does not allow this."),
    "invalid": gettext_lazy("Some of the input is not valid."),
    "no_quota": gettext_lazy("Your team has no quota grant that covers this."),
    "quota_exhausted": gettext_lazy("Your team's quota grant is used up for this."),
    "budget_exhausted": gettext_lazy("Your team's budget cannot take this job."),
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
