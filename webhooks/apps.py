from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class WebhooksConfig(AppConfig):
    name = "webhooks"
    verbose_name = _("Webhooks and notifications")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from monitoring.services import alert_news
        from webhooks.services import alerts_announced

        alert_news.connect(alerts_announced, dispatch_uid="webhooks.alerts_announced")
