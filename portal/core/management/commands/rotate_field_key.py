from django.apps import apps
from django.core.management.base import BaseCommand
from django.db import transaction

from portal.core.fields import EncryptedTextField


class Command(BaseCommand):
    help = (
        "Re-encrypt every encrypted field with the first key of FIELD_ENCRYPTION_KEY. Rotation: put a "
        "new key first (keep the old after it), restart, run this, then drop the old key."
    )

    def handle(self, *args, **options):
        for model in apps.get_models():
            columns = [f.attname for f in model._meta.concrete_fields if isinstance(f, EncryptedTextField)]
            if not columns:
                continue
            rows = 0
            # Reading decrypts with whichever key made a value; update() encrypts with the first.
            # Rows locked, so that a secret saved meanwhile is not overwritten by the one read.
            with transaction.atomic():
                for pk, *values in model._base_manager.select_for_update().values_list("pk", *columns):
                    model._base_manager.filter(pk=pk).update(**dict(zip(columns, values, strict=True)))
                    rows += 1
            self.stdout.write(f"{model._meta.label}: {rows} rows re-encrypted ({', '.join(columns)})")
