"""What staff may do across tenants: the one definition that the API, the pages and the admin
console all ask (docs/architecture/staff-roles.md).

`is_staff` opens the console's door and grants nothing else. Every power beyond a tenant
member's comes from an explicit permission, held directly or through one of the documented
role groups; superusers hold them all. A power also needs `is_staff` and an active account, so
that one switch (is_staff off) takes every staff power away at once, and so that the API never
grants what the console would refuse.

This module imports no app (portal/core sits below them): permissions are named as strings.
"""

from django.contrib.auth.models import AbstractBaseUser, Group
from django.db import transaction

from portal.core.services import audit_record

# Custom permissions of tenants.Tenant, held globally (not per tenant as the roles' are).
PLATFORM_ADMIN = "tenants.platform_admin"
DECIDE_QUOTA = "tenants.decide_quota"
VIEW_ALL = "tenants.view_all"


def _granted(user: AbstractBaseUser, perm: str) -> bool:
    # ModelBackend caches a user's permissions on the instance: two queries the first time in a
    # request, none after; guardian's backend answers a global check without a query.
    return bool(user.is_authenticated and user.is_active and user.is_staff and user.has_perm(perm))


def _token_carries_staff_powers(user: AbstractBaseUser) -> bool:
    # portal.core.auth marks a request's user with its API token's scope; a session has no mark.
    return getattr(user, "token_scope", "admin") == "admin"


def _holds(user: AbstractBaseUser, perm: str) -> bool:
    """A staff power: granted to the user, and carried by the request (a session, or an `admin`
    token)."""
    return _token_carries_staff_powers(user) and _granted(user, perm)


def holds_staff_perm(user: AbstractBaseUser, perm: str) -> bool:
    """A console permission ("jobs.change_job") as a staff power: with is_staff, an active
    account, and (through a token) only an `admin` token."""
    return _holds(user, perm)


def holds_staff_power(user: AbstractBaseUser) -> bool:
    """Whether any staff power is granted to the user, whatever the request carries: who may
    hold an `admin` token."""
    return any(_granted(user, perm) for perm in (PLATFORM_ADMIN, DECIDE_QUOTA, VIEW_ALL))


def staff_power_held_back(user: AbstractBaseUser) -> bool:
    """The user has staff powers and the request's token does not carry them: a refusal of a
    staff action is then the token's (403 `token_scope`), not the role's."""
    return not _token_carries_staff_powers(user) and holds_staff_power(user)


def is_platform_admin(user: AbstractBaseUser) -> bool:
    """Every power: tenants, tiers, clusters, quota, every job's script and environment."""
    return _holds(user, PLATFORM_ADMIN)


def can_decide_quota(user: AbstractBaseUser) -> bool:
    """May approve or reject any tenant's quota requests."""
    return is_platform_admin(user) or _holds(user, DECIDE_QUOTA)


def sees_all_tenants(user: AbstractBaseUser) -> bool:
    """Reads every tenant as a viewer does, plus its audit log: never a job's script or
    environment, which stay with the job's submitter, its tenant's managers and platform admins."""
    return is_platform_admin(user) or _holds(user, VIEW_ALL)


# --- The documented roles: Django groups, created by jobs/migrations (staff role groups) and
# kept in step by `manage.py staff_role sync`.

ROLE_PLATFORM_ADMIN = "Platform admin"
ROLE_QUOTA_APPROVER = "Quota approver"
ROLE_READ_ONLY_SUPPORT = "Read-only support"

# The models the console shows, by app label.
CONSOLE_MODELS = {
    "tenants": ("tenant", "membership", "quotarequest", "quotagrant"),
    "clusters": ("cluster", "partition", "gpumodel", "scenario", "scenariogpu"),
    "jobs": ("job", "jobevent"),
    "core": ("auditevent", "apitoken"),
    "monitoring": ("alert", "delivery", "alertchannel"),
    "identity": ("groupmapping", "directoryaccount"),
    "billing": ("price", "tiermultiplier", "budget"),
    "reports": ("statement", "tcoprofile", "cloudprice"),
}


def _model_perms(*actions: str, leave_out: tuple[str, ...] = ()) -> frozenset[str]:
    return frozenset(
        f"{app}.{action}_{model}"
        for app, models in CONSOLE_MODELS.items()
        for model in models
        for action in actions
        if f"{app}.{model}" not in leave_out
    )


