from django.contrib import admin, messages
from django.utils.translation import gettext_lazy as _

from jobs.models import Job, JobAttempt, JobEvent, Loan
from jobs.selectors import job_counts_of, jobs_waiting_of
from jobs.services import job_cancel
from portal.core.errors import PortalError
from portal.core.staff import is_platform_admin, sees_all_tenants
from tenants.admin import DECISION_CONTEXT

WAITING_JOBS_SHOWN = 50


def decision_jobs(request, tenant) -> dict:
    """The quota decision page's view of the tenant's jobs: those waiting (the first 50, longest
    waiting first, and how many more) and how many run. Two queries."""
    waiting = list(jobs_waiting_of(user=request.user, tenant=tenant)[:WAITING_JOBS_SHOWN])
    counts = job_counts_of(user=request.user, tenant=tenant)
    return {"waiting_jobs": waiting, "waiting_more": counts["waiting"] - len(waiting), "job_counts": counts}


DECISION_CONTEXT.append(decision_jobs)


class JobEventInline(admin.TabularInline):
    model = JobEvent
    extra = 0
    can_delete = False
    readonly_fields = ["at", "attempt", "from_state", "to_state", "reason", "raw_state"]

    def has_add_permission(self, request, obj=None):
        return False


class ReadOnlyForStaff:
    """Rows the services write: read by whoever reads every tenant (the staff roles' groups name
    no permission of these models), changed by no one here."""

    def has_view_permission(self, request, obj=None):
        return sees_all_tenants(request.user) or super().has_view_permission(request, obj)

    def has_add_permission(self, request, *args):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class JobAttemptInline(ReadOnlyForStaff, admin.TabularInline):
    """The ended runs of a restarted job; the scheduler token stays out (JobAdmin.PRIVATE_FIELDS)."""

    model = JobAttempt
    extra = 0
    fields = readonly_fields = [
        "number", "backend_id", "node_list", "started_at", "ended_at", "end_state", "reason", "exit_code",
        "gpu_hours", "checkpoint_at", "gpu_hours_lost", "reviewed",
    ]  # fmt: skip


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    """Jobs as the portal follows them; states move only through the services."""

    list_display = [
        "id",
        "name",
        "tenant",
        "state",
        "reason",
        "cluster",
        "partition",
        "gpus",
        "priority",
        "created",
    ]
    list_filter = ["state", "cluster", "priority", "scenario"]
    search_fields = ["name", "tenant__slug", "backend_id", "token"]
    list_select_related = ["tenant", "cluster", "partition"]
    inlines = [JobAttemptInline, JobEventInline]
    actions = ["cancel_selected"]

    # A job's script and environment often carry credentials, and its scheduler token is what
    # reconciliation adopts a job by: only platform admins read them here (as in the API, where
    # the job's submitter and its tenant's managers read script and environment too).
    PRIVATE_FIELDS = ("script", "env", "token")

    def get_fields(self, request, obj=None):
        fields = super().get_fields(request, obj)
        if is_platform_admin(request.user):
            return fields
        return [name for name in fields if name not in self.PRIVATE_FIELDS]

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in Job._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    @admin.action(description=_("Cancel selected jobs"), permissions=["change"])
    def cancel_selected(self, request, queryset):
        done = skipped = 0
        for job in queryset.select_related("tenant"):
            try:
                job_cancel(actor=request.user, job=job)
                done += 1
            except PortalError:
                skipped += 1
        self.message_user(
            request,
            _("%(done)d cancelled, %(skipped)d had already ended.") % {"done": done, "skipped": skipped},
            messages.INFO,
        )


class OpenLoanFilter(admin.SimpleListFilter):
    title = _("open")
    parameter_name = "open"

    def lookups(self, request, model_admin):
        return [("yes", _("Yes")), ("no", _("No"))]

    def queryset(self, request, queryset):
        if self.value() in ("yes", "no"):
            return queryset.filter(ended_at__isnull=self.value() == "yes")
        return queryset


@admin.register(Loan)
class LoanAdmin(ReadOnlyForStaff, admin.ModelAdmin):
    """GPUs lent within a cohort, as jobs.services.lending takes and ends them."""

    list_display = [
        "id",
        "cohort",
        "borrower",
        "lender",
        "gpus",
        "started_at",
        "ended_at",
        "reclaimed",
    ]
    list_filter = ["cohort", "reclaimed", OpenLoanFilter]
    search_fields = ["borrower__slug", "lender__slug", "cohort__slug"]
    list_select_related = ["cohort", "borrower", "lender"]
    readonly_fields = [f.name for f in Loan._meta.fields]
    actions = None
