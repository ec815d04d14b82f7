"""Sign-in against an LDAP directory (django-auth-ldap), and the periodic sync of the users who
signed in through it: their groups followed, and access ended for those the directory disabled
or removed (identity.services)."""

import logging

from django.conf import settings
from django.contrib.auth import get_user_model
from django_auth_ldap.backend import LDAPBackend, ldap_error

from identity.models import DirectoryAccount, Source
from identity.services import DirectoryRefused, directory_signed_in, directory_user_gone

log = logging.getLogger(__name__)


def _attr(ldap_user, name: str) -> str:
    values = ldap_user.attrs.get(name.lower()) or ldap_user.attrs.get(name) or []
    return values[0] if values else ""


class LdapBackend(LDAPBackend):
    """django-auth-ldap's backend that never takes over a portal account it did not make, and
    that follows the user's groups at every sign-in."""

    def authenticate(self, request, username=None, password=None, **kwargs):
        if not username or not password:
            return None
        username = username.strip()
        User = get_user_model()
        # django-auth-ldap finds its user by the name without case (get_or_build_user).
        local = User.objects.filter(username__iexact=username).exclude(directory__source=Source.LDAP).exists()
        if local:
            return None  # the portal's own account (ModelBackend answered it) or another directory's
        return super().authenticate(request, username=username, password=password, **kwargs)

    def authenticate_ldap_user(self, ldap_user, password):
        user = super().authenticate_ldap_user(ldap_user, password)
        if user is None:
            return None
        return self._vouched(user, ldap_user, cause="sign-in")

    def directory_allows(self, user) -> bool:
        """Whether the directory lets the user in: with LDAP_ACTIVE_GROUP, membership of it (read
        into is_active just now by django-auth-ldap); without, being found is enough."""
        return "is_active" not in self.settings.USER_FLAGS_BY_GROUP or user.is_active

    def _vouched(self, user, ldap_user, *, cause: str):
        if not self.directory_allows(user):
            return None
        if not user.is_active and not DirectoryAccount.objects.filter(user=user, gone__isnull=False).exists():
            return None  # deactivated by a platform admin: the directory does not undo that
        try:
            directory_signed_in(
                user=user,
                source=Source.LDAP,
                subject=ldap_user.dn,
                groups=sorted(ldap_user.group_dns),
                cluster_username=_attr(ldap_user, settings.LDAP_CLUSTER_USERNAME_ATTR),
                cause=cause,
            )
        except DirectoryRefused as exc:
            log.warning("LDAP sign-in of %s refused: %s", user.get_username(), exc)
            return None
        return user

    def get_user(self, user_id):
        user = super().get_user(user_id)
        return user if user is not None and user.is_active else None


def sync_ldap_users() -> dict[str, int]:
    """Read every user who signed in through LDAP again: groups followed, and a user the
    directory no longer has (or no longer lets in, LDAP_ACTIVE_GROUP) loses access. Counts by
    outcome."""
    backend = LdapBackend()
    counts = {"synced": 0, "gone": 0, "failed": 0}
    errors: list[Exception] = []

    def record(sender, context, exception, **kwargs):
        errors.append(exception)

    # populate_user answers None both for a user the directory does not have and for a directory
    # it could not ask; the error signal tells them apart, and an unreachable directory disables no one.
    ldap_error.connect(record, weak=False)
    try:
        accounts = DirectoryAccount.objects.filter(source=Source.LDAP, gone__isnull=True).select_related(
            "user"
        )
        for account in accounts.iterator(chunk_size=200):
            user = account.user
            errors.clear()
            found = backend.populate_user(user.get_username())
            if errors:
                log.warning("LDAP sync of %s failed: %s", user.get_username(), type(errors[0]).__name__)
                counts["failed"] += 1
            elif found is None or not backend.directory_allows(found):
                cause = "sync: not in the directory" if found is None else "sync: disabled in the directory"
                directory_user_gone(user=user, cause=cause)
                counts["gone"] += 1
            elif backend._vouched(found, found.ldap_user, cause="sync") is not None:
                counts["synced"] += 1
    finally:
        ldap_error.disconnect(record)
    return counts
