from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "jobs"
    verbose_name = "Jobs"

    def ready(self) -> None:
        from clusters.signals import cluster_recovered
        from jobs.services.common import send_after_commit
        from jobs.services.stall import jobs_dispatch_resume
        from tenants.signals import tenant_limits_changed

        def follow_limits(sender, tenant_id: int, **kwargs) -> None:
            # After commit, and a broker that is down costs only the message: apply-tenants
            # applies every tenant's limits again within the hour.
            send_after_commit("jobs.tasks.apply_tenant", tenant_id=tenant_id)

        tenant_limits_changed.connect(follow_limits, weak=False, dispatch_uid="jobs.follow_limits")

        def resume_dispatch(sender, cluster_id: int, **kwargs) -> None:
            jobs_dispatch_resume(cluster_id=cluster_id)

        cluster_recovered.connect(resume_dispatch, weak=False, dispatch_uid="jobs.resume_dispatch")
