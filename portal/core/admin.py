from django.contrib import admin

from portal.core.models import ApiToken, AuditEvent


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ["id", "user", "name", "scope", "created", "expires", "last_used"]
    list_filter = ["scope"]
    search_fields = ["user__username", "name"]
    fields = ["user", "name", "scope", "created", "expires", "last_used"]
    readonly_fields = fields

    def has_add_permission(self, request):
        return False  # a key is shown once, to its owner, through the API


@admin.register(AuditEvent)
class AuditEventAdmin(admin.ModelAdmin):
    """Append-only: the console reads the log and nothing else. Without change permission the
    admin shows every field read-only and no save button; without delete, no delete action."""

    list_display = ["at", "actor_username", "tenant_slug", "action", "target_type", "target_id"]
    list_filter = ["action", "tenant_slug"]
    search_fields = ["actor_username", "tenant_slug", "target_id"]
    date_hierarchy = "at"
    # The log only grows: skip the second COUNT(*) over the whole table on every page.
    show_full_result_count = False
    fields = ["at", "actor", "actor_username", "tenant_id", "tenant_slug", "action", "target_type",
              "target_id", "data"]  # fmt: skip
    readonly_fields = fields

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
