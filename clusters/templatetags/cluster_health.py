"""The cluster health panel of the admin console's index page, as a template tag, so that the
default admin site serves it without a site or context processor of its own."""

from django import template

from clusters.selectors import cluster_list

register = template.Library()


@register.inclusion_tag("admin/clusters/health_panel.html")
def cluster_health_panel() -> dict:
    """Each enabled cluster's health and its free and total GPUs over its partitions, in two
    queries. Free is unknown (None) until an inventory has counted every partition."""
    clusters = cluster_list().only(
        "id", "slug", "name", "kind", "healthy", "health_detail", "health_checked_at"
    )
    rows = []
    for cluster in clusters:
        partitions = list(cluster.partitions.all())
        free = [p.gpus_free for p in partitions]
        rows.append(
            {
                "cluster": cluster,
                "gpus_total": sum(p.gpus_total for p in partitions),
                "gpus_free": None if None in free else sum(free),
            }
        )
    return {"rows": rows}
