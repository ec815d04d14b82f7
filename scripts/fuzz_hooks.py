"""Schemathesis hooks for scripts/fuzz: positive test cases that the API would accept.

A positive case is one the schema allows, and the positive_data_acceptance check expects the API
to accept it (2xx, or 401/403/404/409/429). The schema cannot state every rule of the domain: a
slug must name an object that exists, a job must fit the partition it asks for, `to` may not be
more than 366 days after `from`, an approval may lower the requested figures but not raise them,
a password must be right, an alert channel's URL must be on its robot's host and resolve to
a public address, and a share's fields must fit its kind (only a MIG share names a profile, only
a slice has caps) and what the model and partition offer. A random positive case breaks such a
rule almost always and is refused with a 400 that is the API's correct answer, not a finding.

So each positive case of those operations is completed here with what the stack really holds
(read over the API with the run's token, right before the case is sent): existing slugs, a
partition and a job shape that fits it, a date range within bounds, the run's own login. The
generated values are kept wherever a rule allows them. Negative cases are left alone, and every
check runs on every case as it is sent; nothing here looks at a response.

Environment (scripts/fuzz sets it): FUZZ_BASE_URL, FUZZ_TOKEN (the run's API token), FUZZ_USER
and FUZZ_LOGINS (its password, for POST /auth/token/).
"""

import itertools
import json
import os
import re
import secrets
import threading
import time
import urllib.error
import urllib.request
import zlib
from datetime import date, timedelta

import schemathesis

API = os.environ.get("FUZZ_BASE_URL", "http://127.0.0.1:8765").rstrip("/") + "/api/v1"
TIMEOUT_S = 30
THROTTLE_RETRIES = 3
MAX_WAIT_S = 65
USAGE_MAX_DAYS = 366
# jobs/models.py MAX_PRIORITY: the highest priority a tenant's tier allows.
TIER_CAP = {"low": "low", "normal": "normal", "high": "high", "critical": "high"}
PRIORITIES = ["low", "normal", "high"]
# A tenant the fuzzer creates has this prefix and a serial (a slug is unique: a repeat is a 400);
# scripts/fuzz leaves such tenants out when it restores the others.
FUZZ_TENANT_PREFIX = "fuzz-"
# What a positive job runs: nothing, at once (the jobs reach the real clusters).
JOB_SCRIPT = "#!/bin/sh\n# schemathesis\nexit 0\n"

_lock = threading.Lock()
_refs: dict = {}
_serial = itertools.count(1)
_OURS = re.compile(rf"^{FUZZ_TENANT_PREFIX}[0-9]+x[0-9]+-")


def _get(path: str, method: str = "GET"):
    """GET (or another method) as the run's identity. Its requests count against the same
    throttle as the run's, so a 429 is waited out (Retry-After) a few times rather than failing
    the case."""
    request = urllib.request.Request(  # noqa: S310 (FUZZ_BASE_URL is scripts/fuzz's http(s) URL)
        path if "://" in path else API + path,
        headers={"Authorization": f"Token {os.environ['FUZZ_TOKEN']}", "Accept": "application/json"},
        method=method,
    )
    for attempt in range(THROTTLE_RETRIES + 1):
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:  # noqa: S310
                body = response.read()
                return json.loads(body) if body else None
        except urllib.error.HTTPError as exc:
            if exc.code != 429 or attempt == THROTTLE_RETRIES:
                raise
            time.sleep(min(int(exc.headers.get("Retry-After", "5")), MAX_WAIT_S))


def _all(path: str) -> list[dict]:
    rows, url = [], f"{path}?page_size=200"
    for _ in range(50):  # 10,000 rows: far beyond a test stack
        page = _get(url)
        rows += page["results"]
        url = page["next"]
        if url is None:
            break
    return rows


