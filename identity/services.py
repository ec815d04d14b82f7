"""Every write that a directory causes: a user signed in (linked, groups followed, cluster
username set), synced, or gone from the directory. Memberships change through tenants.services,
so that the last-owner rule and the audit hold here as everywhere."""

import logging
from dataclasses import dataclass
from datetime import timedelta

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from identity.models import DirectoryAccount, GroupMapping, group_key
from portal.core.errors import Invalid
from portal.core.models import AuditEvent
from portal.core.services import audit_record
from portal.core.validators import cluster_username_validator
from tenants.errors import LastOwner
from tenants.mail import mail_on_commit
from tenants.models import Membership, Profile, Role, Tenant
from tenants.selectors import platform_admin_emails
from tenants.services import membership_add, membership_change_role, membership_remove

log = logging.getLogger(__name__)

CONFLICT_REPORTED_FOR = timedelta(days=1)  # a standing conflict is mailed once a day, not every sync
ROLE_RANK = {Role.VIEWER: 0, Role.MEMBER: 1, Role.MANAGER: 2, Role.OWNER: 3}


class DirectoryRefused(Exception):
    """A sign-in that the directory allowed and the portal refuses; the message is for the person."""


@dataclass(frozen=True)
class Conflict:
    """A change the groups asked for that would leave a tenant without an owner: not made,
    reported to platform admins."""

    tenant: str
    username: str
    wanted: str  # the role the groups give, or "" for none
    held: str


def _wanted_roles(source: str, groups: list[str]) -> dict[int, tuple[str, str, Tenant]]:
    """tenant id → (role, group, tenant): the highest role the user's groups map to."""
    keys = {group_key(source, group) for group in groups}
    wanted: dict[int, tuple[str, str, Tenant]] = {}
    for mapping in GroupMapping.objects.filter(source=source, group__in=keys).select_related("tenant"):
        held = wanted.get(mapping.tenant_id)
        if held is None or ROLE_RANK[mapping.role] > ROLE_RANK[held[0]]:
            wanted[mapping.tenant_id] = (mapping.role, mapping.group, mapping.tenant)
    return wanted


def groups_follow(*, user: AbstractBaseUser, source: str, groups: list[str], cause: str) -> list[Conflict]:
    """The user's tenant roles as their directory groups map them: a membership is made where a
    mapped group says so, and a membership that a mapping made changes role or ends as the
    groups do. Memberships made by hand are never touched, nor those in tenants that no mapping
    of this source names. A change that would leave a tenant without an owner is not made: it
    is audited and mailed to the platform admins, and returned."""
    wanted = _wanted_roles(source, groups)
    mapped = set(GroupMapping.objects.filter(source=source).values_list("tenant_id", flat=True))
    held = {m.tenant_id: m for m in Membership.objects.filter(user=user).select_related("tenant", "user")}
    conflicts: list[Conflict] = []
    for tenant_id, (role, group, tenant) in wanted.items():
        membership = held.get(tenant_id)
        why = f"{cause}: group {group}"
        if membership is None:
            membership_add(actor=None, tenant=tenant, user=user, role=role, managed=True, cause=why)
        elif membership.managed and membership.role != role:
            try:
                membership_change_role(actor=None, membership=membership, role=role, cause=why)
            except LastOwner:
                conflicts.append(_conflict(membership, wanted=role, cause=why))
    for tenant_id, membership in held.items():
        if membership.managed and tenant_id in mapped and tenant_id not in wanted:
            try:
                membership_remove(actor=None, membership=membership, cause=f"{cause}: in no mapped group")
            except LastOwner:
                conflicts.append(_conflict(membership, wanted="", cause=cause))
    return conflicts


def _conflict(membership: Membership, *, wanted: str, cause: str) -> Conflict:
    conflict = Conflict(
        tenant=membership.tenant.slug,
        username=membership.user.get_username(),
        wanted=wanted,
        held=membership.role,
    )
    reported = AuditEvent.objects.filter(
        action="membership.sync_conflict",
        target_id=str(membership.pk),
        data__role=[conflict.held, wanted or None],
        at__gte=timezone.now() - CONFLICT_REPORTED_FOR,
    )
    if reported.exists():  # told already: each sync would say it again
        return conflict
    audit_record(
        actor=None,
        action="membership.sync_conflict",
        target=membership,
        tenant=membership.tenant,
        data={"username": conflict.username, "role": [conflict.held, wanted or None], "cause": cause},
    )
    mail_on_commit(template="sync_conflict", to=platform_admin_emails(), context={"conflict": conflict})
    log.warning("directory sync left %s the last owner of %s", conflict.username, conflict.tenant)
    return conflict


def _cluster_username_set(user: AbstractBaseUser, name: str) -> None:
    """The researcher's cluster username from the directory, where it is a valid one and no one
    else's; otherwise the profile stays as it is, and the reason is logged."""
    name = (name or "").strip()
    if not name:
        return
    try:
        cluster_username_validator(name)
        with transaction.atomic():
            profile, _ = Profile.objects.get_or_create(user=user)
            if profile.cluster_username != name:
                old = profile.cluster_username
                profile.cluster_username = name
                profile.save(update_fields=["cluster_username"])
                audit_record(
                    actor=None,
                    action="profile.cluster_username",
                    target=profile,
                    data={"username": user.get_username(), "cluster_username": [old, name]},
                )
    except (ValidationError, IntegrityError) as exc:  # the name's form, or someone else's name
        log.warning("cluster username %r for %s not set: %s", name, user.get_username(), type(exc).__name__)


def account_of(*, source: str, subject: str) -> DirectoryAccount | None:
    return DirectoryAccount.objects.select_related("user").filter(source=source, subject=subject).first()


