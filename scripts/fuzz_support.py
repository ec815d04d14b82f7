"""What scripts/fuzz asks of the API around the schemathesis runs, over HTTP only (standard library):

  token USER FILE           a token for USER (password from FUZZ_LOGINS) into FILE (mode 0600);
                            prints the token's id, never the key
  snapshot FILE OUT         as an admin: every tenant's fields and members, into OUT
  restore FILE SNAPSHOT     as an admin: put those tenants' fields and members back as they were
  cancel FILE SINCE         as an admin: cancel the jobs created since SINCE that have not ended
  revoke FILE ID            revoke token ID with the token in FILE (204, or 401 once revoked)
  revoke-new FILE ID SINCE  revoke the tokens created since SINCE (POST /auth/token/ with the
                            run's own login mints them) of FILE's user, but token ID

The fuzzer, as an admin, may suspend a tenant, change roles or remove members, and submits jobs
to the real clusters; restoring the snapshot and cancelling those jobs leaves the stack as the
next run (and the Postman collection) expects it; the tenants the fuzzer creates (slugs
`fuzz-…`, scripts/fuzz_hooks.py) are left as they are. FUZZ_BASE_URL names the stack.
"""

import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from datetime import datetime

BASE = os.environ.get("FUZZ_BASE_URL", "http://127.0.0.1:8765").rstrip("/")
API = f"{BASE}/api/v1"
TIMEOUT_S = 30
MAX_PAGES = 100  # 200 rows a page: far beyond a test stack
THROTTLE_RETRIES = 4  # a throttle's window is a minute: wait out one at most, then fail
MAX_WAIT_S = 65
FUZZ_TENANT_PREFIX = "fuzz-"  # scripts/fuzz_hooks.py
ACTIVE_STATES = ["QUEUED", "SUBMITTING", "PENDING", "RUNNING"]
ROLE_ORDER = {"owner": 0, "manager": 1, "member": 2, "viewer": 3}


class ApiError(Exception):
    pass


def call(
    method: str, url: str, *, key: str | None = None, body: dict | None = None
) -> tuple[int, dict, dict]:
    """(status, JSON body or {}, headers) of a path under /api/v1, or of a `next` link as given;
    a 429 is waited out (Retry-After) a few times, as the fuzzer may have spent the caller's
    budget just before. Raises ApiError on a network failure."""
    for _ in range(THROTTLE_RETRIES):
        status, parsed, headers = _call(method, url, key=key, body=body)
        if status != 429:
            break
        wait = min(int(headers.get("Retry-After", "10")), MAX_WAIT_S)
        print(f"fuzz: {method} {url} throttled; waiting {wait} s", file=sys.stderr)
        time.sleep(wait)
    return status, parsed, headers


def _call(method: str, url: str, *, key: str | None, body: dict | None) -> tuple[int, dict, dict]:
    url = url if "://" in url else API + url
    if not url.startswith(("http://", "https://")):
        raise ApiError(f"not an HTTP URL: {url}")
    headers = {"Accept": "application/json"}
    data = None
    if key is not None:
        headers["Authorization"] = f"Token {key}"
    if body is not None:
        headers["Content-Type"] = "application/json"
        data = json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers=headers)  # noqa: S310 (checked)
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:  # noqa: S310
            status, raw, answer_headers = response.status, response.read(), dict(response.headers)
    except urllib.error.HTTPError as exc:
        status, raw, answer_headers = exc.code, exc.read(), dict(exc.headers)
    except (urllib.error.URLError, TimeoutError) as exc:
        raise ApiError(f"{method} {url}: {exc}") from None
    try:
        parsed = json.loads(raw) if raw else {}
    except ValueError:
        parsed = {}
    return status, parsed, answer_headers


def expect(status: int, body: dict, wanted: set[int], what: str) -> dict:
    if status not in wanted:
        raise ApiError(f"{what}: {status} {body.get('code', '')} {body.get('detail', '')}".strip())
    return body


def read_key(path: str) -> str:
    with open(path) as handle:
        return handle.read().strip()


def listing(path: str, key: str, query: str = "") -> list[dict]:
    rows: list[dict] = []
    url: str | None = f"{path}?{query}{'&' if query else ''}page_size=200"
    for _ in range(MAX_PAGES):
        if url is None:
            return rows
        status, body, _ = call("GET", url, key=key)
        expect(status, body, {200}, f"GET {path}")
        rows += body["results"]
        url = body.get("next")
    raise ApiError(f"GET {path}: more than {MAX_PAGES} pages")