def refs() -> dict:
    """What the stack holds that the run does not change, read once: the (scenario, GPU model,
    cluster, partition) combinations a job can run on, users, and the run's login."""
    with _lock:
        if not _refs:
            clusters = _all("/clusters/")
            scenarios = _all("/scenarios/")
            with open(os.environ.get("FUZZ_LOGINS", "var/stack/logins.json")) as handle:
                logins = json.load(handle)
            user = os.environ.get("FUZZ_USER", "")
            _refs.update(
                pairs=[(s["slug"], g["gpu_model"]) for s in scenarios for g in s["gpu_models"]],
                placements=[
                    (s["slug"], p["gpu_model"], c["slug"], p)
                    for c in clusters
                    for p in c["partitions"]
                    for s in scenarios
                    if p["gpu_model"] in {g["gpu_model"] for g in s["gpu_models"]}
                ],
                advisors={s["advisor"]: s["slug"] for s in scenarios if s["advisor"]},
                usernames=sorted(logins),
                login={"username": user, "password": logins.get(user, "")},
                staff=bool(_get("/me/")["staff_roles"] or _get("/me/")["platform_admin"]),
                platform_admin=bool(_get("/me/")["platform_admin"]),
            )
        return _refs


def pick(options: list, seed) -> object:
    """One of the options, chosen by the generated value (not at random: Hypothesis replays and
    shrinks a case, and must get the same one back)."""
    digest = zlib.crc32(json.dumps(seed, sort_keys=True, default=str).encode())
    return options[digest % len(options)]


def _date(value, default: date) -> date:
    try:
        return date.fromisoformat(value)
    except (TypeError, ValueError):
        return default


def visible_tenants() -> dict[str, str]:
    """The caller's tenants as they are now, slug to tier: the run itself may have left one or
    changed its tier since the last case (the first 200: plenty to pick from)."""
    return {t["slug"]: t["tier"] for t in _get("/tenants/?page_size=200")["results"]}


def job(case, body: dict) -> None:
    """A job the tenant has an active grant for where one exists (else the answer is 409 no_quota,
    also right, but the submission path is the one worth fuzzing), on a partition it fits."""
    data, tiers = refs(), visible_tenants()
    if not tiers or not data["placements"]:
        return
    granted = {
        (q["tenant"], q["scenario"], q["gpu_model"])
        for q in _get("/quotas/?active=true&page_size=200")["results"]
        if q["tenant"] in tiers
    }
    choices = [
        (tenant, *placement)
        for tenant, scenario, gpu_model in sorted(granted)
        for placement in data["placements"]
        if placement[:2] == (scenario, gpu_model)
    ] or [(tenant, *placement) for tenant in sorted(tiers) for placement in data["placements"]]
    drawn = [body.get("tenant"), body.get("scenario"), body.get("gpu_model"), body.get("cluster")]
    body["tenant"], scenario, gpu_model, cluster, partition = pick(choices, drawn)
    nodes = 1 + (body.get("nodes", 1) - 1) % partition["nodes"]
    per_node = 1 + (body["gpus"] - 1) % partition["gpus_per_node"]
    cap = TIER_CAP[tiers[body["tenant"]]]
    body |= {
        "scenario": scenario,
        "gpu_model": gpu_model,
        "cluster": cluster,
        "partition": partition["name"],
        "nodes": nodes,
        "gpus": nodes * per_node,
        "walltime_minutes": min(body["walltime_minutes"], partition["max_walltime_minutes"]),
        "env": {f"FUZZ_{index}": value for index, value in enumerate(body.get("env", {}).values())},
        "script": JOB_SCRIPT,
    }
    if body.get("priority") and PRIORITIES.index(body["priority"]) > PRIORITIES.index(cap):
        body["priority"] = cap
    body.pop("template", None)
    body.pop("parameters", None)
    if body.get("restart_exit_codes") and not body.get("max_restarts", 3 if body.get("preemptible") else 0):
        body["max_restarts"] = 1  # exit codes restart only a job that may restart
    whole_devices(body)


def whole_devices(body: dict) -> None:
    """Whole devices: the stack's partitions and grants are in them, and a share's other fields
    belong to its kind alone (docs/api.md, Shares of a GPU)."""
    body["share"] = "whole"
    for name in ("mig_profile", "gpu_memory_mib", "gpu_cores_pct"):
        body.pop(name, None)


