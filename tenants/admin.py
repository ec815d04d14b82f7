"""The admin console for tenants and quota. Every write with a side effect (permissions, grants,
mail, audit) goes through tenants.services, exactly as the API's do."""

from collections.abc import Callable

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import Count, Sum
from django.http import HttpRequest
from django.shortcuts import get_object_or_404, redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html
from django.utils.translation import gettext_lazy as _

from portal.core.errors import PortalError
from portal.core.staff import can_decide_quota, is_platform_admin, sees_all_tenants
from tenants import cohorts, services
from tenants.models import (
    ClusterAccount,
    Cohort,
    CohortMember,
    Membership,
    Profile,
    QuotaGrant,
    QuotaRequest,
    RequestState,
    Role,
    Tenant,
)

# What the decision page shows of the apps above tenants: jobs/admin.py adds the tenant's waiting
# and running jobs. tenants imports nothing of jobs (docs/architecture.md), so jobs registers a callback,
# (request, tenant) -> context, here.
DECISION_CONTEXT: list[Callable[[HttpRequest, Tenant], dict]] = []


class MembershipFormSet(forms.BaseInlineFormSet):
    def add_fields(self, form, index):
        super().add_fields(form, index)
        if form.instance.pk:
            # A member's user is fixed; to swap people, remove one and add the other.
            form.fields["user"].disabled = True

    def clean(self):
        super().clean()
        kept_owners = [
            form
            for form in self.forms
            if form.cleaned_data
            and not form.cleaned_data.get("DELETE")
            and form.cleaned_data.get("role") == Role.OWNER
        ]
        if self.instance.pk and not kept_owners:
            raise ValidationError(_("A tenant keeps at least one owner."))


class MembershipInline(admin.TabularInline):
    model = Membership
    formset = MembershipFormSet
    extra = 0
    fields = ["user", "role", "joined"]
    readonly_fields = ["joined"]
    autocomplete_fields = ["user"]


class ClusterAccountInline(admin.TabularInline):
    """The tenant's own cluster account on a cluster whose jobs run per tenant, where the
    cluster's name template does not fit (the site's account already has another name)."""

    model = ClusterAccount
    extra = 0
    fields = ["cluster", "username"]
    verbose_name = _("cluster account")


@admin.register(Profile)
class ProfileAdmin(admin.ModelAdmin):
    """Researchers' own cluster usernames, for clusters whose jobs run as their submitter."""

    list_display = ["user", "cluster_username"]
    search_fields = ["user__username", "cluster_username"]
    autocomplete_fields = ["user"]


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "tier", "state", "contact_email", "created"]
    list_filter = ["tier", "state"]
    search_fields = ["slug", "name"]
    inlines = [MembershipInline, ClusterAccountInline]

    def get_readonly_fields(self, request, obj=None):
        fixed = ["slug"] if obj else []
        # Tiers and states are platform admins' to set, as in the API (portal.core.staff).
        return fixed if is_platform_admin(request.user) else [*fixed, "tier", "state"]

    def has_add_permission(self, request):
        return super().has_add_permission(request) and is_platform_admin(request.user)

    def save_model(self, request, obj, form, change):
        if not change:
            created = services.tenant_create(
                actor=request.user,
                slug=obj.slug,
                name=obj.name,
                tier=obj.tier,
                contact_email=obj.contact_email,
            )
            obj.pk, obj.created = created.pk, created.created
            return
        changes = {field: form.cleaned_data[field] for field in form.changed_data}
        services.tenant_update(actor=request.user, tenant=Tenant.objects.get(pk=obj.pk), changes=changes)

    def save_formset(self, request, form, formset, change):
        # Instead of formset.save(): each change through its service, then what the admin's
        # history message reads from a saved formset. Additions and promotions to owner go
        # first, so that handing the tenant from one owner to another in one save never
        # passes through a moment with no owner.
        tenant = form.instance
        formset.new_objects, formset.changed_objects, formset.deleted_objects = [], [], []
        rows = [f for f in formset.forms if f.cleaned_data]
        first = [f for f in rows if not f.instance.pk or f.cleaned_data.get("role") == Role.OWNER]
        for inline_form in first + [f for f in rows if f not in first]:
            try:
                self._save_member(request, tenant, inline_form, formset)
            except PortalError as exc:
                self.message_user(request, exc.detail, messages.ERROR)

    def _save_member(self, request, tenant, inline_form, formset) -> None:
        data, membership = inline_form.cleaned_data, inline_form.instance
        if data.get("DELETE") and membership.pk:
            services.membership_remove(actor=request.user, membership=membership)
            formset.deleted_objects.append(membership)
        elif not membership.pk and not data.get("DELETE"):
            user, role = data["user"], data["role"]
            formset.new_objects.append(
                services.membership_add(actor=request.user, tenant=tenant, user=user, role=role)
            )
        elif "role" in inline_form.changed_data:
            original = Membership.objects.get(pk=membership.pk)
            services.membership_change_role(actor=request.user, membership=original, role=data["role"])
            formset.changed_objects.append((original, ["role"]))


