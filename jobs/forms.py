"""The submit form of the job pages: it parses what a person types (env lines, a template's
parameters as typed fields) into the JobRequest's shape, and offers only the shares of a GPU
that the tenant's grants and the partitions allow; the domain rules stay in
jobs.services.job_submit, which says what a partition cannot give (share_check)."""

import json
from dataclasses import dataclass, field
from decimal import Decimal

from django import forms
from django.conf import settings
from django.http import QueryDict
from django.utils.translation import gettext_lazy as _

from billing.models import AMOUNT_PLACES
from clusters.models import GpuModel, Partition
from clusters.shares import ShareKind
from jobs.job_templates import JobTemplate
from jobs.models import Priority, job_name_validator
from jobs.serializers import MAX_GPUS, MAX_NODES

PARAM_PREFIX = "param_"


# --- Shares: what the tenant's grants and the partitions allow


@dataclass(frozen=True)
class ShareMenu:
    """The shares of one GPU model the form offers: the units the tenant holds active grants in
    (kind, MIG profile), and the enabled partitions with the model. A partition is offered when it
    can give one of those units; a unit when the chosen partition, or any offered one, gives it."""

    gpu_model: GpuModel
    granted: frozenset[tuple[str, str]]
    partitions: list[Partition] = field(default_factory=list)

    @staticmethod
    def key(partition: Partition) -> str:
        return f"{partition.cluster.slug}/{partition.name}"

    def gives(self, partition: Partition, unit: tuple[str, str]) -> bool:
        kind, profile = unit
        if kind not in self.gpu_model.share_kinds or not partition.offers(kind):
            return False
        if kind == ShareKind.MIG:
            return profile in partition.mig_profiles
        return kind != ShareKind.SHARD or partition.shards_per_gpu > 0

    def offering(self) -> list[Partition]:
        return [p for p in self.partitions if any(self.gives(p, unit) for unit in self.granted)]

    def partition(self, key: str | None) -> Partition | None:
        return next((p for p in self.offering() if self.key(p) == key), None)

    def units(self, partition: Partition | None) -> list[tuple[str, str]]:
        where = [partition] if partition is not None else self.offering()
        return [unit for unit in self._ordered(self.granted) if any(self.gives(p, unit) for p in where)]

    def kinds(self, partition: Partition | None = None, *, offered: bool = True) -> list[str]:
        units = self.units(partition) if offered else self._ordered(self.granted)
        return list(dict.fromkeys(kind for kind, _profile in units if kind in self.gpu_model.share_kinds))

    def profiles(self, partition: Partition | None = None, *, offered: bool = True) -> list[str]:
        units = self.units(partition) if offered else self._ordered(self.granted)
        return [profile for kind, profile in units if kind == ShareKind.MIG]

    def _ordered(self, units) -> list[tuple[str, str]]:
        order = {kind: index for index, kind in enumerate(ShareKind.values)}
        return sorted(units, key=lambda unit: (order.get(unit[0], len(order)), unit[1]))


# --- A template's parameters, as fields from its JSON Schema


