"""What each role may do in its tenant: the one table that services turn into guardian
object permissions on the Tenant (docs/architecture.md, Membership)."""

from tenants.models import Role

VIEW = "view_tenant"
CHANGE = "change_tenant"
MANAGE_MEMBERS = "manage_members"
REQUEST_QUOTA = "request_quota"
SUBMIT_JOB = "submit_job"
CANCEL_ANY_JOB = "cancel_any_job"
VIEW_AUDIT = "view_audit"

ROLE_PERMISSIONS: dict[Role, frozenset[str]] = {
    Role.OWNER: frozenset(
        {VIEW, CHANGE, MANAGE_MEMBERS, REQUEST_QUOTA, SUBMIT_JOB, CANCEL_ANY_JOB, VIEW_AUDIT}
    ),
    Role.MANAGER: frozenset({VIEW, MANAGE_MEMBERS, REQUEST_QUOTA, SUBMIT_JOB, CANCEL_ANY_JOB, VIEW_AUDIT}),
    Role.MEMBER: frozenset({VIEW, SUBMIT_JOB}),
    Role.VIEWER: frozenset({VIEW}),
}

ALL_PERMISSIONS = frozenset().union(*ROLE_PERMISSIONS.values())
