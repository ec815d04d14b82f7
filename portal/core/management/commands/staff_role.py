from django.apps import apps
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from portal.core.staff import STAFF_ROLES, staff_role_grant, staff_role_groups_sync, staff_role_revoke


class Command(BaseCommand):
    help = (
        "Hand out the documented staff roles (docs: staff roles): `grant USER ROLE`, `revoke USER ROLE`, "
        "`list`, or `sync` (reset each role's group to exactly its permissions)."
    )

    def add_arguments(self, parser):
        parser.add_argument("what", choices=["grant", "revoke", "list", "sync"])
        parser.add_argument("username", nargs="?")
        parser.add_argument("role", nargs="?", choices=list(STAFF_ROLES))

    def handle(self, *args, what: str, username: str | None, role: str | None, **options):
        if what == "sync":
            for name, count in staff_role_groups_sync(apps).items():
                self.stdout.write(f"{name}: {count} permissions")
            return
        if what == "list":
            User = get_user_model()
            for name in STAFF_ROLES:
                members = User.objects.filter(groups__name=name).order_by("username")
                names = ", ".join(u.get_username() + ("" if u.is_staff else " (not staff)") for u in members)
                self.stdout.write(f"{name}: {names or '—'}")
            return
        if not username or not role:
            choices = ", ".join(map(repr, STAFF_ROLES))
            raise CommandError(f"{what} takes a username and a role: one of {choices}")
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"No user {username!r}")
        (staff_role_grant if what == "grant" else staff_role_revoke)(user=user, role=role)
        self.stdout.write(f"{username}: {what} {role}")
