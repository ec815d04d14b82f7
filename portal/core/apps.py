from django.apps import AppConfig


class CoreConfig(AppConfig):
    name = "portal.core"
    label = "core"
    verbose_name = "Portal core"

    def ready(self) -> None:
        from portal.core import schema  # noqa: F401  (registers the OpenAPI auth extension)
