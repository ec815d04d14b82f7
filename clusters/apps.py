from django.apps import AppConfig
from django.db.models.signals import post_delete, post_save


class ClustersConfig(AppConfig):
    name = "clusters"
    verbose_name = "Clusters and GPU catalog"

    def ready(self) -> None:
        from clusters.models import Cluster, GpuModel, Partition, Scenario
        from clusters.selectors import catalog_names_forget
        from clusters.services import local_sandbox_warnings
        from portal.core.readiness import readiness_warning_register

        readiness_warning_register(local_sandbox_warnings)

        def forget_names(sender, **kwargs) -> None:
            catalog_names_forget()

        for model in (Cluster, GpuModel, Partition, Scenario):
            for signal in (post_save, post_delete):
                signal.connect(
                    forget_names, sender=model, weak=False, dispatch_uid=f"clusters.names.{model.__name__}"
                )
