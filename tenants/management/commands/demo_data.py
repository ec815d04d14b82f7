"""Demo data for the embedded portal: a platform admin, a quota approver and a read-only support
person (staff roles, portal/core/staff.py), two tenants, one user for each role.

Passwords are random, made on the first run and kept in var/demo-logins.txt (mode 0600), so
that no password lives in the repository and a second run prints the same logins."""

import json
import secrets
from datetime import timedelta
from decimal import Decimal

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management import call_command
from django.core.management.base import BaseCommand
from django.db import transaction
from django.utils import timezone

from clusters.models import Cluster, ClusterKind, GpuModel, Partition, Scenario
from portal.core.staff import ROLE_PLATFORM_ADMIN, ROLE_QUOTA_APPROVER, ROLE_READ_ONLY_SUPPORT
from tenants.models import QuotaRequest, Role, Tenant, Tier
from tenants.services import membership_add, quota_request_approve, quota_request_create, tenant_create

TENANTS = [
    ("protein-lab", "Protein Folding Lab", Tier.HIGH),
    ("cfd-group", "Aero CFD Group", Tier.NORMAL),
]
# username -> staff role; staff belong to no tenant. The admin is also a superuser (it manages
# staff accounts, which no role may).
STAFF = {
    "admin": ROLE_PLATFORM_ADMIN,
    "quinn": ROLE_QUOTA_APPROVER,
    "sam": ROLE_READ_ONLY_SUPPORT,
}
# username -> (tenant slug, role)
USERS = {
    "alice": ("protein-lab", Role.OWNER),
    "bob": ("protein-lab", Role.MANAGER),
    "carol": ("protein-lab", Role.MEMBER),
    "dave": ("protein-lab", Role.VIEWER),
    "erin": ("cfd-group", Role.OWNER),
}


class Command(BaseCommand):
    help = "Load demo users and tenants (idempotent) and print their logins."

    def handle(self, *args, **options):
        logins_path = settings.VAR_DIR / "demo-logins.txt"
        logins = json.loads(logins_path.read_text()) if logins_path.exists() else {}
        User = get_user_model()
        with transaction.atomic():
            tenants = {}
            for slug, name, tier in TENANTS:
                tenants[slug] = Tenant.objects.filter(slug=slug).first() or tenant_create(
                    actor=None, slug=slug, name=name, tier=tier, contact_email=f"{slug}@example.org"
                )
            for username in [*STAFF, *USERS]:
                password = logins.setdefault(username, secrets.token_urlsafe(9))
                user, created = User.objects.get_or_create(
                    username=username, defaults={"email": f"{username}@example.org"}
                )
                if created:
                    user.set_password(password)
                    user.is_staff = username in STAFF
                    user.is_superuser = username == "admin"
                    user.save()
                if username in STAFF:
                    user.groups.add(Group.objects.get(name=STAFF[username]))
                if username in USERS:
                    slug, role = USERS[username]
                    if not user.memberships.filter(tenant=tenants[slug]).exists():
                        membership_add(actor=None, tenant=tenants[slug], user=user, role=role)
            if not QuotaRequest.objects.exists():
                self._quota(tenants, admin=User.objects.get(username="admin"))
            self._local_cluster()
        call_command("demo_prices", stdout=self.stdout)  # billing's (an app above this one): by name
        if (settings.BASE_DIR / "var" / "testbed" / "testbed.env").exists():
            call_command("register_testbed", stdout=self.stdout)
        logins_path.touch(mode=0o600)
        logins_path.write_text(json.dumps(logins, indent=1))
        self.stdout.write("Demo logins (username / password / role):")
        for username, staff_role in STAFF.items():
            self.stdout.write(f"  {username:<6} {logins[username]:<14} {staff_role.lower()} (staff)")
        for username, (slug, role) in USERS.items():
            self.stdout.write(f"  {username:<6} {logins[username]:<14} {role} of {slug}")

    def _quota(self, tenants: dict, admin) -> None:
        """An approved AI-training grant for protein-lab and a pending CFD request from cfd-group."""
        today = timezone.localdate()
        User = get_user_model()
        window = {"starts_on": today, "ends_on": today + timedelta(days=90)}
        granted = quota_request_create(
            actor=User.objects.get(username="alice"),
            tenant=tenants["protein-lab"],
            scenario=Scenario.objects.get(slug="ai-training"),
            gpu_model=GpuModel.objects.get(slug="h100-80gb"),
            gpus=8,
            gpu_hours=Decimal(5000),
            justification="Fine-tune a protein language model.",
            **window,
        )
        quota_request_approve(actor=admin, request=granted, note="Approved for the demo.")
        quota_request_create(
            actor=User.objects.get(username="erin"),
            tenant=tenants["cfd-group"],
            scenario=Scenario.objects.get(slug="cfd"),
            gpu_model=GpuModel.objects.get(slug="a100-80gb"),
            gpus=4,
            gpu_hours=Decimal(1200),
            justification="Wing section LES at Re 1e6.",
            **window,
        )

    def _local_cluster(self) -> None:
        """The embedded default's cluster: jobs run as processes on this machine, on the GPUs
        nvidia-smi finds there or, on a machine without any, LOCAL_CLUSTER_GPUS pretend ones
        (their partition carries the demo grant's GPU model so that jobs can be submitted)."""
        cluster, _ = Cluster.objects.get_or_create(
            slug="local",
            defaults={
                "name": "This machine",
                "kind": ClusterKind.LOCAL,
                "local_gpus": settings.LOCAL_CLUSTER_GPUS,
                "healthy": True,
            },
        )
        Partition.objects.get_or_create(
            cluster=cluster,
            name="local",
            defaults={
                "gpu_model": GpuModel.objects.get(slug="h100-80gb"),
                "gpus_per_node": settings.LOCAL_CLUSTER_GPUS,
                "nodes": 1,
                "max_walltime_minutes": 24 * 60,
                "max_cpus_per_gpu": 1,
                "max_mem_per_gpu_mb": 1000,
            },
        )
