from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from clusters import advisor, shares
from clusters.models import Cluster, GpuModel, Partition, Scenario, ScenarioGpu
from clusters.shares import ShareKind
from portal.core.serializers import StrictFloatField, StrictIntegerField


class MigProfileOut(serializers.Serializer):
    name = serializers.CharField()
    compute_slices = serializers.IntegerField(help_text="Of the device's 7")
    memory_slices = serializers.IntegerField(help_text="Of the device's 8")
    memory_gb = serializers.IntegerField()
    instances_max = serializers.IntegerField(help_text="The most instances of this profile on one device")
    fraction = serializers.DecimalField(
        max_digits=5,
        decimal_places=4,
        coerce_to_string=False,
        help_text="What one instance counts of a device in GPU-hours: max(compute/7, memory/8), rounded down",
    )


class GpuModelOut(serializers.ModelSerializer):
    """Beyond docs/api.md's fields: the share kinds the model supports, its MIG profiles with the
    fraction of a device each counts (clusters/shares.py), and the sources of its figures."""

    share_kinds = serializers.ListField(child=serializers.ChoiceField(choices=ShareKind.choices))
    mig_profiles = serializers.SerializerMethodField()
    sources = serializers.SerializerMethodField()

    @extend_schema_field(MigProfileOut(many=True))
    def get_mig_profiles(self, gpu: GpuModel) -> list[dict]:
        return MigProfileOut(shares.mig_profiles(gpu.mig_profiles), many=True).data

    def get_sources(self, gpu: GpuModel) -> list[str]:
        return [line for line in gpu.sources.splitlines() if line.strip()]

    class Meta:
        model = GpuModel
        fields = [
            "slug",
            "vendor",
            "name",
            "memory_gb",
            "fp64_tflops",
            "fp32_tflops",
            "fp16_tflops",
            "memory_bandwidth_gbs",
            "interconnect",
            "ecc",
            "slurm_gres",
            "k8s_resource",
            "k8s_product",
            "share_kinds",
            "mig_profiles",
            "sources",
        ]


class ScenarioGpuOut(serializers.ModelSerializer):
    gpu_model = serializers.SlugRelatedField(slug_field="slug", read_only=True)

    class Meta:
        model = ScenarioGpu
        fields = ["gpu_model", "rank", "reason"]


class ScenarioOut(serializers.ModelSerializer):
    """`advisor` (beyond docs/api.md) names the body that advise/ takes: ai, md, cfd, or "" for none."""

    gpu_models = ScenarioGpuOut(source="ranking", many=True, read_only=True)

    class Meta:
        model = Scenario
        fields = ["slug", "name", "description", "default_walltime_minutes", "env", "advisor", "gpu_models"]


class PartitionOut(serializers.ModelSerializer):
    """Beyond docs/api.md's fields: the shares of its devices it offers (clusters/shares.py)."""

    gpu_model = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    gpus_total = serializers.IntegerField(read_only=True)
    share_kinds = serializers.ListField(child=serializers.ChoiceField(choices=ShareKind.choices))
    mig_profiles = serializers.ListField(child=serializers.CharField())

    class Meta:
        model = Partition
        fields = [
            "name",
            "gpu_model",
            "gpus_per_node",
            "nodes",
            "gpus_total",
            "gpus_free",
            "max_walltime_minutes",
            "share_kinds",
            "mig_profiles",
            "shards_per_gpu",
        ]


class ClusterOut(serializers.ModelSerializer):
    """What researchers may know of a cluster. An explicit allow-list: connection settings and
    secrets (Cluster.SECRET_FIELDS) never appear, whatever fields the model gains."""

    partitions = PartitionOut(many=True, read_only=True)

    class Meta:
        model = Cluster
        fields = ["slug", "name", "kind", "healthy", "partitions"]


# --- Advisor inputs: one serializer per advisor, each building that advisor's job. -----------


# A number, and a count: JSON numbers only (not `true`, not "5").
Number = StrictFloatField
Count = StrictIntegerField


class _AdviceIn(serializers.Serializer):
    """Node layout, common to every advisor; a subclass names its advisor's job class."""

    job_class: type

    gpus_per_node = Count(
        min_value=1, max_value=16, default=advisor.GPUS_PER_NODE, help_text="GPUs per node."
    )
    max_gpus = Count(
        min_value=1,
        max_value=4096,
        default=advisor.MAX_GPUS,
        help_text="The most GPUs you would use; a model that needs more to hold the job is left out.",
    )

    def job(self):
        return self.job_class(**self.validated_data)