class DecisionForm(forms.Form):
    decision = forms.ChoiceField(
        label=_("Decision"), choices=[("approve", _("Approve")), ("reject", _("Reject"))]
    )
    note = forms.CharField(
        label=_("Note"), widget=forms.Textarea(attrs={"rows": 3}), help_text=_("Sent to the team by mail.")
    )
    gpus = forms.IntegerField(
        label=_("GPUs"), min_value=1, required=False, help_text=_("Lower to approve in part")
    )
    gpu_hours = forms.DecimalField(
        label=_("GPU-hours"), min_value=0.01, max_digits=12, decimal_places=2, required=False
    )
    ends_on = forms.DateField(
        label=_("Ends on"), required=False, widget=forms.DateInput(attrs={"type": "date"})
    )


class BulkNoteForm(forms.Form):
    note = forms.CharField(label=_("Note"), widget=forms.Textarea(attrs={"rows": 3}))


@admin.register(QuotaRequest)
class QuotaRequestAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "tenant",
        "scenario",
        "gpu_model",
        "gpus",
        "gpu_hours",
        "starts_on",
        "ends_on",
        "state",
        "requested_by",
        "created",
        "decide_link",
    ]
    list_filter = ["state", "scenario", "gpu_model"]
    search_fields = ["tenant__slug", "justification"]
    list_select_related = ["tenant", "scenario", "gpu_model", "requested_by"]
    actions = ["approve_selected", "reject_selected"]
    readonly_fields = [f.name for f in QuotaRequest._meta.fields]

    def has_add_permission(self, request):
        return False  # teams request through the portal or the API

    def has_delete_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        # Changing a request is deciding it: the model permission, and the power the API asks for.
        return super().has_change_permission(request, obj) and can_decide_quota(request.user)

    @admin.display(description=_("Decision"))
    def decide_link(self, obj):
        if obj.state != RequestState.PENDING:
            return "—"
        return format_html(
            '<a href="{}">{}</a>', reverse("admin:tenants_quotarequest_decide", args=[obj.pk]), _("Decide")
        )

    def get_urls(self):
        decide = self.admin_site.admin_view(self.decide_view)
        return [path("<int:pk>/decide/", decide, name="tenants_quotarequest_decide"), *super().get_urls()]

    def decide_view(self, request, pk: int):
        """The request beside the tenant's grants, usage, waiting and running jobs and other requests,
        and the decision form; a fixed number of queries however many jobs wait."""
        # admin_view() lets in any staff user; the page shows a tenant's jobs and the form decides,
        # so the model's own permissions apply as on every admin page: view to read, change to decide.
        if not self.has_view_or_change_permission(request) or (
            request.method == "POST" and not self.has_change_permission(request)
        ):
            raise PermissionDenied
        quota_request = get_object_or_404(
            QuotaRequest.objects.select_related("tenant", "scenario", "gpu_model"), pk=pk
        )
        form = DecisionForm(request.POST or None)
        if request.method == "POST" and form.is_valid():
            data = form.cleaned_data
            try:
                if data["decision"] == "approve":
                    lowered = {k: data[k] for k in ("gpus", "gpu_hours", "ends_on") if data[k] is not None}
                    services.quota_request_approve(
                        actor=request.user, request=quota_request, note=data["note"], **lowered
                    )
                else:
                    services.quota_request_reject(
                        actor=request.user, request=quota_request, note=data["note"]
                    )
            except PortalError as exc:
                form.add_error(None, f"{exc.detail} {exc.extra.get('errors', '')}".strip())
            else:
                self.message_user(request, _("Request #%(id)s decided.") % {"id": pk}, messages.SUCCESS)
                return redirect("admin:tenants_quotarequest_changelist")
        tenant = quota_request.tenant
        grants = QuotaGrant.objects.filter(tenant=tenant).select_related("scenario", "gpu_model")
        context = {
            **self.admin_site.each_context(request),
            "title": _("Decide quota request #%(id)s") % {"id": pk},
            "opts": self.model._meta,
            "quota_request": quota_request,
            "form": form,
            "grants": grants,
            "usage": grants.aggregate(used=Sum("gpu_hours_used"), reserved=Sum("gpu_hours_reserved")),
            "other_requests": QuotaRequest.objects.filter(tenant=tenant)
            .exclude(pk=pk)
            .select_related("gpu_model")[:10],
        }
        for provide in DECISION_CONTEXT:
            context |= provide(request, tenant)
        return TemplateResponse(request, "admin/tenants/decide.html", context)

    def _bulk(self, request, queryset, decide, verb: str):
        form = BulkNoteForm(request.POST if "note" in request.POST else None)
        if form.is_valid():
            done = failed = 0
            for quota_request in queryset:
                try:
                    decide(actor=request.user, request=quota_request, note=form.cleaned_data["note"])
                    done += 1
                except PortalError:
                    failed += 1
            self.message_user(
                request,
                _("%(done)d decided, %(failed)d skipped (no longer pending).")
                % {"done": done, "failed": failed},
            )
            return None
        context = {
            **self.admin_site.each_context(request),
            "title": verb,
            "opts": self.model._meta,
            "requests": queryset,
            "form": form,
            "action": request.POST["action"],
        }
        return TemplateResponse(request, "admin/tenants/bulk_decide.html", context)

    @admin.action(description=_("Approve selected requests as asked"), permissions=["change"])
    def approve_selected(self, request, queryset):
        return self._bulk(request, queryset, services.quota_request_approve, _("Approve quota requests"))

    @admin.action(description=_("Reject selected requests"), permissions=["change"])
    def reject_selected(self, request, queryset):
        return self._bulk(request, queryset, services.quota_request_reject, _("Reject quota requests"))