def token(username: str, out: str) -> None:
    with open(os.environ.get("FUZZ_LOGINS", "var/stack/logins.json")) as handle:
        password = json.load(handle)[username]
    status, body, _ = call(
        "POST", "/auth/token/", body={"username": username, "password": password, "name": "fuzz"}
    )
    expect(status, body, {201}, f"token for {username}")
    descriptor = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(body["token"])
    print(body["id"])


def snapshot(key_file: str, out: str) -> None:
    key = read_key(key_file)
    tenants = {}
    for tenant in listing("/tenants/", key):
        if tenant["slug"].startswith(FUZZ_TENANT_PREFIX):
            continue
        members = listing(f"/tenants/{tenant['slug']}/members/", key)
        tenants[tenant["slug"]] = {
            "fields": {name: tenant[name] for name in ("name", "contact_email", "tier", "state")},
            "members": {member["username"]: member["role"] for member in members},
        }
    with open(out, "w") as handle:
        json.dump(tenants, handle, indent=1, sort_keys=True)


def restore(key_file: str, snapshot_file: str) -> None:
    """Fields first (a suspended tenant refuses member changes), then owners before the others
    and removals last, so that no step leaves a tenant without an owner (409 last_owner)."""
    key = read_key(key_file)
    with open(snapshot_file) as handle:
        tenants = json.load(handle)
    for slug, saved in tenants.items():
        status, body, _ = call("PATCH", f"/tenants/{slug}/", key=key, body=saved["fields"])
        expect(status, body, {200}, f"restore {slug}")
        url = f"/tenants/{slug}/members/"
        now = {member["username"]: member["role"] for member in listing(url, key)}
        for username, role in sorted(saved["members"].items(), key=lambda item: ROLE_ORDER[item[1]]):
            if username not in now:
                status, body, _ = call("POST", url, key=key, body={"username": username, "role": role})
                expect(status, body, {201}, f"restore {username} in {slug}")
            elif now[username] != role:
                status, body, _ = call("PATCH", f"{url}{username}/", key=key, body={"role": role})
                expect(status, body, {200}, f"restore {username}'s role in {slug}")
        for username in sorted(set(now) - set(saved["members"])):
            status, body, _ = call("DELETE", f"{url}{username}/", key=key)
            # last_owner: the tenant had no owner before, which the API cannot bring back; an
            # owner the fuzzer added stays.
            if body.get("code") != "last_owner":
                expect(status, body, {204}, f"remove {username} from {slug}")
    print(f"fuzz: restored {len(tenants)} tenants and their members", file=sys.stderr)


def cancel(key_file: str, since: str) -> None:
    key = read_key(key_file)
    query = urllib.parse.urlencode([("created_after", since), *(("state", s) for s in ACTIVE_STATES)])
    jobs = listing("/jobs/", key, query)
    for job in jobs:
        status, body, _ = call("POST", f"/jobs/{job['id']}/cancel/", key=key)
        # 409: it ended meanwhile.
        expect(status, body, {202, 409}, f"cancel job {job['id']}")
    print(f"fuzz: cancelled {len(jobs)} jobs the fuzzer submitted", file=sys.stderr)


def revoke(key_file: str, token_id: str) -> None:
    status, body, _ = call("DELETE", f"/auth/tokens/{token_id}/", key=read_key(key_file))
    expect(status, body, {204, 401}, f"revoke token {token_id}")


def revoke_new(key_file: str, keep_id: str, since: str) -> None:
    key = read_key(key_file)
    start = datetime.fromisoformat(since)
    rows = listing("/auth/tokens/", key)
    minted = [t for t in rows if datetime.fromisoformat(t["created"]) >= start and t["id"] != keep_id]
    for row in minted:
        status, body, _ = call("DELETE", f"/auth/tokens/{row['id']}/", key=key)
        expect(status, body, {204, 404}, f"revoke token {row['id']}")
    print(f"fuzz: revoked {len(minted)} tokens the fuzzer created", file=sys.stderr)


COMMANDS = {
    "token": (token, 2),
    "snapshot": (snapshot, 2),
    "restore": (restore, 2),
    "cancel": (cancel, 2),
    "revoke": (revoke, 2),
    "revoke-new": (revoke_new, 3),
}

if __name__ == "__main__":
    command, arity = COMMANDS.get(sys.argv[1] if len(sys.argv) > 1 else "", (None, 0))
    if command is None or len(sys.argv) != 2 + arity:
        sys.exit(__doc__)
    try:
        command(*sys.argv[2:])
    except ApiError as exc:
        sys.exit(f"fuzz: {exc}")
