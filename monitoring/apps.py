from django.apps import AppConfig


class MonitoringConfig(AppConfig):
    name = "monitoring"
    verbose_name = "Monitoring and alerts"

    def ready(self) -> None:
        from monitoring import celery_metrics  # noqa: F401  (connects the Celery signals)
