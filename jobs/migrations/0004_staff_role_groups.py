"""The documented staff roles as groups (portal/core/staff.py holds the table). In jobs, the app
at the top, since the groups hold permissions of every app below it."""

from django.db import migrations

from portal.core.staff import STAFF_ROLES, staff_role_groups_sync


def forwards(apps, schema_editor):
    staff_role_groups_sync(apps)


def backwards(apps, schema_editor):
    apps.get_model("auth", "Group").objects.filter(name__in=STAFF_ROLES).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("core", "0001_initial"),
        ("clusters", "0005_metrics_url"),
        ("tenants", "0004_staff_permissions"),
        ("jobs", "0003_job_holds_gpus_index"),
    ]

    operations = [migrations.RunPython(forwards, backwards)]
