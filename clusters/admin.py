from django import forms
from django.contrib import admin, messages
from django.template.loader import render_to_string
from django.utils.translation import gettext_lazy as _

from clusters.backends.base import BackendError
from clusters.models import Cluster, ClusterKind, GpuModel, Partition, Scenario, ScenarioGpu
from clusters.services import backend_of, cluster_mark_health, cluster_sync


def health_badge(cluster: Cluster) -> str:
    """The cluster's health as the admin's own icon and a word, so that it reads without colour."""
    return render_to_string("admin/clusters/health_badge.html", {"cluster": cluster}).strip()


class WriteOnlyTextarea(forms.Textarea):
    """A textarea that never renders a value: not the stored one, nor one posted back with a
    form that failed validation (Textarea, unlike PasswordInput, has no render_value switch)."""

    def format_value(self, value):
        return None


class ClusterForm(forms.ModelForm):
    """Secrets are write-only: the page says only whether one is set. A blank field keeps the
    stored value, a typed one replaces it, and the "clear" box removes it."""

    ssh_private_key = forms.CharField(
        required=False, strip=False, widget=WriteOnlyTextarea(attrs={"rows": 4})
    )
    ssh_private_key_clear = forms.BooleanField(required=False, label="Clear the SSH private key")
    ssh_key_passphrase = forms.CharField(
        label="SSH key passphrase",
        required=False,
        strip=False,
        widget=forms.PasswordInput(render_value=False),
        help_text="Only for a passphrase-protected key.",
    )
    ssh_key_passphrase_clear = forms.BooleanField(required=False, label="Clear the SSH key passphrase")
    k8s_token = forms.CharField(required=False, widget=forms.PasswordInput(render_value=False))
    k8s_token_clear = forms.BooleanField(required=False, label="Clear the Kubernetes token")
    kubeconfig = forms.CharField(required=False, strip=False, widget=WriteOnlyTextarea(attrs={"rows": 4}))
    kubeconfig_clear = forms.BooleanField(required=False, label="Clear the kubeconfig")
    k8s_api_url = forms.URLField(required=False, assume_scheme="https")  # Django 6's default, now
    prometheus_url = forms.URLField(required=False, max_length=500, assume_scheme="https")
    metrics_url = forms.URLField(required=False, max_length=500, assume_scheme="https")

    class Meta:
        model = Cluster
        fields = [
            "slug",
            "name",
            "kind",
            "enabled",
            "ssh_host",
            "ssh_port",
            "ssh_user",
            "ssh_known_hosts",
            "ssh_private_key",
            "ssh_key_passphrase",
            "slurm_cluster_name",
            "scratch_root",
            "job_identity",
            "tenant_identity_template",
            "k8s_api_url",
            "k8s_ca_cert",
            "k8s_token",
            "kubeconfig",
            "uses_kueue",
            "k8s_scratch_gib",
            "k8s_scratch_storage_class",
            "local_gpus",
        ]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for name in Cluster.SECRET_FIELDS:
            if name not in self.fields:
                continue
            # The stored value must not reach the page by any path: initial feeds the widget and
            # the hidden "initial" inputs that has_changed() may render.
            self.initial[name] = ""
            state = "set" if getattr(self.instance, name) else "not set"
            self.fields[name].help_text = f"Currently {state}. Write-only: leave blank to keep it."

    def clean(self):
        cleaned = super().clean()
        for name in Cluster.SECRET_FIELDS:
            if name not in self.fields:
                continue
            new, clear = cleaned.get(name), cleaned.get(f"{name}_clear")
            if new and clear:
                self.add_error(f"{name}_clear", "Enter a new value or clear the stored one, not both.")
            elif clear:
                cleaned[name] = ""
            elif not new:
                cleaned[name] = getattr(self.instance, name)
        return cleaned


class PartitionInline(admin.TabularInline):
    model = Partition
    extra = 0
    fields = [
        *("name", "gpu_model", "gpus_per_node", "nodes", "max_walltime_minutes", "gpus_free"),
        *("share_kinds", "mig_profiles", "shards_per_gpu"),
    ]
    readonly_fields = ["gpus_free"]


