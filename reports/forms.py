"""The reports' page forms."""

from decimal import Decimal

from django import forms
from django.utils.translation import gettext_lazy as _

from clusters.models import Cluster, GpuModel

# --- TCO


class TcoProfileForm(forms.Form):
    """A TCO profile's figures, in the site's currency."""

    name = forms.CharField(label=_("Name"), max_length=100)
    cluster = forms.ModelChoiceField(
        label=_("Cluster"), queryset=Cluster.objects.order_by("slug"), to_field_name="slug", required=False,
        empty_label=_("The whole site (every cluster)"),
    )  # fmt: skip
    gpu_model = forms.ModelChoiceField(
        label=_("GPU model"), queryset=GpuModel.objects.order_by("slug"), to_field_name="slug"
    )
    nodes = forms.IntegerField(label=_("Nodes"), min_value=1, max_value=100_000)
    gpus_per_node = forms.IntegerField(label=_("GPUs per node"), min_value=1, max_value=64)
    node_price = forms.DecimalField(
        label=_("Purchase price per node"), max_digits=14, decimal_places=2, min_value=Decimal(0)
    )
    depreciation_years = forms.IntegerField(label=_("Years of depreciation"), min_value=1, max_value=15)
    power_w_per_gpu = forms.IntegerField(
        label=_("Power per GPU (W)"), min_value=1, max_value=10_000,
        help_text=_("Average draw of a GPU and its share of the node."),
    )  # fmt: skip
    electricity_per_kwh = forms.DecimalField(
        label=_("Electricity per kWh"), max_digits=8, decimal_places=4, min_value=Decimal(0)
    )
    pue = forms.DecimalField(
        label=_("PUE"), max_digits=4, decimal_places=2, min_value=Decimal(1), max_value=Decimal(3),
        help_text=_("The site's power usage effectiveness: total power over the IT equipment's."),
    )  # fmt: skip
    staff_per_year = forms.DecimalField(
        label=_("Staff per year"), max_digits=14, decimal_places=2, min_value=Decimal(0)
    )
    space_per_year = forms.DecimalField(
        label=_("Space per year"), max_digits=14, decimal_places=2, min_value=Decimal(0)
    )


class CloudPriceForm(forms.Form):
    """One cloud's price; a row left empty is no price."""

    provider = forms.CharField(label=_("Provider"), max_length=64, required=False)
    per_gpu_hour = forms.DecimalField(
        label=_("Per GPU-hour"), max_digits=10, decimal_places=4, min_value=Decimal(0), required=False
    )

    def clean(self):
        data = super().clean()
        provider, price = data.get("provider"), data.get("per_gpu_hour")
        if provider and price is None and "per_gpu_hour" not in self.errors:
            self.add_error("per_gpu_hour", _("Give the price of this provider."))
        if price is not None and not provider:
            self.add_error("provider", _("Name the provider of this price."))
        return data


CloudPriceFormSet = forms.formset_factory(CloudPriceForm, extra=3, max_num=20, absolute_max=20)


def cloud_prices_of(formset) -> list[dict]:
    """The rows of a valid formset that name a price."""
    return [
        {"provider": row["provider"], "per_gpu_hour": row["per_gpu_hour"]}
        for row in formset.cleaned_data
        if row.get("provider")
    ]


class TcoExampleForm(forms.Form):
    rate = forms.DecimalField(
        label=_("Your currency per US dollar"), max_digits=12, decimal_places=6,
        min_value=Decimal("0.000001"), required=False,
        help_text=_("The example's figures are in US dollars; they are converted at this rate."),
    )  # fmt: skip