def quota_request(case, body: dict) -> None:
    data, tiers = refs(), visible_tenants()
    if not tiers or not data["pairs"]:
        return
    body["tenant"] = pick(sorted(tiers), body.get("tenant"))
    body["scenario"], body["gpu_model"] = pick(data["pairs"], [body.get("scenario"), body.get("gpu_model")])
    # Not in the past: tomorrow at the earliest, whatever the server's time zone makes today.
    tomorrow = date.today() + timedelta(days=1)
    starts = _date(body.get("starts_on"), tomorrow)
    body["ends_on"] = max(_date(body.get("ends_on"), starts), starts, tomorrow).isoformat()
    whole_devices(body)


def approval(case, body: dict) -> None:
    """Figures no higher than those asked for, and an end no earlier than the start."""
    try:
        asked = _get(f"/quota-requests/{case.path_parameters['id']}/")
    except OSError:  # 404 and the like: the API's answer to the case is what counts
        return
    if "gpus" in body:
        body["gpus"] = min(body["gpus"], asked["gpus"])
    if "gpu_hours" in body:
        body["gpu_hours"] = min(body["gpu_hours"], asked["gpu_hours"])
    if "ends_on" in body:
        starts, ends = date.fromisoformat(asked["starts_on"]), date.fromisoformat(asked["ends_on"])
        body["ends_on"] = min(max(_date(body["ends_on"], ends), starts), ends).isoformat()


def member(case, body: dict) -> None:
    body["username"] = pick(refs()["usernames"], body.get("username"))


def tenant(case, body: dict) -> None:
    """A fresh slug each time the case is sent (the same case may go out more than once)."""
    stem = _OURS.sub("", body["slug"])[:40].strip("-") or "t"
    body["slug"] = f"{FUZZ_TENANT_PREFIX}{os.getpid()}x{next(_serial)}-{stem}"
    if "owner" in body:
        body["owner"] = pick(refs()["usernames"], body["owner"])


def advice(case, body: dict) -> None:
    """The scenario whose advisor reads this body (the schema's oneOf); an MD run needs
    simulated_ns or days, one of them."""
    kind = "ai" if "params_b" in body else "md" if "atoms" in body else "cfd"
    slug = refs()["advisors"].get(kind)
    if slug:
        case.path_parameters["slug"] = slug
    if kind == "md":
        if "simulated_ns" in body:
            body.pop("days", None)
        elif "days" not in body:
            body["simulated_ns"] = 1.0


def token(case, body: dict) -> None:
    """The run's own login; `admin` scope only for staff (a token never exceeds its user)."""
    body |= refs()["login"]
    if body.get("scope") == "admin" and not refs()["staff"]:
        body["scope"] = "submit"


def group_mapping(case, body: dict) -> None:
    """A tenant that exists, and a group of its own each time the case is sent (a group mapped
    twice to one tenant is a 400 on `group`)."""
    tenants = sorted(visible_tenants())
    if tenants:
        body["tenant"] = pick(tenants, body.get("tenant"))
    if isinstance(body.get("group"), str):
        body["group"] = f"{body['group'].strip()[:60]}-{os.getpid()}x{next(_serial)}"


# Where a positive alert channel posts: loopback, which the contract stack allows
# (ALERT_WEBHOOK_ALLOW_LOOPBACK, scripts/contract); a robot's own host does not resolve here, and
# a channel's URL must resolve to a public address (monitoring/notify.py channel_url_problem).
CHANNEL_URL = "http://127.0.0.1:9/fuzz-channel"
CHANNEL_SECRET = secrets.token_urlsafe(16)  # one per run


def channel(case, body: dict) -> None:
    """A URL the kind may post to, a secret where a webhook must sign, and a name of its own each
    time the case is sent (a tenant's channel names are unique: a repeat is a 400 on `name`)."""
    if isinstance(body.get("name"), str):
        body["name"] = f"{body['name'][:60]}-{os.getpid()}x{next(_serial)}"
    if "url" in body or "kind" in body:
        body["url"] = CHANNEL_URL
    if body.get("kind") == "webhook" or ("secret" in body and not body["secret"]):
        body["secret"] = body.get("secret") or CHANNEL_SECRET


