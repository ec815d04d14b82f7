"""The reports in the console: statements, read-only (they are kept as made)."""

from django.contrib import admin

from reports.models import Statement, StatementLine

# --- Statements


class StatementLineInline(admin.TabularInline):
    model = StatementLine
    fields = ["job_id", "job_name", "username", "gpu_model", "scenario", "start", "end", "gpu_hours",
              "unit_price", "multiplier", "cost"]  # fmt: skip
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = False

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(Statement)
class StatementAdmin(admin.ModelAdmin):
    """Read by whoever may view statements in the console; never added, changed or deleted there
    (platform admins make one through the API; beat makes the rest)."""

    list_display = ["tenant_slug", "month", "jobs", "gpu_hours", "cost", "budget", "made_at", "mailed_at"]
    list_filter = ["month"]
    search_fields = ["tenant_slug", "tenant_name"]
    inlines = [StatementLineInline]
    readonly_fields = [
        "tenant", "tenant_slug", "tenant_name", "month", "currency", "jobs", "gpu_hours", "cost", "budget",
        "grants", "made_at", "mailed_at",
    ]  # fmt: skip

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
