"""The console: the networks deliveries may reach beside public addresses (platform admins), and
the endpoints and deliveries to read (never a URL's query or a secret)."""

import ipaddress

from django import forms
from django.contrib import admin

from webhooks.models import AllowedRange, Delivery, Endpoint


class AllowedRangeForm(forms.ModelForm):
    class Meta:
        model = AllowedRange
        fields = ["cidr", "note"]

    def clean_cidr(self) -> str:
        try:
            return str(ipaddress.ip_network(self.cleaned_data["cidr"].strip(), strict=False))
        except ValueError:
            raise forms.ValidationError("A network such as 10.20.0.0/16 or fd00::/8.") from None


@admin.register(AllowedRange)
class AllowedRangeAdmin(admin.ModelAdmin):
    form = AllowedRangeForm
    list_display = ["cidr", "note", "created", "created_by"]

    def save_model(self, request, obj, form, change):
        obj.created_by = obj.created_by or request.user
        super().save_model(request, obj, form, change)


@admin.register(Endpoint)
class EndpointAdmin(admin.ModelAdmin):
    list_display = ["id", "tenant", "description", "enabled", "failing_since", "created"]
    list_filter = ["enabled"]
    fields = ["tenant", "description", "events", "enabled", "disabled_reason", "failing_since", "created"]
    readonly_fields = fields

    def has_add_permission(self, request):
        return False


@admin.register(Delivery)
class DeliveryAdmin(admin.ModelAdmin):
    list_display = ["id", "endpoint", "event_type", "status", "attempts", "response_status", "created"]
    list_filter = ["status", "event_type"]
    readonly_fields = [f.name for f in Delivery._meta.fields]

    def has_add_permission(self, request):
        return False