# Where a positive webhook endpoint posts: loopback, which the contract stack allows
# (WEBHOOK_ALLOWED_RANGES, scripts/contract); nothing listens there, so its deliveries fail.
WEBHOOK_URL = "http://127.0.0.1:9/fuzz-webhook"


def webhook(case, body: dict) -> None:
    if "url" in body:
        body["url"] = WEBHOOK_URL


# A cohort the fuzzer creates has this prefix and a serial, as its tenants do.
FUZZ_COHORT_PREFIX = "fuzz-pool-"


def cohort(case, body: dict) -> None:
    """A fresh slug each time, an existing GPU model, and a partition of that model or none."""
    stem = _OURS.sub("", body["slug"])[:30].strip("-") or "c"
    body["slug"] = f"{FUZZ_COHORT_PREFIX}{os.getpid()}x{next(_serial)}-{stem}"
    placements = refs()["placements"]
    if not placements:
        return
    _scenario, body["gpu_model"], _cluster, _partition = pick(placements, body.get("gpu_model"))
    _cohort_partition(body, body["gpu_model"])


def cohort_change(case, body: dict) -> None:
    """A partition of the cohort's own GPU model, or none; left as it is where the cohort has
    members, whose other cohorts a new partition could overlap (409, a right answer too)."""
    if "partition" not in body:
        return
    try:
        current = _get(f"/cohorts/{case.path_parameters['slug']}/")
    except urllib.error.HTTPError:
        return  # not the caller's to see: 404 before the body is read
    if current["members"]:
        body.pop("partition")
    else:
        _cohort_partition(body, current["gpu_model"])


def _cohort_partition(body: dict, gpu_model: str) -> None:
    partitions = [
        {"cluster": cluster, "name": partition["name"]}
        for _scenario, model, cluster, partition in refs()["placements"]
        if model == gpu_model
    ]
    if body.get("partition") is not None:
        body["partition"] = pick(partitions, body["partition"]) if partitions else None


def usage(case) -> None:
    """`from` no later than `to`, at most 366 days apart (`to` defaults to today; an empty
    parameter is an absent one)."""
    query = case.query
    if not query.get("from"):
        return  # `from` defaults to 29 days before `to`: always a valid range
    start = date.fromisoformat(query["from"])
    end = _date(query.get("to"), start + timedelta(days=30))
    end = min(max(end, start), start + timedelta(days=USAGE_MAX_DAYS), date(2999, 12, 31))
    query["to"] = end.isoformat()


# reports.serializers.TcoProfileIn: at most this many cloud prices (the schema does not say it).
CLOUD_PRICES_MAX = 20


def tco_profile(case, body: dict) -> None:
    """A place without a profile yet (a cluster without one, or the whole site while it has none;
    a PATCH keeps its place), an existing GPU model, and each cloud provider once."""
    if not refs()["platform_admin"]:
        return  # 403 before the body is read, and /tco/ is not the caller's to read
    if case.method == "PATCH":
        body.pop("cluster", None)
    else:
        profiles = _all("/tco/")
        taken = {profile["cluster"] for profile in profiles}
        free = [c["slug"] for c in _all("/clusters/") if c["slug"] not in taken]
        free += [None] if None not in taken else []
        if not free and profiles:  # every place has one (the run made them): free the oldest
            oldest = min(profiles, key=lambda profile: int(profile["id"]))
            _get(f"/tco/{oldest['id']}/", method="DELETE")
            free = [oldest["cluster"]]
        if free:
            body["cluster"] = pick(free, body.get("cluster"))
    models = sorted({model for _scenario, model in refs()["pairs"]})
    if "gpu_model" in body and models:
        body["gpu_model"] = pick(models, body["gpu_model"])
    if isinstance(body.get("cloud_prices"), list):
        body["cloud_prices"] = body["cloud_prices"][:CLOUD_PRICES_MAX]  # the serializer's max_length
        seen = set()
        for i, row in enumerate(body["cloud_prices"]):
            if isinstance(row, dict) and isinstance(row.get("provider"), str):
                while row["provider"] in seen:
                    row["provider"] = f"{row['provider'][:58]}-{i}"[:64]
                seen.add(row["provider"])


