from django.core.validators import RegexValidator
from django.utils.translation import gettext_lazy as _

# docs/api.md: slugs are lowercase [a-z0-9-]; also a valid Slurm account and Kubernetes namespace name.
slug_validator = RegexValidator(
    r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$",
    _("Use 1 to 63 lowercase letters, digits and inner hyphens."),
)
# A POSIX user name that jobs run as on a cluster (useradd's default rule, at most 32 characters).
cluster_username_validator = RegexValidator(
    r"^[a-z_][a-z0-9_-]{0,31}$",
    _("Use a POSIX user name: up to 32 lowercase letters, digits, '_' and '-', not starting with a digit."),
)
# A tenant's slug names its Slurm account and Kubernetes namespace: not one that Kubernetes or
# Slurm keeps for itself.
reserved_slug_validator = RegexValidator(
    r"^(?:default|root|kube-.*)$",
    _("This name is reserved by the schedulers; choose another."),
    inverse_match=True,
)
