from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "jobs"
    verbose_name = "Jobs"

    def ready(self) -> None:
        from celery import current_app

        from tenants.signals import tenant_limits_changed

        def follow_limits(sender, tenant_id: int, **kwargs) -> None:
            current_app.send_task("jobs.tasks.apply_tenant", kwargs={"tenant_id": tenant_id})

        tenant_limits_changed.connect(follow_limits, weak=False, dispatch_uid="jobs.follow_limits")
