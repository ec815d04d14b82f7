"""Who the institution's directories say a user is: the link from a portal user to their
OpenID Connect subject or LDAP entry, and the mappings from directory groups to tenant roles
(docs/architecture.md, Institutional identity)."""

import re

from django.conf import settings
from django.db import models

from portal.core.fields import EncryptedTextField
from tenants.models import Role, Tenant


class Source(models.TextChoices):
    OIDC = "oidc", "OpenID Connect"
    LDAP = "ldap", "LDAP"


_DN_SPACES = re.compile(r"\s*([,=+])\s*")


def group_key(source: str, group: str) -> str:
    """The form a group is compared in: an OIDC claim value as sent; an LDAP DN lowercased with
    the spaces around its separators dropped (DNs compare without case: RFC 4514)."""
    group = group.strip()
    return _DN_SPACES.sub(r"\1", group).lower() if source == Source.LDAP else group


class GroupMapping(models.Model):
    """Members of `group` (in `source`) hold `role` in `tenant`. A user in several mapped groups
    of one tenant holds the highest of their roles."""

    source = models.CharField(max_length=8, choices=Source.choices)
    group = models.CharField(max_length=512, help_text="An OIDC group claim value, or an LDAP group's DN.")
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="group_mappings")
    role = models.CharField(max_length=16, choices=Role.choices)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(
                fields=["source", "group", "tenant"], name="group_mapping_once_per_tenant"
            )
        ]

    def __str__(self) -> str:
        return f"{self.source}:{self.group} → {self.tenant} as {self.role}"

    def save(self, *args, **kwargs):
        self.group = group_key(self.source, self.group)
        super().save(*args, **kwargs)


class DirectoryAccount(models.Model):
    """A portal user who signed in through a directory: their subject there (OIDC `sub`, LDAP
    DN), the groups it last reported, and when the directory last answered for them."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="directory")
    source = models.CharField(max_length=8, choices=Source.choices)
    subject = models.CharField(max_length=512)
    groups = models.JSONField(default=list, blank=True)
    synced = models.DateTimeField(null=True, blank=True)
    # The provider's refresh token, through which the sync asks an OpenID provider about the user
    # (identity.oidc.sync_oidc_users); encrypted at rest, never shown.
    refresh_token = EncryptedTextField(blank=True)
    # Set when the directory disabled or removed the user (identity.services.directory_user_gone):
    # a later sign-in that the directory accepts makes the user active again; a user a platform
    # admin deactivated stays so.
    gone = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        constraints = [models.UniqueConstraint(fields=["source", "subject"], name="directory_subject_once")]

    def __str__(self) -> str:
        return f"{self.user} = {self.source}:{self.subject}"