class AdviceInAi(_AdviceIn):
    """AI training (advisor `ai`)."""

    job_class = advisor.AiJob

    params_b = Number(min_value=0.001, max_value=10_000, help_text="Model parameters, in billions.")
    precision = serializers.ChoiceField(
        choices=["bf16", "fp16", "fp32", "fp8"],
        default=advisor.AiJob.precision,
        help_text="Training precision.",
    )
    method = serializers.ChoiceField(
        choices=["full", "lora"],
        default=advisor.AiJob.method,
        help_text="Full fine-tune / pre-training, or LoRA.",
    )
    tokens_b = Number(
        min_value=0.001,
        max_value=1_000_000,
        required=False,
        help_text=f"Training tokens, in billions; default {advisor.DEFAULT_TOKENS_B:g} (a fine-tuning run).",
    )
    target_days = Number(min_value=0.01, max_value=365, default=advisor.AiJob.target_days, help_text="Days.")


class AdviceInMd(_AdviceIn):
    """Molecular dynamics (advisor `md`): give `simulated_ns` or `days`, not both."""

    job_class = advisor.MdJob

    atoms = Count(min_value=100, max_value=10_000_000_000, help_text="Atoms in the system.")
    ns_per_day = Number(min_value=0.001, max_value=1_000_000, help_text="Wanted throughput, ns/day.")
    simulated_ns = Number(min_value=0.001, max_value=1e9, required=False, help_text="Total simulated ns.")
    days = Number(min_value=0.01, max_value=3650, required=False, help_text="Or: days to run at ns_per_day.")
    timestep_fs = Number(
        min_value=0.5, max_value=10, default=advisor.MdJob.timestep_fs, help_text="Integration time step, fs."
    )

    def validate(self, attrs):
        given = [name for name in ("simulated_ns", "days") if name in attrs]
        if not given:
            raise serializers.ValidationError({"simulated_ns": ["Give simulated_ns, or days."]})
        if len(given) == 2:
            raise serializers.ValidationError({"days": ["Give simulated_ns or days, not both."]})
        return attrs


class AdviceInCfd(_AdviceIn):
    """CFD and FEA (advisor `cfd`)."""

    job_class = advisor.CfdJob

    cells_m = Number(
        min_value=0.001, max_value=1_000_000, help_text="Mesh cells (or FEA elements), millions."
    )
    iterations = Count(
        min_value=1, max_value=1_000_000_000, help_text="Solver iterations or time steps, in total."
    )
    precision = serializers.ChoiceField(choices=["fp64", "mixed"], default=advisor.CfdJob.precision)
    target_days = Number(min_value=0.01, max_value=365, default=advisor.CfdJob.target_days, help_text="Days.")


ADVICE_IN = {"ai": AdviceInAi, "md": AdviceInMd, "cfd": AdviceInCfd}


class AdviceOptionOut(serializers.Serializer):
    """Beyond docs/api.md's fields: the share each of `gpus` is, named as a job asks for it
    (POST /jobs/: share, mig_profile, gpu_memory_mib, gpu_cores_pct), and what it counts of a
    device."""

    gpu_model = serializers.CharField(help_text="GPU model slug.")
    gpus = serializers.IntegerField(help_text="Units of `share`: devices, or one MIG instance or slice.")
    nodes = serializers.IntegerField()
    gpu_hours = serializers.FloatField(
        help_text="Device-equivalent GPU-hours: gpus × device_fraction × hours."
    )
    arithmetic = serializers.ListField(child=serializers.CharField(), help_text="The steps, readable.")
    # The job's choice set (one enum in the schema, as POST /jobs/ takes it); shards are never
    # advised, their size being a partition's.
    share = serializers.ChoiceField(
        choices=ShareKind.choices,
        help_text="whole, mig or slice: a fraction of one device where the job fits in one (the "
        "model's smallest MIG profile that holds it, else a slice); whole otherwise.",
    )
    mig_profile = serializers.CharField(help_text='share=mig: the profile, e.g. 3g.40gb; "" otherwise.')
    gpu_memory_mib = serializers.IntegerField(help_text="share=slice: the memory cap in MiB; 0 otherwise.")
    gpu_cores_pct = serializers.IntegerField(help_text="share=slice: the compute percentage; 0 otherwise.")
    device_fraction = serializers.DecimalField(
        max_digits=5,
        decimal_places=4,
        min_value=0,
        max_value=1,
        coerce_to_string=False,
        help_text="What each of `gpus` counts of a device (1 for a whole one), as the ledger charges it.",
    )


class AdviceOut(serializers.Serializer):
    assumptions = serializers.ListField(child=serializers.CharField())
    options = AdviceOptionOut(
        many=True,
        help_text="In the scenario's rank order; the `md` advisor's by cost (those that reach the asked "
        "ns/day first, then device-equivalent GPU-hours × cost index). Infeasible models left out.",
    )