def statement(case, body: dict) -> None:
    """A tenant the caller sees and a month that has ended (one of the first months of 2000: the
    stack's tenants had no jobs then, so the statements are empty and cheap)."""
    tenants = sorted(visible_tenants())
    if tenants:
        body["tenant"] = pick(tenants, body.get("tenant"))
    body["month"] = f"2000-{pick(list(range(1, 13)), body.get('month')):02d}"


def budget(case, body: dict) -> None:
    """A monthly budget names no grant; one per grant names an active grant of the path's tenant
    (none: a monthly one instead). Never hard: a hard budget the run set would refuse the run's
    own positive job submissions (a right 409, but the submission path is the one worth fuzzing)."""
    if "hard" in body:
        body["hard"] = False
    if case.method == "PATCH":
        return
    slug = (case.path_parameters or {}).get("tenant_slug", "")
    grants = []
    if body.get("period") == "grant" and slug:
        try:
            grants = [
                str(g["id"]) for g in _get(f"/quotas/?tenant={slug}&active=true&page_size=200")["results"]
            ]
        except urllib.error.HTTPError:
            return  # not the caller's tenant: 404 before the body is read
    if grants:
        body["grant"] = pick(grants, body.get("grant"))
    else:
        body["period"], body["grant"] = "month", None


# GET operations whose `from` and `to` follow the rules of GET /usage/.
RANGES = {
    "GET /api/v1/usage/", "GET /api/v1/reports/site/", "GET /api/v1/reports/site/csv/",
    "GET /api/v1/reports/site/xlsx/",
}  # fmt: skip


BODIES = {
    "POST /api/v1/jobs/": job,
    "POST /api/v1/quota-requests/": quota_request,
    "POST /api/v1/quota-requests/{id}/approve/": approval,
    "POST /api/v1/tenants/{tenant_slug}/members/": member,
    "POST /api/v1/tenants/": tenant,
    "POST /api/v1/scenarios/{slug}/advise/": advice,
    "POST /api/v1/auth/token/": token,
    "POST /api/v1/tenants/{tenant_slug}/alert-channels/": channel,
    "PATCH /api/v1/tenants/{tenant_slug}/alert-channels/{id}/": channel,
    "POST /api/v1/group-mappings/": group_mapping,
    "POST /api/v1/tenants/{tenant_slug}/webhooks/": webhook,
    "PATCH /api/v1/tenants/{tenant_slug}/webhooks/{id}/": webhook,
    "POST /api/v1/cohorts/": cohort,
    "PATCH /api/v1/cohorts/{slug}/": cohort_change,
    "POST /api/v1/tco/": tco_profile,
    "PATCH /api/v1/tco/{id}/": tco_profile,
    "POST /api/v1/statements/": statement,
    "POST /api/v1/tenants/{tenant_slug}/budgets/": budget,
    "PATCH /api/v1/tenants/{tenant_slug}/budgets/{id}/": budget,
}


OWN_MEMBERSHIP = {
    "DELETE /api/v1/tenants/{tenant_slug}/members/{username}/",
    "PATCH /api/v1/tenants/{tenant_slug}/members/{username}/",
}


@schemathesis.hook
def before_call(context, case, kwargs):
    """Right before the request goes out, in every phase: the stateful phase merges values from
    earlier responses into a case after it was generated, so a generation hook comes too early."""
    label = case.operation.label
    own = (case.path_parameters or {}).get("username") == os.environ.get("FUZZ_USER")
    if label in OWN_MEMBERSHIP and own:
        # The run's own membership stays: the stateful phase follows the member list's links to
        # the caller itself, and a manager who removed or demoted themselves made every later
        # request of the run a 404 for their tenant (and the fuzzer call valid requests refused).
        case.path_parameters["username"] = f"fuzz-nobody-{os.getpid()}"
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive:
        return
    if label in RANGES and isinstance(case.query, dict):
        usage(case)
    elif label in BODIES and isinstance(case.body, dict):
        BODIES[label](case, case.body)