@transaction.atomic
def directory_signed_in(
    *,
    user: AbstractBaseUser,
    source: str,
    subject: str,
    groups: list[str],
    cluster_username: str = "",
    cause: str = "sign-in",
    refresh_token: str = "",
) -> list[Conflict]:
    """The directory vouched for the user just now (a sign-in, or a sync that found them):
    link them, follow their groups, take their cluster username, and make them active again
    if the directory had made them go."""
    account, made = DirectoryAccount.objects.get_or_create(
        user=user, defaults={"source": source, "subject": subject}
    )
    if not made and account.source != source:
        raise DirectoryRefused(f"This account signs in through {account.get_source_display()}, not here.")
    if not made and account.subject != subject:
        # An OIDC `sub` never changes, nor an LDAP entry's entryUUID: another subject is another
        # person (a recycled username), who must not inherit this account.
        raise DirectoryRefused(
            "This account belongs to another identity of the directory; ask a platform admin."
        )
    if account.gone is not None:
        user.is_active = True
        user.save(update_fields=["is_active"])
        audit_record(
            actor=None,
            action="user.enable",
            target=user,
            data={"username": user.get_username(), "cause": cause},
        )
        account.gone = None
    account.groups = sorted(set(groups))
    account.synced = timezone.now()
    if refresh_token:  # a provider may answer a refresh without a new one: the old one stands
        account.refresh_token = refresh_token
    account.save()
    _cluster_username_set(user, cluster_username)
    return groups_follow(user=user, source=source, groups=groups, cause=cause)


def directory_user_new(
    *, username: str, email: str, first_name: str, last_name: str, source: str, subject: str
):
    """A portal user for someone the directory vouched for and the portal has not seen: no
    password of the portal's, so only the directory signs them in. A local user of the same name
    is never taken over: that would let the directory sign in as them."""
    User = get_user_model()
    if User.objects.filter(username__iexact=username).exists():  # names compare without case here
        raise DirectoryRefused(
            f"A portal account named {username} exists and is not linked to this sign-in; "
            "ask a platform admin."
        )
    try:
        with transaction.atomic():
            user = User(
                username=username, email=email, first_name=first_name[:150], last_name=last_name[:150]
            )
            user.set_unusable_password()
            user.full_clean(exclude=["password"])
            user.save()
            DirectoryAccount.objects.create(user=user, source=source, subject=subject)
            audit_record(
                actor=None, action="user.create", target=user, data={"username": username, "source": source}
            )
    except IntegrityError:
        raise DirectoryRefused(f"The account {username} was just made by another sign-in.") from None
    except ValidationError as exc:
        reasons = "; ".join(f"{field}: {' '.join(errors)}" for field, errors in exc.message_dict.items())
        raise DirectoryRefused(
            f"The directory's name for you cannot be a portal username ({reasons})"
        ) from None
    return user


@transaction.atomic
def directory_user_gone(*, user: AbstractBaseUser, cause: str) -> None:
    """The directory disabled or removed the user, or the provider refused their grant: they lose
    access now. The account becomes inactive with a new unusable password, which changes the
    session hash Django checks on every request, so every session ends; an inactive user's API
    tokens answer 401. Memberships and tokens are kept: a sign-in the directory accepts again
    brings them back (directory_signed_in), a false alarm costs a sign-in, not a lab's tokens."""
    account = DirectoryAccount.objects.select_for_update().get(user=user)
    if account.gone is None:
        account.gone = timezone.now()
    account.refresh_token = ""  # refused once, it is asked no more; the next sign-in brings another
    account.save(update_fields=["gone", "refresh_token"])
    user.is_active = False
    user.set_unusable_password()
    user.save(update_fields=["is_active", "password"])
    audit_record(
        actor=None,
        action="user.disable",
        target=user,
        data={"username": user.get_username(), "cause": cause},
    )


# --- Group mappings (platform admins: the console and the API)


@transaction.atomic
def group_mapping_create(*, actor: AbstractBaseUser, source: str, group: str, tenant: Tenant, role: str):
    """Members of the group hold the role in the tenant from their next sign-in or sync."""
    key = group_key(source, group)
    if not key:
        raise Invalid({"group": "Name a group."})
    if GroupMapping.objects.filter(source=source, group=key, tenant=tenant).exists():
        raise Invalid({"group": f"This group is already mapped to {tenant.slug}."})
    mapping = GroupMapping.objects.create(source=source, group=key, tenant=tenant, role=role)
    audit_record(actor=actor, action="group_mapping.create", target=mapping, tenant=tenant,
                 data={"source": source, "group": key, "role": role})  # fmt: skip
    return mapping


@transaction.atomic
def group_mapping_change(*, actor: AbstractBaseUser, mapping: GroupMapping, role: str) -> GroupMapping:
    old = mapping.role
    mapping.role = role
    mapping.save(update_fields=["role"])
    audit_record(actor=actor, action="group_mapping.role", target=mapping, tenant=mapping.tenant,
                 data={"source": mapping.source, "group": mapping.group, "role": [old, role]})  # fmt: skip
    return mapping


@transaction.atomic
def group_mapping_delete(*, actor: AbstractBaseUser, mapping: GroupMapping) -> None:
    """The mapping goes; memberships it made end at the group members' next sign-in or sync
    while another mapping of the tenant remains (identity.services.groups_follow)."""
    audit_record(actor=actor, action="group_mapping.delete", target=mapping, tenant=mapping.tenant,
                 data={"source": mapping.source, "group": mapping.group, "role": mapping.role})  # fmt: skip
    mapping.delete()
