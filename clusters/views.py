"""The cluster catalog as the pages show it (templates/clusters/list.html): the clusters with
their partitions, then the GPU models' figures. The page is a tenant's (tenants.views.clusters),
which adds its header and which GPU models the tenant's grants cover: clusters imports no app
above it."""

from django.contrib.auth.models import AbstractBaseUser
from django.utils.translation import gettext as _

from clusters import shares
from clusters.selectors import cluster_list, gpu_model_list
from clusters.shares import ShareKind
from portal.core.staff import is_platform_admin

# The health columns on top of what cluster_list loads; never a connection or secret column.
# health_detail is the backend's own words (hosts, users, paths): platform admins' only.
CLUSTER_COLUMNS = ("id", "slug", "name", "kind", "healthy", "health_checked_at")
CLUSTER_ADMIN_COLUMNS = (*CLUSTER_COLUMNS, "health_detail")
GPU_MODEL_COLUMNS = (
    "id", "slug", "vendor", "name", "memory_gb", "fp64_tflops", "fp16_tflops", "memory_bandwidth_gbs",
    "share_kinds", "mig_profiles", "sources",
)  # fmt: skip


def walltime_text(minutes: int) -> str:
    """60 → "1 h", 2160 → "1 d 12 h", 90 → "1 h 30 min": what a researcher plans a job by."""
    days, rest = divmod(minutes, 24 * 60)
    hours, mins = divmod(rest, 60)
    parts = []
    if days:
        parts.append(_("%(days)s d") % {"days": days})
    if hours:
        parts.append(_("%(hours)s h") % {"hours": hours})
    if mins:
        parts.append(_("%(minutes)s min") % {"minutes": mins})
    return " ".join(parts)


def partition_shares(partition) -> list[str]:
    """What a partition offers of its devices, in words: whole GPUs, its MIG profiles, slices,
    shards (with how many per GPU, and that they isolate nothing)."""
    words = []
    for kind in partition.share_kinds:
        if kind == ShareKind.MIG:
            words.append(_("MIG %(profiles)s") % {"profiles": ", ".join(partition.mig_profiles)})
        elif kind == ShareKind.SHARD:
            words.append(_("%(n)s shards per GPU (no isolation)") % {"n": partition.shards_per_gpu})
        else:
            words.append(str(ShareKind(kind).label))
    return words


def model_shares(gpu_model) -> dict:
    """A model's share kinds in words, its MIG profiles with the fraction of a device each counts,
    and the sources of its figures."""
    return {
        "kinds": [str(ShareKind(kind).label) for kind in gpu_model.share_kinds if kind in ShareKind.values],
        "profiles": [(p.name, p.fraction.normalize()) for p in shares.mig_profiles(gpu_model.mig_profiles)],
        "sources": [line for line in gpu_model.sources.splitlines() if line.strip()],
    }


def catalog_context(*, user: AbstractBaseUser, covered: set[int]) -> dict:
    """Clusters with partitions, each partition marked when its GPU model is in `covered`; then
    the GPU models' figures, in as many queries whatever the number of clusters. Why a cluster is
    unhealthy is for platform admins: the backend's words name hosts, users and paths."""
    health_detail = is_platform_admin(user)
    columns = CLUSTER_ADMIN_COLUMNS if health_detail else CLUSTER_COLUMNS
    gpu_models = list(gpu_model_list().only(*GPU_MODEL_COLUMNS).order_by("vendor", "name", "slug"))
    # cluster_list loads only the GPU model's slug with a partition: the names come from the
    # models above, so that no partition row fetches its model on its own.
    model_names = {m.pk: m.name for m in gpu_models}
    rows = [
        {
            "cluster": cluster,
            "partitions": [
                {
                    "partition": p,
                    "gpu_model": model_names.get(p.gpu_model_id, p.gpu_model.slug),
                    "walltime": walltime_text(p.max_walltime_minutes),
                    "shares": partition_shares(p),
                    "covered": p.gpu_model_id in covered,
                }
                for p in cluster.partitions.all()
            ],
        }
        for cluster in cluster_list().only(*columns).order_by("slug")
    ]
    models = [{"model": m, **model_shares(m)} for m in gpu_models]
    return {"clusters": rows, "gpu_models": models, "show_health_detail": health_detail}
