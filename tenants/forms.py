"""Forms of the tenant pages: quota requests and members. They parse; the services decide."""

from dataclasses import dataclass
from decimal import Decimal

from django import forms
from django.utils.translation import gettext_lazy as _

from clusters.shares import ShareKind, mig_profiles
from tenants.models import Role
from tenants.serializers import MAX_GPU_HOURS, MAX_GPUS

DATE = forms.DateInput(attrs={"type": "date"})


class QuotaRequestForm(forms.Form):
    gpu_model = forms.ChoiceField(label=_("GPU model"))
    share = forms.ChoiceField(
        label=_("Share of a GPU"),
        choices=ShareKind.choices,
        initial=ShareKind.WHOLE,
        required=False,
        help_text=_("What each GPU asked for is: a whole device, a MIG instance, a slice or a shard."),
    )
    mig_profile = forms.ChoiceField(label=_("MIG profile"), required=False)
    gpus = forms.IntegerField(
        label=_("GPUs"),
        min_value=1,
        max_value=MAX_GPUS,
        help_text=_("At once, in units of the share: devices, MIG instances, slices or shards."),
    )
    gpu_hours = forms.DecimalField(
        label=_("GPU-hours"),
        help_text=_("Device-equivalent: a MIG instance, slice or shard counts its part of a device."),
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
        # every MIG profile of the scenario's models, each with the models that have it and the
        # part of a device it counts: the service checks the pair
        profiles: dict[str, list[str]] = {}
        for r in ranking:
            for profile in mig_profiles(r.gpu_model.mig_profiles):
                counts = f"{r.gpu_model.name} {profile.fraction.normalize()}"
                profiles.setdefault(profile.name, []).append(counts)
        self.fields["mig_profile"].choices = [("", "—")] + [
            (name, f"{name} ({', '.join(models)})") for name, models in profiles.items()
        ]

    def clean_share(self) -> str:
        return self.cleaned_data["share"] or ShareKind.WHOLE


class MemberAddForm(forms.Form):
    username = forms.CharField(label=_("Username"), max_length=150)
    role = forms.ChoiceField(label=_("Role"), choices=Role.choices, initial=Role.MEMBER)

    def clean_username(self):
        # Its form only: whether it names a user is the view's question (member_candidate).
        return self.cleaned_data["username"].strip()


class MemberRoleForm(forms.Form):
    role = forms.ChoiceField(label=_("Role"), choices=Role.choices)


@dataclass(frozen=True)
class AdviceField:
    """One input of the sizing advisor on the quota page. The API's serializer (clusters.
    serializers.ADVICE_IN) validates; this says only how the page asks for it."""

    name: str
    label: str
    step: str = "any"
    choices: tuple[tuple[str, str], ...] = ()


AI_PRECISIONS = (("bf16", "BF16"), ("fp16", "FP16"), ("fp8", "FP8"), ("fp32", "FP32"))
LAYOUT = (
    AdviceField("gpus_per_node", _("GPUs per node"), step="1"),
    AdviceField("max_gpus", _("At most GPUs"), step="1"),
)
ADVICE_FIELDS = {
    "ai": (
        AdviceField("params_b", _("Model parameters (billions)")),
        AdviceField("tokens_b", _("Training tokens (billions, optional)")),
        AdviceField("precision", _("Precision"), choices=AI_PRECISIONS),
        AdviceField("method", _("Method"), choices=(("full", _("Full training")), ("lora", "LoRA"))),
        AdviceField("target_days", _("Target days")),
        *LAYOUT,
    ),
    "md": (
        AdviceField("atoms", _("Atoms"), step="1"),
        AdviceField("ns_per_day", _("Wanted ns/day")),
        AdviceField("simulated_ns", _("Simulated ns in all")),
        AdviceField("days", _("Or: days to run")),
        AdviceField("timestep_fs", _("Time step (fs)")),
        *LAYOUT,
    ),
    "cfd": (
        AdviceField("cells_m", _("Mesh cells (millions)")),
        AdviceField("iterations", _("Iterations or time steps"), step="1"),
        AdviceField("precision", _("Precision"), choices=(("fp64", "FP64"), ("mixed", _("Mixed")))),
        AdviceField("target_days", _("Target days")),
        *LAYOUT,
    ),
}  # fmt: skip
