"""Group mappings and directory links in the console. Mappings are written through the
services, so that the console's changes are audited like the API's."""

from django import forms
from django.contrib import admin

from identity import services
from identity.models import DirectoryAccount, GroupMapping, group_key


class GroupMappingForm(forms.ModelForm):
    class Meta:
        model = GroupMapping
        fields = ["source", "group", "tenant", "role"]

    def clean(self):
        """The group in the form it is compared in, before the form checks it is not mapped
        already: a DN in other case or spacing is the same group."""
        data = super().clean()
        if data.get("source") and data.get("group"):
            data["group"] = group_key(data["source"], data["group"])
        return data


@admin.register(GroupMapping)
class GroupMappingAdmin(admin.ModelAdmin):
    form = GroupMappingForm
    list_display = ["source", "group", "tenant", "role", "created"]
    list_filter = ["source", "role"]
    search_fields = ["group", "tenant__slug"]
    autocomplete_fields = ["tenant"]
    fields = ["source", "group", "tenant", "role"]

    def get_readonly_fields(self, request, obj=None):
        return ["source", "group", "tenant"] if obj is not None else []

    def save_model(self, request, obj, form, change):
        if change:
            services.group_mapping_change(actor=request.user, mapping=obj, role=obj.role)
        else:
            created = services.group_mapping_create(
                actor=request.user, source=obj.source, group=obj.group, tenant=obj.tenant, role=obj.role
            )
            obj.pk = created.pk

    def delete_model(self, request, obj):
        services.group_mapping_delete(actor=request.user, mapping=obj)

    def delete_queryset(self, request, queryset):
        for mapping in queryset:
            services.group_mapping_delete(actor=request.user, mapping=mapping)


@admin.register(DirectoryAccount)
class DirectoryAccountAdmin(admin.ModelAdmin):
    """Who signed in through which directory: read-only, the directory writes it."""

    list_display = ["user", "source", "subject", "synced", "gone"]
    list_filter = ["source"]
    search_fields = ["user__username", "subject"]
    readonly_fields = ["user", "source", "subject", "groups", "synced", "gone"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
