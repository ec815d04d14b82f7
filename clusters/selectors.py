"""Reads of the catalog. GPU models, scenarios and clusters are the same for every signed-in
user (quota, not visibility, decides who may use them), so nothing here filters by tenant."""

from django.db.models import Prefetch, QuerySet

from clusters.models import Cluster, GpuModel, Partition, Scenario, ScenarioGpu


def gpu_model_list() -> QuerySet[GpuModel]:
    return GpuModel.objects.all()


def scenario_list() -> QuerySet[Scenario]:
    """Scenarios with their ranked GPU models, figures included (the advisor reads them): two
    queries for any number of rows."""
    ranking = ScenarioGpu.objects.select_related("gpu_model").order_by("rank")
    return Scenario.objects.prefetch_related(Prefetch("ranking", queryset=ranking))


def cluster_list() -> QuerySet[Cluster]:
    """Enabled clusters with their partitions. The secret and connection columns are not even
    loaded: what is never read cannot leak into a response or a log line."""
    partitions = Partition.objects.select_related("gpu_model").only(
        "cluster_id",
        "name",
        "gpus_per_node",
        "nodes",
        "gpus_free",
        "max_walltime_minutes",
        "gpu_model__slug",
    )
    return (
        Cluster.objects.filter(enabled=True)
        .only("id", "slug", "name", "kind", "healthy")
        .prefetch_related(Prefetch("partitions", queryset=partitions.order_by("name")))
    )
