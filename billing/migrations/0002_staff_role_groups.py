"""The staff roles' groups gain the console's price list, tier multipliers, budgets, statements
and TCO profiles (portal/core/staff.py)."""

from django.db import migrations

from portal.core.staff import staff_role_groups_sync


def forwards(apps, schema_editor):
    staff_role_groups_sync(apps)


class Migration(migrations.Migration):
    dependencies = [
        ("billing", "0001_initial"),
        ("reports", "0001_initial"),
        ("monitoring", "0002_staff_role_groups"),
    ]

    operations = [migrations.RunPython(forwards, migrations.RunPython.noop)]