@admin.register(QuotaGrant)
class QuotaGrantAdmin(admin.ModelAdmin):
    """Grants come from approvals; the ledger moves only through the services."""

    list_display = [
        "id",
        "tenant",
        "scenario",
        "gpu_model",
        "gpus",
        "gpus_in_use",
        "gpu_hours",
        "gpu_hours_used",
        "gpu_hours_reserved",
        "starts_on",
        "ends_on",
    ]
    list_filter = ["scenario", "gpu_model"]
    search_fields = ["tenant__slug"]
    list_select_related = ["tenant", "scenario", "gpu_model"]
    readonly_fields = [f.name for f in QuotaGrant._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


# --- Cohorts: tenants that lend each other idle GPUs (docs/architecture/lending.md). The staff
# roles' groups name no cohort permission, so the powers decide here: platform admins change
# cohorts and their members, and whoever reads every tenant (read-only support, quota
# approvers) reads them. Every write goes through tenants.cohorts, audited as the API's are.


class PlatformAdminChanges:
    """Add, change and delete for platform admins; view for those who read every tenant."""

    def has_view_permission(self, request, obj=None):
        return sees_all_tenants(request.user) or super().has_view_permission(request, obj)

    def has_add_permission(self, request, *args):
        return is_platform_admin(request.user)

    def has_change_permission(self, request, obj=None):
        return is_platform_admin(request.user)

    def has_delete_permission(self, request, obj=None):
        return is_platform_admin(request.user)


class CohortMemberFormSet(forms.BaseInlineFormSet):
    def add_fields(self, form, index):
        super().add_fields(form, index)
        if form.instance.pk:
            # A place is the tenant's: to swap tenants, remove one and add the other.
            form.fields["tenant"].disabled = True


class CohortMemberInline(PlatformAdminChanges, admin.TabularInline):
    """A tenant's place in the cohort: the most GPUs it lends, and borrows, at once."""

    model = CohortMember
    formset = CohortMemberFormSet
    extra = 0
    fields = ["tenant", "lending_limit", "borrowing_limit", "joined"]
    readonly_fields = ["joined"]
    autocomplete_fields = ["tenant"]


class CohortForm(forms.ModelForm):
    class Meta:
        model = Cohort
        fields = ["slug", "name", "gpu_model", "partition", "reclaim_grace_s"]

    def clean(self):
        # cohorts.cohort_create says so too; here the page shows it on the field, before any write
        data = super().clean()
        # a saved cohort's model is read-only, so not in the form
        model = self.instance.gpu_model if self.instance.pk else data.get("gpu_model")
        partition = data.get("partition")
        if partition is not None and model is not None and partition.gpu_model_id != model.pk:
            self.add_error("partition", _("This partition's GPUs are not the cohort's GPU model."))
        return data


@admin.register(Cohort)
class CohortAdmin(PlatformAdminChanges, admin.ModelAdmin):
    list_display = ["slug", "name", "gpu_model", "partition", "reclaim_grace_s", "member_count"]
    list_filter = ["gpu_model"]
    search_fields = ["slug", "name"]
    list_select_related = ["gpu_model", "partition__cluster"]
    form = CohortForm
    inlines = [CohortMemberInline]

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(member_count=Count("members"))

    def get_readonly_fields(self, request, obj=None):
        # As in the API: a cohort keeps its slug and GPU model (its loans are of that model).
        return ["slug", "gpu_model"] if obj else []

    @admin.display(description=_("members"), ordering="member_count")
    def member_count(self, obj) -> int:
        return obj.member_count

    def save_model(self, request, obj, form, change):
        if not change:
            made = cohorts.cohort_create(
                actor=request.user,
                slug=obj.slug,
                gpu_model=obj.gpu_model,
                name=obj.name,
                partition=obj.partition,
                reclaim_grace_s=obj.reclaim_grace_s,
            )
            obj.pk, obj.created = made.pk, made.created
            return
        changes = {
            field: form.cleaned_data[field] for field in form.changed_data if field in cohorts.COHORT_FIELDS
        }
        try:
            cohorts.cohort_update(actor=request.user, cohort=Cohort.objects.get(pk=obj.pk), changes=changes)
        except PortalError as exc:  # a partition that would make a member's places overlap
            self.message_user(request, exc.detail, messages.ERROR)

    def save_formset(self, request, form, formset, change):
        # Instead of formset.save(): each place through cohorts, then what the admin's history
        # message reads from a saved formset.
        cohort = form.instance
        formset.new_objects, formset.changed_objects, formset.deleted_objects = [], [], []
        for inline_form in (f for f in formset.forms if f.cleaned_data):
            data, member = inline_form.cleaned_data, inline_form.instance
            try:
                if data.get("DELETE"):
                    if member.pk:
                        cohorts.cohort_member_remove(actor=request.user, member=member)
                        formset.deleted_objects.append(member)
                elif not member.pk or inline_form.has_changed():
                    member, created = cohorts.cohort_member_set(
                        actor=request.user,
                        cohort=cohort,
                        tenant=data["tenant"] if not member.pk else member.tenant,
                        lending_limit=data["lending_limit"],
                        borrowing_limit=data["borrowing_limit"],
                    )
                    if created:
                        formset.new_objects.append(member)
                    else:
                        formset.changed_objects.append((member, inline_form.changed_data))
            except PortalError as exc:  # a tenant already in a cohort of this model here
                self.message_user(request, exc.detail, messages.ERROR)

    def delete_model(self, request, obj):
        self.delete_queryset(request, [obj])

    def delete_queryset(self, request, queryset):
        # Through the service, audited; a cohort with open loans stays (Conflict), said on the page.
        for cohort in queryset:
            try:
                cohorts.cohort_delete(actor=request.user, cohort=cohort)
            except PortalError as exc:
                self.message_user(request, exc.detail, messages.ERROR)
