"""The webhooks page of a tenant (its owners and managers: endpoints, their delivery log, a
redeliver button) and the account's notifications page (the job-end mail)."""

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from django.views.decorators.http import require_POST

from portal.core.errors import PortalError
from tenants import roles
from tenants.pages import form_errors_from, require_or_403, tenant_context, tenant_or_404
from webhooks import services
from webhooks.models import Delivery, Endpoint, EventType
from webhooks.selectors import endpoints_with_log, job_end_mail_of

LOG_SHOWN = 20  # deliveries shown per endpoint; the API pages through all


class EndpointForm(forms.Form):
    url = forms.CharField(
        label=gettext_lazy("URL"),
        max_length=2000,
        help_text=gettext_lazy("https, on a public address. Redirects are not followed."),
    )
    events = forms.MultipleChoiceField(
        label=gettext_lazy("Events"), widget=forms.CheckboxSelectMultiple,
        choices=[(value, label) for value, label in EventType.choices if value != EventType.PING],
    )  # fmt: skip
    description = forms.CharField(label=gettext_lazy("Description"), max_length=200, required=False)


def _page(
    request: HttpRequest, tenant, form: EndpointForm, *, secret=None, status: int = 200
) -> HttpResponse:
    endpoints = endpoints_with_log(tenant=tenant, shown=LOG_SHOWN)
    context = tenant_context(request, tenant) | {
        "section": "webhooks", "endpoints": endpoints, "form": form, "secret": secret,
    }  # fmt: skip
    return render(request, "webhooks/list.html", context, status=status)


def _manageable(request: HttpRequest, slug: str):
    tenant = tenant_or_404(request, slug)
    require_or_403(request.user, tenant, roles.MANAGE_MEMBERS)
    return tenant


@login_required
def webhooks(request: HttpRequest, slug: str) -> HttpResponse:
    tenant = _manageable(request, slug)
    if request.method != "POST":
        return _page(request, tenant, EndpointForm())
    form = EndpointForm(request.POST)
    if form.is_valid():
        try:
            endpoint, secret = services.endpoint_create(
                actor=request.user, tenant=tenant, **form.cleaned_data
            )
        except PortalError as exc:
            form_errors_from(form, exc)
        else:
            return _page(request, tenant, EndpointForm(), secret={"endpoint": endpoint, "value": secret})
    return _page(request, tenant, form, status=400)


@login_required
@require_POST
def endpoint_action(request: HttpRequest, slug: str, endpoint_id: int, action: str) -> HttpResponse:
    tenant = _manageable(request, slug)
    endpoint = get_object_or_404(Endpoint, tenant=tenant, pk=endpoint_id)
    if action == "delete":
        services.endpoint_delete(actor=request.user, endpoint=endpoint)
        messages.success(request, _("Webhook %(id)s removed.") % {"id": endpoint_id})
    elif action == "ping":
        services.ping(actor=request.user, endpoint=endpoint)
        messages.success(request, _("A test delivery is on its way."))
    else:
        enabled = action == "enable"
        services.endpoint_change(actor=request.user, endpoint=endpoint, enabled=enabled)
        done = _("Webhook %(id)s enabled.") if enabled else _("Webhook %(id)s disabled.")
        messages.success(request, done % {"id": endpoint_id})
    return redirect("webhooks", tenant.slug)


@login_required
@require_POST
def redeliver(request: HttpRequest, slug: str, endpoint_id: int, delivery_id: int) -> HttpResponse:
    tenant = _manageable(request, slug)
    delivery = get_object_or_404(Delivery, endpoint__tenant=tenant, endpoint_id=endpoint_id, pk=delivery_id)
    again = services.redeliver(actor=request.user, delivery=delivery)
    messages.success(
        request, _("Delivery %(id)s is sent again as %(again)s.") % {"id": delivery.pk, "again": again.pk}
    )
    return redirect("webhooks", tenant.slug)


class NotificationsForm(forms.Form):
    job_end_mail = forms.BooleanField(
        label=gettext_lazy("Mail me when a job of mine ends"), required=False,
        help_text=gettext_lazy("One mail per job, to your account's address, with its state and exit code."),
    )  # fmt: skip


@login_required
def notifications(request: HttpRequest) -> HttpResponse:
    if request.method == "POST":
        form = NotificationsForm(request.POST)
        if form.is_valid():
            services.job_end_mail_set(user=request.user, enabled=form.cleaned_data["job_end_mail"])
            messages.success(request, _("Your notifications are saved."))
            return redirect("notifications")
    else:
        form = NotificationsForm(initial={"job_end_mail": job_end_mail_of(request.user)})
    return render(request, "account/notifications.html", {"form": form, "email": request.user.email})
