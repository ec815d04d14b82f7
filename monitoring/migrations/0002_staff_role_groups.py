"""The staff roles' groups gain the console's alert, delivery and alert channel models
(portal/core/staff.py)."""

from django.db import migrations

from portal.core.staff import staff_role_groups_sync


def forwards(apps, schema_editor):
    staff_role_groups_sync(apps)


class Migration(migrations.Migration):
    dependencies = [
        ("monitoring", "0001_initial"),
        ("jobs", "0006_cluster_user_of_waiting_jobs"),
    ]

    operations = [migrations.RunPython(forwards, migrations.RunPython.noop)]