class ParameterField:
    """How one parameter is asked for and read back: `kind` is the schema's type as the form
    renders it (text, number, checkbox, select, one item per line, NAME=value lines, or JSON)."""

    def __init__(self, name: str, spec: dict, *, required: bool):
        self.name, self.spec, self.required = name, spec, required
        self.kind = self._kind(spec)

    @staticmethod
    def _kind(spec: dict) -> str:
        scalar = ("string", "integer", "number")
        kind = spec.get("type")
        if "enum" in spec and all(isinstance(v, str | int | float) for v in spec["enum"]):
            return "enum"
        if kind in (*scalar, "boolean"):
            return kind
        if kind == "array" and spec.get("items", {}).get("type") in scalar:
            return "list"
        values = spec.get("additionalProperties")
        if (
            kind == "object"
            and not spec.get("properties")
            and isinstance(values, dict)
            and values.get("type") == "string"
        ):
            return "mapping"
        return "json"

    @property
    def form_name(self) -> str:
        return PARAM_PREFIX + self.name

    def initial(self):
        """The schema's default as the field shows it."""
        if "default" not in self.spec:
            return None
        default = self.spec["default"]
        if self.kind == "list":
            return "\n".join(str(item) for item in default)
        if self.kind == "mapping":
            return "\n".join(f"{k}={v}" for k, v in default.items())
        if self.kind == "json":
            return json.dumps(default)
        if self.kind == "enum":
            return str(default)
        return default

    def data_value(self) -> str | None:
        """The default as a browser would post it (None: the field sends nothing)."""
        value = self.initial()
        if self.kind == "boolean":
            return "on" if value else None
        return None if value is None else str(value)

    def form_field(self) -> forms.Field:
        spec = self.spec
        common = {
            "label": spec.get("title") or self.name,
            "required": self.required and self.kind != "boolean",
            "help_text": spec.get("description", ""),
            "initial": self.initial(),
        }
        if self.kind == "enum":
            choices = [(str(v), str(v)) for v in spec["enum"]]
            if not self.required and "default" not in spec:
                choices.insert(0, ("", _("Not set")))
            return forms.ChoiceField(choices=choices, **common)
        if self.kind in ("integer", "number"):
            cls = forms.IntegerField if self.kind == "integer" else forms.FloatField
            return cls(min_value=spec.get("minimum"), max_value=spec.get("maximum"), **common)
        if self.kind == "boolean":
            return forms.BooleanField(**common)
        if self.kind == "string":
            attrs = {"spellcheck": "false"}
            if spec.get("examples"):
                attrs["placeholder"] = _("e.g. %(example)s") % {"example": spec["examples"][0]}
            return forms.CharField(
                max_length=spec.get("maxLength"), widget=forms.TextInput(attrs=attrs), **common
            )
        rows = {"list": 3, "mapping": 3, "json": 2}[self.kind]
        widget = forms.Textarea(attrs={"rows": rows, "spellcheck": "false"})
        return forms.CharField(strip=False, widget=widget, **common)

    def note(self) -> str:
        """What the form says beneath the schema's description about how to type it."""
        return {
            "list": _("One item per line."),
            "mapping": _("NAME=value, one per line."),
            "json": _("JSON, as the template's schema describes it."),
        }.get(self.kind, "")

    def parse(self, value):
        """The parameter's value from the field's cleaned value; `Omit` when left empty (the
        template's default then applies). Raises ValidationError for text it cannot read."""
        if self.kind == "boolean":
            return bool(value)
        if value is None or value == "" or (isinstance(value, str) and not value.strip()):
            return Omit
        if self.kind == "enum":
            return next((v for v in self.spec["enum"] if str(v) == value), value)
        if self.kind == "list":
            return [self._item(line, number) for number, line in _lines(value)]
        if self.kind == "mapping":
            pairs = {}
            for number, line in _lines(value):
                name, sep, item = line.partition("=")
                if not sep or not name.strip():
                    raise forms.ValidationError(
                        _("Line %(number)s is not NAME=value."), params={"number": number}
                    )
                pairs[name.strip()] = item
            return pairs
        if self.kind == "json":
            try:
                return json.loads(value)
            except ValueError as exc:
                raise forms.ValidationError(_("Not valid JSON: %(error)s"), params={"error": exc}) from None
        return value

    def _item(self, line: str, number: int):
        kind = self.spec["items"]["type"]
        if kind == "string":
            return line
        try:
            return int(line) if kind == "integer" else float(line)
        except ValueError:
            raise forms.ValidationError(
                _("Line %(number)s is not a number."), params={"number": number}
            ) from None


Omit = object()  # a parameter left empty: not sent, so that the template's default applies


def _lines(text: str):
    return [(number, line) for number, line in enumerate(text.splitlines(), start=1) if line.strip()]


def parameter_fields(template: JobTemplate | None) -> list[ParameterField]:
    if template is None:
        return []
    schema = template.parameters_schema
    required = set(schema.get("required", ()))
    return [
        ParameterField(name, spec, required=name in required) for name, spec in schema["properties"].items()
    ]


