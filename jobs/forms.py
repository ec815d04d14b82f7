"""The submit form of the job pages: it parses what a person types (env lines, JSON parameters)
into the JobRequest's shape; the domain rules stay in jobs.services.job_submit."""

import json

from django import forms
from django.utils.translation import gettext_lazy as _

from jobs.models import Priority, job_name_validator
from jobs.serializers import MAX_GPUS, MAX_NODES


class JobSubmitForm(forms.Form):
    gpu_model = forms.ChoiceField(label=_("GPU model"))
    gpus = forms.IntegerField(label=_("GPUs"), min_value=1, max_value=MAX_GPUS, initial=1)
    nodes = forms.IntegerField(label=_("Nodes"), min_value=1, max_value=MAX_NODES, initial=1)
    walltime_minutes = forms.IntegerField(label=_("Walltime (minutes)"), min_value=1, max_value=365 * 24 * 60)
    name = forms.CharField(label=_("Name"), max_length=64, validators=[job_name_validator])
    priority = forms.ChoiceField(label=_("Priority"), required=False)
    template = forms.ChoiceField(label=_("Template"), required=False)
    parameters = forms.CharField(
        label=_("Template parameters (JSON)"), required=False, widget=forms.Textarea(attrs={"rows": 4})
    )
    script = forms.CharField(
        label=_("Batch script"), required=False, strip=False, max_length=65536,
        widget=forms.Textarea(attrs={"rows": 8, "spellcheck": "false"}),
    )  # fmt: skip
    env = forms.CharField(
        label=_("Environment (NAME=value, one per line)"), required=False, strip=False,
        widget=forms.Textarea(attrs={"rows": 3, "spellcheck": "false"}),
    )  # fmt: skip

    def __init__(self, *args, gpu_models=(), templates=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.gpu_models = list(gpu_models)
        self.fields["gpu_model"].choices = [(m.slug, m.name) for m in gpu_models]
        self.fields["priority"].choices = [("", _("Default")), *list(Priority.choices)]
        self.fields["template"].choices = [("", _("None: my own script"))] + [
            (t.slug, t.name) for t in templates
        ]

    def clean_parameters(self) -> dict:
        text = self.cleaned_data["parameters"].strip()
        if not text:
            return {}
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise forms.ValidationError(_("Not valid JSON: %(error)s"), params={"error": exc}) from None
        if not isinstance(value, dict):
            raise forms.ValidationError(_('Give a JSON object, e.g. {"script": "train.py"}.'))
        return value

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

    def clean(self):
        data = super().clean()
        if data.get("template") and data.get("script", "").strip():
            self.add_error("script", _("Give either a script or a template, not both."))
        elif not data.get("template") and not data.get("script", "").strip() and "script" not in self.errors:
            self.add_error("script", _("Give a batch script or choose a template."))
        if data.get("template"):
            data["script"] = ""
        return data
