"""Sign-in against an LDAP directory (django-auth-ldap), and the periodic sync of the users who
signed in through it: their groups followed, and access ended for those the directory disabled
or removed (identity.services)."""

import logging

import ldap
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django_auth_ldap.backend import LDAPBackend, ldap_error

from identity.models import DirectoryAccount, Source, group_key
from identity.selectors import ldap_accounts_to_sync
from identity.services import DirectoryRefused, directory_signed_in, directory_user_gone

log = logging.getLogger(__name__)
MASS_GONE_FLOOR = 3  # below this many, the sync never holds back (LDAP_SYNC_MAX_GONE)


def _attr(ldap_user, name: str) -> str:
    values = ldap_user.attrs.get(name.lower()) or ldap_user.attrs.get(name) or []
    return values[0] if values else ""


class _Refused(Exception):
    """Raised inside the sign-in's transaction to roll back what django-auth-ldap saved."""


class LdapBackend(LDAPBackend):
    """django-auth-ldap's backend that never takes over a portal account it did not make, knows
    a person by their entry's entryUUID (LDAP_UID_ATTR), not by a name that may be given to
    someone else later, and follows the user's groups at every sign-in."""

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
        # One transaction: django-auth-ldap saves a new user before the portal decides; a refused
        # first sign-in must leave no row behind (it would read as a local account ever after).
        try:
            with transaction.atomic():
                user = super().authenticate_ldap_user(ldap_user, password)
                if user is None:
                    return None
                if self.vouched(user, ldap_user, cause="sign-in") is None:
                    raise _Refused
                return user
        except _Refused:
            return None

    def directory_allows(self, ldap_user) -> bool:
        """Whether the directory lets the user in: with LDAP_ACTIVE_GROUP, membership of it;
        without, being found is enough."""
        active = settings.LDAP_ACTIVE_GROUP
        return not active or group_key(Source.LDAP, active) in {
            group_key(Source.LDAP, dn) for dn in ldap_user.group_dns
        }

    def vouched(self, user, ldap_user, *, cause: str):
        """The user, linked and following their groups, or None where the portal refuses them."""
        try:
            if not self.directory_allows(ldap_user):
                return None
            groups = sorted(ldap_user.group_dns)
        except ldap.LDAPError as exc:  # the group search failed: no decision on half an answer
            log.warning("LDAP groups of %s unreadable: %s", user.get_username(), type(exc).__name__)
            return None
        if not user.is_active and not DirectoryAccount.objects.filter(user=user, gone__isnull=False).exists():
            return None  # deactivated by a platform admin: the directory does not undo that
        try:
            directory_signed_in(
                user=user,
                source=Source.LDAP,
                subject=_attr(ldap_user, settings.LDAP_UID_ATTR) or ldap_user.dn,
                groups=groups,
                cluster_username=_attr(ldap_user, settings.LDAP_CLUSTER_USERNAME_ATTR),
                cause=cause,
            )
        except (DirectoryRefused, IntegrityError) as exc:
            log.warning("LDAP sign-in of %s refused: %s", user.get_username(), exc)
            return None
        return user

    def get_user(self, user_id):
        user = super().get_user(user_id)
        return user if user is not None and user.is_active else None


def sync_ldap_users() -> dict[str, int]:
    """Read every user who signed in through LDAP again: groups followed, and a user the
    directory no longer has (or no longer lets in, LDAP_ACTIVE_GROUP) loses access. Counts by
    outcome. A run that would take access from more than LDAP_SYNC_MAX_GONE of the users (and
    more than a few) takes it from none: an empty answer from a misconfigured search looks like
    everyone gone."""
    backend = LdapBackend()
    counts = {"synced": 0, "gone": 0, "failed": 0, "held": 0}
    errors: list[Exception] = []
    going: list[tuple] = []

    def record(sender, context, exception, **kwargs):
        errors.append(exception)

    # populate_user answers None both for a user the directory does not have and for a directory
    # it could not ask; the error signal tells them apart, and an unreachable directory disables no one.
    ldap_error.connect(record, weak=False)
    try:
        accounts = list(ldap_accounts_to_sync())
        for account in accounts:
            user = account.user
            errors.clear()
            try:
                found = backend.populate_user(user.get_username())
                allowed = found is not None and not errors and backend.directory_allows(found.ldap_user)
            except ldap.LDAPError as exc:
                errors.append(exc)
            if errors:
                log.warning("LDAP sync of %s failed: %s", user.get_username(), type(errors[0]).__name__)
                counts["failed"] += 1
            elif not allowed:
                going.append(
                    (
                        user,
                        "sync: not in the directory" if found is None else "sync: disabled in the directory",
                    )
                )
            elif backend.vouched(found, found.ldap_user, cause="sync") is not None:
                counts["synced"] += 1
    finally:
        ldap_error.disconnect(record)
    if len(going) > MASS_GONE_FLOOR and len(going) > settings.LDAP_SYNC_MAX_GONE * len(accounts):
        log.error("LDAP sync would take access from %d of %d users: none taken", len(going), len(accounts))
        counts["held"] = len(going)
        return counts
    for user, cause in going:
        directory_user_gone(user=user, cause=cause)
        counts["gone"] += 1
    return counts