def _profile_labeller(gpu_model: GpuModel):
    """A MIG profile as the form names it: its memory and its part of the compute."""
    rows = {row["name"]: row for row in gpu_model.mig_profiles}

    def label(name: str) -> str:
        row = rows.get(name)
        if row is None:
            return name
        return _("%(name)s: %(memory)s GB, %(compute)s/7 of the compute") % {
            "name": name,
            "memory": row["memory_gb"],
            "compute": row["compute_slices"],
        }

    return label


# --- The form


class JobSubmitForm(forms.Form):
    gpu_model = forms.ChoiceField(label=_("GPU model"))
    gpus = forms.IntegerField(label=_("GPUs"), min_value=1, max_value=MAX_GPUS, initial=1)
    nodes = forms.IntegerField(label=_("Nodes"), min_value=1, max_value=MAX_NODES, initial=1)
    walltime_minutes = forms.IntegerField(label=_("Walltime (minutes)"), min_value=1, max_value=365 * 24 * 60)
    name = forms.CharField(label=_("Name"), max_length=64, validators=[job_name_validator])
    priority = forms.ChoiceField(label=_("Priority"), required=False)
    partition = forms.ChoiceField(label=_("Partition"), required=False)
    share = forms.ChoiceField(label=_("Share of a GPU"), required=False)  # none: a whole device
    mig_profile = forms.ChoiceField(label=_("MIG profile"), required=False)
    gpu_memory_mib = forms.IntegerField(label=_("Memory cap per slice (MiB)"), required=False, min_value=1)
    gpu_cores_pct = forms.IntegerField(
        label=_("Compute per slice (%)"), required=False, min_value=1, max_value=100
    )
    template = forms.ChoiceField(label=_("Template"), required=False)
    script = forms.CharField(
        label=_("Batch script"), required=False, strip=False, max_length=65536,
        widget=forms.Textarea(attrs={"rows": 8, "spellcheck": "false"}),
    )  # fmt: skip
    env = forms.CharField(
        label=_("Environment (NAME=value, one per line)"), required=False, strip=False,
        widget=forms.Textarea(attrs={"rows": 3, "spellcheck": "false"}),
    )  # fmt: skip
    # Preemption and restarts (docs/architecture/lending.md): the form reads the exit codes as
    # numbers; job_submit says which numbers, and how many, a job may name.
    preemptible = forms.BooleanField(label=_("Preemptible"), required=False)
    max_restarts = forms.IntegerField(label=_("Times to restart"), required=False, min_value=0)
    restart_exit_codes = forms.CharField(
        label=_("Restart on exit codes"), required=False, max_length=64,
        widget=forms.TextInput(attrs={"spellcheck": "false"}),
    )  # fmt: skip

    def __init__(self, *args, grants=(), partitions=(), templates=(), **kwargs):
        """`grants`: the tenant's active grants for the scenario (their GPU models loaded);
        `partitions`: the enabled partitions (their cluster and the model's slug loaded)."""
        super().__init__(*args, **kwargs)
        # The bound is the site's setting, read per form; blank: the service's default.
        self.fields["max_restarts"] = forms.IntegerField(
            label=self.fields["max_restarts"].label,
            required=False,
            min_value=0,
            max_value=settings.JOB_MAX_RESTARTS,
        )
        self.fields["restart_exit_codes"].widget.attrs["placeholder"] = _("e.g. %(example)s") % {
            "example": "1,42"
        }
        grants = list(grants)
        by_slug = {g.gpu_model.slug: g.gpu_model for g in sorted(grants, key=lambda g: g.gpu_model.slug)}
        self.gpu_models = list(by_slug.values())
        self.fields["gpu_model"].choices = [(m.slug, m.name) for m in self.gpu_models]
        self.fields["priority"].choices = [("", _("Default")), *list(Priority.choices)]
        self.templates = {t.slug: t for t in templates}
        self.fields["template"].choices = [("", _("None: my own script"))] + [
            (t.slug, t.name) for t in templates
        ]
        model = by_slug.get(self._value("gpu_model") or (self.gpu_models[0].slug if self.gpu_models else ""))
        self.menu = None
        if model is not None:
            granted = frozenset((g.share, g.mig_profile) for g in grants if g.gpu_model_id == model.pk)
            mine = [p for p in partitions if p.gpu_model.slug == model.slug]
            self.menu = ShareMenu(model, granted, mine)
        self._share_choices()
        self.template_picked = self.templates.get(self._value("template") or "")
        self.parameters = parameter_fields(self.template_picked)
        for parameter in self.parameters:
            self.fields[parameter.form_name] = parameter.form_field()

    def _value(self, name: str) -> str | None:
        if self.is_bound:
            return self.data.get(name)
        return self.initial.get(name)

    def _share_choices(self) -> None:
        """Valid: the kinds and MIG profiles granted (the service says what a partition cannot
        give). Shown: those the chosen partition, or any, offers, and the one posted."""
        menu, fields = self.menu, self.fields
        fields["partition"].choices = [("", _("Any partition"))]
        self.offered_kinds, self.shown_share = [], ""
        if menu is None:
            return
        fields["partition"].choices += [
            (menu.key(p), f"{p.cluster.name} / {p.name}") for p in menu.offering()
        ]
        partition = menu.partition(self._value("partition"))
        labels = dict(ShareKind.choices)
        granted, posted = menu.kinds(offered=False), self._value("share")
        self.offered_kinds = menu.kinds(partition)
        shown = [kind for kind in granted if kind in self.offered_kinds or kind == posted]
        fields["share"].choices = [(kind, labels[kind]) for kind in granted]
        fields["share"].widget.choices = [(kind, labels[kind]) for kind in shown]
        self.shown_share = posted if posted in shown else (shown[0] if shown else "")
        if not self.is_bound:
            self.initial.setdefault("share", self.shown_share)
        granted, posted = menu.profiles(offered=False), self._value("mig_profile")
        offered = menu.profiles(partition)
        label = _profile_labeller(menu.gpu_model)
        fields["mig_profile"].choices = [(name, label(name)) for name in granted]
        fields["mig_profile"].widget.choices = [
            (name, label(name)) for name in granted if name in offered or name == posted
        ]
        # A slice's cap is at most the device's memory, which depends on the model chosen.
        fields["gpu_memory_mib"] = forms.IntegerField(
            label=fields["gpu_memory_mib"].label,
            required=False,
            min_value=1,
            max_value=menu.gpu_model.memory_mib,
        )

    # --- What the page shows of the share fields

    @property
    def share_context(self) -> str:
        """The values the share fields were rendered for: the check renders them again when the
        model, the partition or the share changes (jobs.views.job_check)."""
        menu = self.menu
        if menu is None:
            return ""
        partition = menu.partition(self._value("partition"))
        return "|".join((menu.gpu_model.slug, menu.key(partition) if partition else "", self.shown_share))

    def normalized(self, data: QueryDict) -> QueryDict:
        """The data with a partition, share and MIG profile that the menu offers, for rendering
        the share fields again after the model or the partition changed."""
        data = data.copy()
        menu = self.menu
        if menu is None:
            return data
        partition = menu.partition(data.get("partition"))
        data["partition"] = menu.key(partition) if partition is not None else ""
        kinds = menu.kinds(partition)
        if data.get("share") not in kinds:
            data["share"] = kinds[0] if kinds else ""
        profiles = menu.profiles(partition)
        if data["share"] == ShareKind.MIG and data.get("mig_profile") not in profiles:
            data["mig_profile"] = profiles[0] if profiles else ""
        return data

    def with_template_defaults(self, data: QueryDict) -> QueryDict:
        """The data with the picked template's defaults in its parameters' fields, keeping what
        was typed into a parameter of the same name (a checkbox takes its default)."""
        data = data.copy()
        for parameter in self.parameters:
            kept = data.get(parameter.form_name, "").strip() and parameter.kind != "boolean"
            if not kept:
                value = parameter.data_value()
                if value is None:
                    data.pop(parameter.form_name, None)
                else:
                    data[parameter.form_name] = value
        return data

    def share_field_names(self) -> list[str]:
        """The share's own fields the page shows for the share chosen."""
        names = ["partition", "share"]
        if self.shown_share == ShareKind.MIG:
            names.append("mig_profile")
        elif self.shown_share == ShareKind.SLICE:
            names += ["gpu_memory_mib", "gpu_cores_pct"]
        return names

    def shown_field_names(self) -> list[str]:
        """Every field the page shows now (the live check names errors of these only)."""
        share = {"partition", "share", "mig_profile", "gpu_memory_mib", "gpu_cores_pct"}
        return [name for name in self.fields if name not in share or name in self.share_field_names()]

    @property
    def parameter_rows(self) -> list[tuple]:
        return [(self[p.form_name], p) for p in self.parameters]

    # --- Cleaning

    def clean_env(self) -> dict[str, str]:
        env = {}
        for number, line in enumerate(self.cleaned_data["env"].splitlines(), start=1):
            if not line.strip():
                continue
            name, sep, value = line.partition("=")
            if not sep or not name.strip():
                raise forms.ValidationError(
                    _("Line %(number)s is not NAME=value."), params={"number": number}
                )
            env[name.strip()] = value
        return env

    def clean_restart_exit_codes(self) -> tuple[int, ...]:
        text = self.cleaned_data["restart_exit_codes"]
        if not text.strip():
            return ()
        codes = [code.strip() for code in text.split(",")]
        if not all(code.isascii() and code.isdigit() for code in codes):
            raise forms.ValidationError(_("Whole numbers separated by commas, e.g. 1,42."))
        return tuple(int(code) for code in codes)

    def clean(self):
        data = super().clean()
        if data.get("template") and data.get("script", "").strip():
            self.add_error("script", _("Give either a script or a template, not both."))
        elif not data.get("template") and not data.get("script", "").strip() and "script" not in self.errors:
            self.add_error("script", _("Give a batch script or choose a template."))
        if data.get("template"):
            data["script"] = ""
        data["parameters"] = self._parameters(data)
        self._clean_share(data)
        return data

    def _parameters(self, data: dict) -> dict:
        values = {}
        for parameter in self.parameters:
            if parameter.form_name not in data:
                continue  # its field's own error is shown
            try:
                value = parameter.parse(data[parameter.form_name])
            except forms.ValidationError as exc:
                self.add_error(parameter.form_name, exc)
                continue
            if value is not Omit:
                values[parameter.name] = value
        return values

    def _clean_share(self, data: dict) -> None:
        """The share's fields as the JobRequest's Share takes them: a share not chosen is a whole
        device, and the fields of other kinds are dropped, whatever was posted. The partition
        becomes its cluster and its name."""
        kind = data["share"] = data.get("share") or ShareKind.WHOLE
        if kind != ShareKind.MIG:
            data["mig_profile"] = ""
        elif not data.get("mig_profile") and "mig_profile" not in self.errors:
            self.add_error("mig_profile", _("Choose a MIG profile."))
        for name, missing in (
            ("gpu_memory_mib", _("Give the memory cap of each slice.")),
            ("gpu_cores_pct", _("Give the compute percentage of each slice.")),
        ):
            if kind != ShareKind.SLICE:
                data[name] = 0
            elif data.get(name) is None and name not in self.errors:
                self.add_error(name, missing)
        partition = self.menu.partition(data.get("partition")) if self.menu else None
        data["cluster"] = partition.cluster if partition is not None else None
        data["partition"] = partition.name if partition is not None else ""


# --- Budgets


class BudgetForm(forms.Form):
    """A budget set or changed on the budget page: the month's, or one grant's (`target`)."""

    target = forms.ChoiceField(label=_("Budget for"))
    amount = forms.DecimalField(
        label=_("Amount"), max_digits=14, decimal_places=AMOUNT_PLACES, min_value=Decimal("0.01")
    )
    hard = forms.BooleanField(
        label=_("Hard: refuse new jobs once it is spent (running jobs go on)"), required=False
    )

    def __init__(self, *args, grants=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["target"].choices = [("month", _("Each calendar month"))] + [
            (f"grant-{g.pk}", _("Grant %(id)s: %(scenario)s on %(model)s, to %(end)s")
             % {"id": g.pk, "scenario": g.scenario.name, "model": g.gpu_model.name, "end": g.ends_on})
            for g in grants
        ]  # fmt: skip

    def grant_id(self) -> int | None:
        target = self.cleaned_data["target"]
        return None if target == "month" else int(target.removeprefix("grant-"))
