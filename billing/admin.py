"""The price list, tier multipliers and budgets in the console."""

from django.contrib import admin, messages
from django.core.exceptions import ValidationError

from billing import services
from billing.budgets import budget_change, budget_create, budget_delete
from billing.models import Budget, Price, TierMultiplier

# --- Prices


class ForwardOnly(admin.ModelAdmin):
    """A row in force or past is read-only and kept: the console adds a new one, for now or
    later (billing/services.py), and withdraws only one not yet in force."""

    def has_change_permission(self, request, obj=None):
        return obj is None and super().has_change_permission(request, obj)

    def has_delete_permission(self, request, obj=None):
        if obj is not None and services.in_force_or_past(obj):
            return False
        return super().has_delete_permission(request, obj)

    def delete_model(self, request, obj):
        services.row_withdraw(actor=request.user, row=obj)

    def delete_queryset(self, request, queryset):
        for row in queryset:
            if services.in_force_or_past(row):
                self.message_user(request, f"{row} is in force or past: kept.", messages.WARNING)
            else:
                services.row_withdraw(actor=request.user, row=row)


@admin.register(Price)
class PriceAdmin(ForwardOnly):
    list_display = ["gpu_model", "share", "per_gpu_hour", "effective_from", "note", "created_by"]
    list_filter = ["gpu_model", "share"]
    fields = ["gpu_model", "share", "per_gpu_hour", "effective_from", "note"]
    date_hierarchy = "effective_from"

    def save_model(self, request, obj, form, change):
        services.price_add(actor=request.user, price=obj)

    def get_form(self, request, obj=None, change=False, **kwargs):
        form = super().get_form(request, obj, change, **kwargs)
        return _past_refused(form)


@admin.register(TierMultiplier)
class TierMultiplierAdmin(ForwardOnly):
    list_display = ["tier", "multiplier", "effective_from"]
    list_filter = ["tier"]
    fields = ["tier", "multiplier", "effective_from"]

    def save_model(self, request, obj, form, change):
        services.multiplier_add(actor=request.user, multiplier=obj)

    def get_form(self, request, obj=None, change=False, **kwargs):
        form = super().get_form(request, obj, change, **kwargs)
        return _past_refused(form)


def _past_refused(form_class):
    """The form says what the service would refuse, on the field, before saving."""

    class Form(form_class):
        def clean_effective_from(self):
            moment = self.cleaned_data["effective_from"]
            try:
                services.not_in_the_past(moment)
            except ValidationError as error:
                raise ValidationError(error.message_dict["effective_from"]) from error
            return moment

    return Form


# --- Budgets


@admin.register(Budget)
class BudgetAdmin(admin.ModelAdmin):
    """A tenant's budgets; each write through billing/budgets.py, audited. A budget's period and
    grant stay once made."""

    list_display = ["tenant", "period", "grant", "amount", "hard", "updated"]
    list_filter = ["period", "hard"]
    search_fields = ["tenant__slug", "tenant__name"]
    autocomplete_fields = ["tenant"]
    raw_id_fields = ["grant"]
    fields = ["tenant", "period", "grant", "amount", "hard"]

    def get_readonly_fields(self, request, obj=None):
        return ["tenant", "period", "grant"] if obj is not None else []

    def save_model(self, request, obj, form, change):
        if change:
            budget_change(actor=request.user, budget=obj, amount=obj.amount, hard=obj.hard)
        else:
            made = budget_create(actor=request.user, tenant=obj.tenant, period=obj.period, amount=obj.amount,
                                 hard=obj.hard, grant_id=obj.grant_id)  # fmt: skip
            obj.pk = made.pk  # the console's log and redirect name the row made

    def delete_model(self, request, obj):
        budget_delete(actor=request.user, budget=obj)

    def delete_queryset(self, request, queryset):
        for budget in queryset.select_related("tenant"):
            budget_delete(actor=request.user, budget=budget)