# Role → its permissions as "app_label.codename". A change here needs a migration that calls
# staff_role_groups_sync (the groups in existing databases follow it only then).
STAFF_ROLES: dict[str, frozenset[str]] = {
    ROLE_PLATFORM_ADMIN: _model_perms("view", "add", "change", "delete")
    # auth.view_user: the console's member inline looks users up (autocomplete).
    | {PLATFORM_ADMIN, DECIDE_QUOTA, VIEW_ALL, "auth.view_user"},
    ROLE_QUOTA_APPROVER: _model_perms("view", leave_out=("core.apitoken",))
    | {DECIDE_QUOTA, VIEW_ALL, "tenants.change_quotarequest"},
    ROLE_READ_ONLY_SUPPORT: _model_perms("view", leave_out=("core.apitoken",)) | {VIEW_ALL},
}


def staff_roles_of(user: AbstractBaseUser) -> list[str]:
    """The documented roles whose group the (staff) user is in, by name; one query, none for
    someone who is not staff."""
    if not (user.is_authenticated and user.is_active and user.is_staff):
        return []
    return sorted(user.groups.filter(name__in=STAFF_ROLES).values_list("name", flat=True))


def staff_role_groups_sync(apps, *, verbosity: int = 0) -> dict[str, int]:
    """Create each role's group and give it exactly its permissions (removing others). Takes an
    app registry, so that a data migration passes its historical one; returns the groups'
    permission counts."""
    from django.contrib.auth.management import create_permissions

    # Permissions are made by post_migrate, after every migration: a fresh database has none yet.
    for app_config in apps.get_app_configs():
        # A migration's app configs are stubs without a models module, which create_permissions
        # takes for "no models here".
        models_module = getattr(app_config, "models_module", None)
        app_config.models_module = models_module or True
        create_permissions(app_config, verbosity=verbosity, apps=apps)
        app_config.models_module = models_module
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    counts = {}
    for name, role_perms in STAFF_ROLES.items():
        # A migration before an app's models existed syncs without them; that app's own
        # migration syncs again once they do (monitoring/migrations/0002_staff_role_groups.py).
        perms = frozenset(perm for perm in role_perms if _model_exists(apps, perm))
        wanted = [perm.split(".", 1) for perm in perms]
        found = list(
            Permission.objects.filter(
                content_type__app_label__in={app for app, _ in wanted},
                codename__in={codename for _, codename in wanted},
            ).select_related("content_type")
        )
        rows = [p for p in found if [p.content_type.app_label, p.codename] in wanted]
        missing = perms - {f"{p.content_type.app_label}.{p.codename}" for p in rows}
        if missing:
            raise LookupError(f"Permissions of the role {name!r} do not exist: {sorted(missing)}")
        group, _ = Group.objects.get_or_create(name=name)
        group.permissions.set(rows)
        counts[name] = len(rows)
    return counts


def _model_exists(apps, perm: str) -> bool:
    """Whether the model a console permission ("app.view_model") is about exists in the app
    registry; True for any other permission."""
    app, _, codename = perm.partition(".")
    model = codename.split("_", 1)[-1]
    if model not in CONSOLE_MODELS.get(app, ()):
        return True
    try:
        apps.get_model(app, model)
    except LookupError:
        return False
    return True


@transaction.atomic
def staff_role_grant(*, user: AbstractBaseUser, role: str) -> None:
    """Put the user in the role's group, as staff (the console's door opens with it); audited."""
    if role not in STAFF_ROLES:
        raise LookupError(f"No staff role {role!r}: one of {', '.join(STAFF_ROLES)}")
    user.groups.add(Group.objects.get(name=role))
    if not user.is_staff:
        user.is_staff = True
        user.save(update_fields=["is_staff"])
    audit_record(actor=None, action="staff.role_grant", target=user, data={"role": role})


@transaction.atomic
def staff_role_revoke(*, user: AbstractBaseUser, role: str) -> None:
    """Take the user out of the role's group; is_staff stays, and alone grants nothing. Audited."""
    if role not in STAFF_ROLES:
        raise LookupError(f"No staff role {role!r}: one of {', '.join(STAFF_ROLES)}")
    user.groups.remove(Group.objects.get(name=role))
    audit_record(actor=None, action="staff.role_revoke", target=user, data={"role": role})
