from django.contrib import admin

from tenants.models import Membership, Tenant


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ["user"]


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "tier", "state", "contact_email", "created"]
    list_filter = ["tier", "state"]
    search_fields = ["slug", "name"]
    inlines = [MembershipInline]