@admin.register(Cluster)
class ClusterAdmin(admin.ModelAdmin):
    form = ClusterForm
    inlines = [PartitionInline]
    list_display = ["slug", "name", "kind", "enabled", "health", "health_detail", "health_checked_at"]
    list_filter = ["kind", "enabled", "healthy"]
    search_fields = ["slug", "name"]
    readonly_fields = ["health", "health_detail", "health_checked_at", "job_sandbox"]
    actions = ["check_health"]
    fieldsets = [
        (None, {"fields": ["slug", "name", "kind", "enabled"]}),
        (
            "Slurm over SSH",
            {
                "fields": [
                    "ssh_host",
                    "ssh_port",
                    "ssh_user",
                    "ssh_known_hosts",
                    "ssh_private_key",
                    "ssh_private_key_clear",
                    "ssh_key_passphrase",
                    "ssh_key_passphrase_clear",
                    "slurm_cluster_name",
                    "scratch_root",
                    "job_identity",
                    "tenant_identity_template",
                ]
            },
        ),
        (
            "Kubernetes",
            {
                "fields": [
                    "k8s_api_url",
                    "k8s_ca_cert",
                    "k8s_token",
                    "k8s_token_clear",
                    "kubeconfig",
                    "kubeconfig_clear",
                    "uses_kueue",
                    "k8s_scratch_gib",
                    "k8s_scratch_storage_class",
                ]
            },
        ),
        ("Local", {"fields": ["local_gpus", "job_sandbox"]}),
        ("GPU telemetry", {"fields": ["prometheus_url", "metrics_url"]}),
        ("Health", {"fields": ["health", "health_detail", "health_checked_at"]}),
    ]

    @admin.display(description=_("Health"), ordering="healthy")
    def health(self, obj: Cluster) -> str:
        return health_badge(obj)

    def get_fieldsets(self, request, obj=None):
        """Without the change permission the console shows every field as read-only text, which
        bypasses the form's write-only widgets: there, each secret becomes a line that says only
        whether it is set, and its "clear" box goes."""
        fieldsets = super().get_fieldsets(request, obj)
        if self.has_change_permission(request, obj):
            return fieldsets
        clear_boxes = {f"{name}_clear" for name in Cluster.SECRET_FIELDS}
        shown = []
        for title, options in fieldsets:
            fields = [
                f"{name}_state" if name in Cluster.SECRET_FIELDS else name
                for name in options["fields"]
                if name not in clear_boxes
            ]
            shown.append((title, {**options, "fields": fields}))
        return shown

    def get_readonly_fields(self, request, obj=None):
        states = [f"{name}_state" for name in Cluster.SECRET_FIELDS]
        return [*super().get_readonly_fields(request, obj), *states]

    @staticmethod
    def _secret_state(obj: Cluster | None, name: str) -> str:
        return _("Set (write-only)") if obj is not None and getattr(obj, name) else _("Not set")

    @admin.display(description=_("SSH private key"))
    def ssh_private_key_state(self, obj: Cluster | None) -> str:
        return self._secret_state(obj, "ssh_private_key")

    @admin.display(description=_("SSH key passphrase"))
    def ssh_key_passphrase_state(self, obj: Cluster | None) -> str:
        return self._secret_state(obj, "ssh_key_passphrase")

    @admin.display(description=_("Kubernetes token"))
    def k8s_token_state(self, obj: Cluster | None) -> str:
        return self._secret_state(obj, "k8s_token")

    @admin.display(description=_("Kubeconfig"))
    def kubeconfig_state(self, obj: Cluster | None) -> str:
        return self._secret_state(obj, "kubeconfig")

    @admin.display(description=_("Job sandbox"))
    def job_sandbox(self, obj: Cluster) -> str:
        """How this machine isolates local jobs, asked now (once per process): the sandbox, or
        why there is none and that the cluster therefore serves one tenant only."""
        if obj.pk is None or obj.kind != ClusterKind.LOCAL:
            return "—"
        return backend_of(obj).sandbox_summary()

    @admin.action(description=_("Check health now"), permissions=["change"])
    def check_health(self, request, queryset) -> None:
        """Asks each selected cluster now, within this request (an SSH check gives up after its
        connect timeout), and says what each answered."""
        for cluster in queryset:
            try:
                healthy = cluster_sync(cluster=cluster)
            except BackendError as exc:  # health() never raises, but the inventory after it may
                cluster_mark_health(cluster=cluster, healthy=False, detail=str(exc))
                healthy = False
            args = {"cluster": cluster.slug, "detail": cluster.health_detail or "—"}
            if healthy:
                self.message_user(request, _("%(cluster)s is healthy: %(detail)s") % args, messages.SUCCESS)
            else:
                self.message_user(request, _("%(cluster)s is unhealthy: %(detail)s") % args, messages.ERROR)


@admin.register(GpuModel)
class GpuModelAdmin(admin.ModelAdmin):
    list_display = [
        "slug",
        "vendor",
        "memory_gb",
        "fp64_tflops",
        "fp16_tflops",
        "memory_bandwidth_gbs",
        "ecc",
        "cost_index",
        "slurm_gres",
    ]
    list_filter = ["vendor", "ecc"]
    search_fields = ["slug", "name"]


class ScenarioGpuInline(admin.TabularInline):
    model = ScenarioGpu
    extra = 0
    fields = ["rank", "gpu_model", "reason"]
    ordering = ["rank"]


@admin.register(Scenario)
class ScenarioAdmin(admin.ModelAdmin):
    inlines = [ScenarioGpuInline]
    list_display = ["slug", "name", "advisor", "default_walltime_minutes"]
    search_fields = ["slug", "name"]


@admin.register(Partition)
class PartitionAdmin(admin.ModelAdmin):
    list_display = [
        *("__str__", "gpu_model", "gpus_per_node", "nodes", "gpus_free", "max_walltime_minutes"),
        *("share_kinds", "shards_per_gpu"),
    ]
    list_filter = ["cluster", "gpu_model"]
    list_select_related = ["cluster", "gpu_model"]
    search_fields = ["name", "cluster__slug"]
