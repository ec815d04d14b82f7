from django.contrib import admin

from portal.core.models import ApiToken, AuditEvent


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ["id", "user", "name", "created", "last_used"]
    search_fields = ["user__username", "name"]
    fields = ["user", "name", "created", "last_used"]
    readonly_fields = ["user", "name", "created", "last_used"]

    def has_add_permission(self, request):
        return False  # a key is shown once, to its owner, through the API


@admin.register(AuditEvent)
class AuditEventAdmin(admin.ModelAdmin):
    list_display = ["at", "actor_username", "tenant_slug", "action", "target_type", "target_id"]
    list_filter = ["action"]
    search_fields = ["actor_username", "tenant_slug", "target_id"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
