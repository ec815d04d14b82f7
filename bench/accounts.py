"""Give the load's tenants their Slurm accounts on the testbed, through the portal's own path
(tenants.limits.tenant_apply: account, users, QOS and GPU limits by sacctmgr over SSH), so that
the jobs the load submits are taken by Slurm and run, as on a real site, instead of being refused
for an unknown account.

    .venv/bin/python bench/accounts.py --site var/bench/site.json

Each tenant's jobs run as its own job identity (the registered testbed's template: pt-<slug>), a
Unix user that a site's admin makes once per team: here `testbed.sh identity` makes it, as root.
Run with the stack's settings (scripts/bench evaluates `scripts/stack env` first). Only tenants
whose account lacks its identity are applied (one sacctmgr listing tells which), one after
the other: about two seconds each on the testbed, so the first run on a fresh testbed takes
minutes and later ones a second. (In parallel, sacctmgr refused users of accounts that another
call had just added.)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

import django  # noqa: E402

django.setup()

from clusters.models import Cluster  # noqa: E402
from clusters.services import backend_of  # noqa: E402
from tenants.limits import tenant_apply  # noqa: E402
from tenants.models import Tenant  # noqa: E402
from tenants.selectors import tenant_identities  # noqa: E402
from tests.testbed.env import testbed_identity  # noqa: E402

SUBMIT_ROLES = {"owner", "manager", "member"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--site", default=str(ROOT / "var" / "bench" / "site.json"))
    args = parser.parse_args()
    site = json.loads(Path(args.site).read_text())
    slugs = sorted(
        {
            t["slug"]
            for user in site["users"]
            for t in user.get("tenants", [])
            if t.get("role") in SUBMIT_ROLES
        }
    )
    cluster = Cluster.objects.get(slug=site["cluster"])
    # An account counts once its identity is associated with it: tenant_apply adds the account,
    # then the user, and an account whose user failed is applied again.
    listing = backend_of(cluster).check(["sacctmgr", "-n", "-P", "show", "assoc", "format=Account,User"])
    pairs = {tuple(row.split("|", 1)) for row in listing.split()}
    tenants = Tenant.objects.filter(slug__in=slugs).order_by("slug")
    # sacctmgr keeps names in lower case, as slugs are
    missing = [
        t for t in tenants if not {(t.slug, u) for u in tenant_identities(cluster=cluster, tenant=t)} <= pairs
    ]
    started = time.monotonic()
    for tenant in missing:
        for identity in tenant_identities(cluster=cluster, tenant=tenant):
            testbed_identity(identity)
        tenant_apply(tenant_id=tenant.pk, cluster_id=cluster.pk)
    print(
        f"Slurm accounts: {len(slugs) - len(missing)} of the load's {len(slugs)} tenants had one; "
        f"{len(missing)} applied on {cluster.slug} in {time.monotonic() - started:.1f} s"
    )


if __name__ == "__main__":
    main()
