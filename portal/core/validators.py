from django.core.validators import RegexValidator
from django.utils.translation import gettext_lazy as _

# API.md: slugs are lowercase [a-z0-9-]; also a valid Slurm account and Kubernetes namespace name.
slug_validator = RegexValidator(
    r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$",
    _("Use 1 to 63 lowercase letters, digits and inner hyphens."),
)
