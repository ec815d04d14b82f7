from django.apps import AppConfig
from django.db.models.signals import pre_delete, pre_save
from django.utils.translation import gettext_lazy as _


class ReportsConfig(AppConfig):
    name = "reports"
    verbose_name = _("Statements and reports")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Statements are kept as made (reports/statements.py): a save of a row already written,
        # or a delete, is refused however it is attempted (the console, the shell, a service).
        from reports import statements
        from reports.models import Statement, StatementLine

        for model in (Statement, StatementLine):
            pre_save.connect(statements.refuse_change, sender=model, dispatch_uid=f"kept-{model.__name__}")
            pre_delete.connect(
                statements.refuse_delete, sender=model, dispatch_uid=f"kept-del-{model.__name__}"
            )
