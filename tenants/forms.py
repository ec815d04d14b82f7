"""Forms of the tenant pages: quota requests and members. They parse; the services decide."""

from decimal import Decimal

from django import forms
from django.contrib.auth import get_user_model
from django.utils.translation import gettext_lazy as _

from tenants.models import Role
from tenants.serializers import MAX_GPU_HOURS, MAX_GPUS

DATE = forms.DateInput(attrs={"type": "date"})


class QuotaRequestForm(forms.Form):
    gpu_model = forms.ChoiceField(label=_("GPU model"))
    gpus = forms.IntegerField(label=_("GPUs"), min_value=1, max_value=MAX_GPUS)
    gpu_hours = forms.DecimalField(
        label=_("GPU-hours"),
        max_digits=12,
        decimal_places=2,
        min_value=Decimal("0.01"),
        max_value=MAX_GPU_HOURS,
    )
    starts_on = forms.DateField(label=_("Start"), widget=DATE)
    ends_on = forms.DateField(label=_("End"), widget=DATE)
    justification = forms.CharField(
        label=_("Justification"), max_length=5000, widget=forms.Textarea(attrs={"rows": 4})
    )

    def __init__(self, *args, ranking=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["gpu_model"].choices = [
            (r.gpu_model.slug, f"#{r.rank} {r.gpu_model.name}") for r in ranking
        ]


class MemberAddForm(forms.Form):
    username = forms.CharField(label=_("Username"), max_length=150)
    role = forms.ChoiceField(label=_("Role"), choices=Role.choices, initial=Role.MEMBER)

    def clean_username(self):
        username = self.cleaned_data["username"].strip()
        user = get_user_model().objects.filter(username=username, is_active=True).first()
        if user is None:
            raise forms.ValidationError(_("No user %(username)s."), params={"username": username})
        return user


class MemberRoleForm(forms.Form):
    role = forms.ChoiceField(label=_("Role"), choices=Role.choices)
