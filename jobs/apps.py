from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "jobs"
    verbose_name = "Jobs"

    def ready(self) -> None:
        from clusters.signals import cluster_recovered
        from jobs.services.stall import jobs_dispatch_resume

        def resume_dispatch(sender, cluster_id: int, **kwargs) -> None:
            jobs_dispatch_resume(cluster_id=cluster_id)

        cluster_recovered.connect(resume_dispatch, weak=False, dispatch_uid="jobs.resume_dispatch")
