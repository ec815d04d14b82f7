"""Alerts, their deliveries and the tenants' alert channels in the console. Alerts and
deliveries are read-only (Alertmanager and the workers write them); a channel's URL and secret
can be set, never read back."""

from django import forms
from django.contrib import admin
from django.utils.translation import gettext_lazy as _

from monitoring.models import Alert, AlertChannel, Delivery
from monitoring.notify import channel_url_problem


class ReadOnly:
    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


class DeliveryInline(ReadOnly, admin.TabularInline):
    model = Delivery.alerts.through
    extra = 0
    can_delete = False
    verbose_name = _("delivery")
    verbose_name_plural = _("deliveries")
    fields = readonly_fields = ["delivery"]


@admin.register(Alert)
class AlertAdmin(ReadOnly, admin.ModelAdmin):
    list_display = ["name", "status", "severity", "scope", "tenant", "job", "cluster", "starts_at", "ends_at",
                    "times_received"]  # fmt: skip
    list_filter = ["status", "severity", "scope", "name", "cluster"]
    search_fields = ["name", "summary", "tenant__slug"]
    date_hierarchy = "starts_at"
    list_select_related = ["tenant", "cluster"]
    readonly_fields = [field.name for field in Alert._meta.fields]
    inlines = [DeliveryInline]


@admin.register(Delivery)
class DeliveryAdmin(ReadOnly, admin.ModelAdmin):
    list_display = [
        "title",
        "kind",
        "channel",
        "event",
        "status",
        "attempts",
        "last_error",
        "created",
        "sent_at",
    ]
    list_filter = ["status", "kind", "event"]
    search_fields = ["title"]
    list_select_related = ["channel"]
    readonly_fields = ["title", "kind", "channel", "tenant", "event", "status", "attempts", "last_error",
                       "created", "sent_at", "recipients"]  # fmt: skip
    exclude = ["alerts"]


class AlertChannelForm(forms.ModelForm):
    """The URL and secret as write-only inputs: empty on a change keeps what is stored."""

    url = forms.CharField(widget=forms.PasswordInput(render_value=False), required=False, max_length=2000)
    secret = forms.CharField(widget=forms.PasswordInput(render_value=False), required=False, max_length=500)

    class Meta:
        model = AlertChannel
        fields = ["tenant", "name", "kind", "url", "secret", "min_severity", "enabled"]

    def clean(self):
        data = super().clean()
        for name in ("url", "secret"):
            if not data.get(name) and self.instance.pk:
                data[name] = getattr(self.instance, name)
        if not data.get("url"):
            self.add_error("url", _("A channel needs a URL."))
        elif problem := channel_url_problem(data.get("kind"), data["url"]):
            self.add_error("url", _("The URL %(problem)s.") % {"problem": problem})
        if data.get("kind") == "webhook" and not data.get("secret"):
            self.add_error("secret", _("A webhook needs a secret to sign its posts with."))
        return data


@admin.register(AlertChannel)
class AlertChannelAdmin(admin.ModelAdmin):
    form = AlertChannelForm
    list_display = ["name", "tenant", "kind", "min_severity", "enabled", "created"]
    list_filter = ["kind", "enabled"]
    search_fields = ["name", "tenant__slug"]
    autocomplete_fields = ["tenant"]
