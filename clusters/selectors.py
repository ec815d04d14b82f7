"""Reads of the catalog. GPU models, scenarios and clusters are the same for every signed-in
user (quota, not visibility, decides who may use them), so nothing here filters by tenant."""

import time
from collections.abc import Iterable
from dataclasses import dataclass

from django.db import connection
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
        "share_kinds",
        "mig_profiles",
        "shards_per_gpu",
        "max_walltime_minutes",
        "gpu_model__slug",
    )
    return (
        Cluster.objects.filter(enabled=True)
        .only("id", "slug", "name", "kind", "healthy")
        .prefetch_related(Prefetch("partitions", queryset=partitions.order_by("name")))
    )


@dataclass(frozen=True)
class CatalogNames:
    """Slugs of scenarios, GPU models and clusters and names of partitions, by id."""

    scenario: dict[int, str]
    gpu_model: dict[int, str]
    cluster: dict[int, str]
    partition: dict[int, str]


# The catalog's names by id, kept in the process (docs/architecture/performance-layer.md): they
# change only when an admin edits the catalog. A save or delete here clears them (clusters.apps);
# another process reads them again within NAMES_TTL_S.
NAMES_TTL_S = 60.0
# Each kind of name: the model it is a column of, and the column.
_CATALOG = (
    ("scenario", Scenario, "slug"),
    ("gpu_model", GpuModel, "slug"),
    ("cluster", Cluster, "slug"),
    ("partition", Partition, "name"),
)
_names: dict[str, dict[int, str]] = {}
_names_read_at = float("-inf")


def catalog_names_forget() -> None:
    """Forget this process's names: the catalog was saved or deleted here (clusters.apps)."""
    global _names  # rebound, not cleared: a reader keeps the dicts it holds
    _names = {}


def catalog_names(rows: Iterable) -> CatalogNames:
    """The catalog's names that these rows (jobs, or dicts of a values() query) refer to by
    scenario_id, gpu_model_id, cluster_id and partition_id: from the process's copy, else in
    one query whatever the number of rows. Reading them apart from the rows keeps four joins out
    of every job query, which PostgreSQL took longer to plan than to run. Plain SQL: the ORM's
    union of four querysets cost more to build than the rest of a job's answer. Table and column
    names come from the models, the ids are parameters."""
    global _names, _names_read_at
    if time.monotonic() - _names_read_at > NAMES_TTL_S:
        _names, _names_read_at = {}, time.monotonic()
    names = {kind: _names.get(kind, {}) for kind, _model, _column in _CATALOG}
    rows = list(rows)
    selects, params = [], []
    for index, (kind, model, column) in enumerate(_CATALOG):
        key = f"{kind}_id"
        refs = (row[key] if isinstance(row, dict) else getattr(row, key) for row in rows)
        ids = sorted({pk for pk in refs if pk is not None} - names[kind].keys())
        if ids:
            table, column = connection.ops.quote_name(model._meta.db_table), connection.ops.quote_name(column)
            marks = ", ".join(["%s"] * len(ids))
            selects.append(f"SELECT {index}, id, {column} FROM {table} WHERE id IN ({marks})")  # noqa: S608
            params += ids
    if selects:
        names = {kind: dict(known) for kind, known in names.items()}
        with connection.cursor() as cursor:
            cursor.execute(" UNION ALL ".join(selects), params)
            for index, pk, name in cursor.fetchall():
                names[_CATALOG[index][0]][pk] = name
        _names = names
    return CatalogNames(**names)


def cluster_ids_enabled() -> list[int]:
    """The clusters that a fan-out over "every cluster" goes to (a health check, a tenant's limits)."""
    return list(Cluster.objects.filter(enabled=True).values_list("pk", flat=True))
