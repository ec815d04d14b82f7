"""Jobs that waited for dispatch when jobs began to run as cluster identities get theirs now, as
job_submit fixes it (tenants.selectors.job_identity_of): the tenant's own cluster account, else
the cluster's template; on per-user clusters the submitter's cluster username. Jobs already in
a scheduler keep "": they ran as the service user, which reconciliation and cancel know."""

from django.db import migrations

WAITING = ["QUEUED", "SUBMITTING", "CANCELLING"]


def fill(apps, schema_editor):
    Job = apps.get_model("jobs", "Job")
    ClusterAccount = apps.get_model("tenants", "ClusterAccount")
    Profile = apps.get_model("tenants", "Profile")
    waiting = Job.objects.filter(cluster__kind="slurm", backend_id="", cluster_user="", state__in=WAITING)
    for job in waiting.select_related("cluster", "tenant").iterator():
        cluster = job.cluster
        if cluster.job_identity == "user":
            name = Profile.objects.filter(user_id=job.submitted_by_id).values_list("cluster_username", flat=True)
            name = name.first() or ""
        else:
            own = ClusterAccount.objects.filter(tenant_id=job.tenant_id, cluster_id=cluster.pk)
            name = own.values_list("username", flat=True).first() or ""
            if not name and "{tenant}" in cluster.tenant_identity_template:
                name = cluster.tenant_identity_template.replace("{tenant}", job.tenant.slug)
        if name and name not in {"root", cluster.ssh_user} and len(name) <= 32:
            Job.objects.filter(pk=job.pk).update(cluster_user=name)


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0005_cluster_user"),
        ("tenants", "0006_profile_cluster_username_once"),
    ]

    operations = [migrations.RunPython(fill, migrations.RunPython.noop)]
