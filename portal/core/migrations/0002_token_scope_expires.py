"""Tokens gain a scope and an expiry: those made before are `submit` and end after the site's
maximum (API_TOKEN_MAX_DAYS) from now, the issue's rule for tokens that had neither."""

from datetime import timedelta

from django.conf import settings
from django.db import migrations, models
from django.utils import timezone


def expire_at_site_maximum(apps, schema_editor):
    ApiToken = apps.get_model("core", "ApiToken")
    ApiToken.objects.filter(expires__isnull=True).update(
        expires=timezone.now() + timedelta(days=settings.API_TOKEN_MAX_DAYS)
    )


class Migration(migrations.Migration):
    dependencies = [("core", "0001_initial")]

    operations = [
        migrations.AddField(
            model_name="apitoken",
            name="scope",
            field=models.CharField(
                choices=[("read", "read"), ("submit", "submit"), ("admin", "admin")],
                default="submit",
                max_length=8,
            ),
        ),
        migrations.AddField(model_name="apitoken", name="expires", field=models.DateTimeField(null=True)),
        migrations.RunPython(expire_at_site_maximum, migrations.RunPython.noop),
        migrations.AlterField(model_name="apitoken", name="expires", field=models.DateTimeField()),
    ]
