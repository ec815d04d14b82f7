"""SQL queries per API request, at page sizes 1, 50 and 200, on a seeded site: the figure must not
grow with the page size (no query per row).

Runs in this process through Django's test client against the database the environment names
(`scripts/stack env` for the bench stack), as one user of the site file that `manage.py
seed_site --out` wrote. Prints a table; asserts nothing (tests/core/test_api_query_counts.py does).
Each request starts without the process's catalog names (clusters.selectors.catalog_names), so
the counts are those of a worker's first request: later ones read one query fewer.

    eval "$(STACK_DIR=var/bench scripts/stack env)"
    .venv/bin/python bench/queries.py --site var/bench/site.json
"""

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

PAGE_SIZES = (1, 50, 200)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--site", default=str(ROOT / "var" / "bench" / "site.json"))
    args = parser.parse_args()

    import django

    django.setup()
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    from clusters.selectors import catalog_names_forget

    site = json.loads(Path(args.site).read_text())
    # An owner, who may read the audit log too.
    user = next((u for u in site["users"] if u["tenants"][0]["role"] == "owner"), site["users"][0])
    tenant = user["tenants"][0]["slug"]
    client = Client(HTTP_HOST="127.0.0.1", HTTP_AUTHORIZATION=f"Token {user['token']}")
    job_id = client.get(f"/api/v1/jobs/?tenant={tenant}&page_size=1").json()["results"][0]["id"]
    paths = [
        f"/api/v1/jobs/?tenant={tenant}",
        f"/api/v1/jobs/?tenant={tenant}&state=COMPLETED",
        f"/api/v1/jobs/{job_id}/events/",
        f"/api/v1/quotas/?tenant={tenant}",
        f"/api/v1/quota-requests/?tenant={tenant}",
        "/api/v1/tenants/",
        f"/api/v1/tenants/{tenant}/members/",
        f"/api/v1/audit/?tenant={tenant}",
        "/api/v1/gpu-models/",
        "/api/v1/scenarios/",
        "/api/v1/clusters/",
        "/api/v1/templates/",
        "/api/v1/auth/tokens/",
    ]
    print(f"SQL queries per request, as {user['username']} ({user['tenants'][0]['role']} of {tenant})")
    print(f"{'request':<52}" + "".join(f"{f'page {n}':>10}" for n in PAGE_SIZES) + f"{'rows':>8}  constant")
    varying = 0
    for path in paths:
        counts, rows = [], 0
        for size in PAGE_SIZES:
            sep = "&" if "?" in path else "?"
            catalog_names_forget()  # each request reads the catalog's names, as a worker's first does
            with CaptureQueriesContext(connection) as queries:
                response = client.get(f"{path}{sep}page_size={size}")
            if response.status_code != 200:
                print(f"{path}: HTTP {response.status_code} {response.content[:200]!r}")
                return 1
            body = response.json()
            rows = len(body["results"]) if isinstance(body, dict) and "results" in body else len(body)
            counts.append(len(queries))
        same = len(set(counts)) == 1
        varying += not same
        print(
            f"{path[:52]:<52}" + "".join(f"{c:>10}" for c in counts) + f"{rows:>8}  {'yes' if same else 'NO'}"
        )
    print(f"requests whose query count grows with the page size: {varying}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
