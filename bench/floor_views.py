"""The floor: the least a Django view can do to answer phase a's and phase c's requests
(and `GET /api/v1/me/` and a submission, for bench/inprocess.py), to
measure beside the portal in the same run (bench/load.py, phases g and h). Not the portal: it is
served only by the bench's own gunicorn (settings bench.floor_settings), never by the portal's.

Each view does what the API's answer needs and nothing more: the token by its digest and its
active user (one query with the join), the user throttle's counter (one Redis round trip, the
portal's own), the job or the page by hand-written SQL scoped by the caller's view permission
in a subquery, the catalog names from the process and each job's answer from its row (the
portal's own catalog_names and job_answer), and json.dumps. No Django REST framework view, no
ORM query built per request, no FilterSet, no cursor pagination (the next page is the last id).
Its answers are JobOut's (times in UTC, the bench's time zone).

A submission's floor (`POST /api/v1/jobs/`) does what docs/architecture.md's flow of a job asks
of the request, each by one hand-written statement: the caller; everything the request reads
(its tenant scoped by the caller's submit permission, scenario, GPU model, partition and the
tenant's cluster account or the cluster's template for it) in one query; the Idempotency-Key's earlier job; then in one
transaction the reservation on the grant (one UPDATE that picks and locks it), the job, its
event and its audit record. It checks no field beyond what these need (the portal checks
every field, the env, the shape and the script), and answers 400 for any other input.

It is a yardstick, not a design: the portal's views also check platform admins, roles, the
query string's every field, idempotency and the answer's schema. The gap between this floor and
the portal is what those and the frameworks cost; the gap between this floor and slurmrestd is
what a Python process per request costs on this machine.
"""

from __future__ import annotations

import hashlib
import json
import time
from datetime import UTC
from decimal import ROUND_CEILING, Decimal
from urllib.parse import urlencode

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.db import connection, transaction
from django.http import HttpResponse
from django.urls import path
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from rest_framework.throttling import SimpleRateThrottle
from rest_framework.utils.encoders import JSONEncoder

from clusters.models import Cluster, GpuModel, Partition, Scenario
from clusters.selectors import catalog_names
from jobs.models import Job, JobEvent, JobState
from jobs.selectors import API_JOB_FIELDS
from jobs.serializers import job_answer
from portal.core.models import ApiToken, AuditEvent, token_digest
from portal.core.staff import is_platform_admin, staff_roles_of
from portal.core.throttles import window_count
from tenants.models import ClusterAccount, Membership, QuotaGrant, Tenant, TenantUserPermission
from tenants.roles import SUBMIT_JOB, VIEW

User = get_user_model()
JOB, TENANT, USER = Job._meta.db_table, Tenant._meta.db_table, User._meta.db_table
TOKEN, PERM = ApiToken._meta.db_table, TenantUserPermission._meta.db_table
MEMBER = Membership._meta.db_table

# Table names from the models' meta, values only as parameters: nothing a request sends is in the SQL.
SQL_TOKEN = (
    f"SELECT u.id FROM {TOKEN} t JOIN {USER} u ON u.id = t.user_id "  # noqa: S608
    "WHERE t.key_digest = %s AND t.expires > now() AND u.is_active"
)
COLUMNS = (  # jobs.selectors.API_JOB_FIELDS, in their order
    "j.id, t.slug, j.name, j.scenario_id, j.gpu_model_id, j.gpus, j.nodes, j.walltime_minutes, j.priority, "
    "j.state, j.reason, j.cluster_id, j.partition_id, j.backend_id, u.username, j.created, j.started_at, "
    "j.finished_at, j.exit_code, j.gpu_hours, j.reserved_gpu_hours"
)
FROM = (
    f"FROM {JOB} j JOIN {TENANT} t ON t.id = j.tenant_id LEFT JOIN {USER} u ON u.id = j.submitted_by_id "  # noqa: S608
    f"WHERE j.tenant_id IN (SELECT content_object_id FROM {PERM} WHERE user_id = %s AND permission_id = %s)"
)
SQL_JOB = f"SELECT {COLUMNS} {FROM} AND j.id = %s"
ME_FIELDS = ("id", "username", "email", "is_staff", "is_active", "is_superuser")
SQL_ME = f"SELECT {', '.join(ME_FIELDS)} FROM {USER} WHERE id = %s"  # noqa: S608
SQL_MY_TENANTS = (
    f"SELECT t.slug, t.name, m.role FROM {MEMBER} m JOIN {TENANT} t ON t.id = m.tenant_id "  # noqa: S608
    "WHERE m.user_id = %s ORDER BY t.slug"
)
SQL_PAGE = f"SELECT {COLUMNS} {FROM} AND t.slug = %s AND j.state IN ({{states}}) AND j.id < %s ORDER BY j.id DESC LIMIT %s"
_view_perm: list[int] = []
_submit_perm: list[int] = []

GRANT, ACCOUNT = QuotaGrant._meta.db_table, ClusterAccount._meta.db_table
SCENARIO, MODEL = Scenario._meta.db_table, GpuModel._meta.db_table
PARTITION, CLUSTER = Partition._meta.db_table, Cluster._meta.db_table
EVENT, AUDIT = JobEvent._meta.db_table, AuditEvent._meta.db_table
SQL_SUBMIT_READS = (
    f"SELECT t.id, t.slug, s.id, s.env, s.cpus_per_gpu, m.id, p.id, p.cluster_id, "  # noqa: S608
    "a.username, c.tenant_identity_template, "
    f"s.mem_per_gpu_mb FROM {TENANT} t JOIN {SCENARIO} s ON s.slug = %s JOIN {MODEL} m ON m.slug = %s "
    f"JOIN {CLUSTER} c ON c.slug = %s JOIN {PARTITION} p ON p.cluster_id = c.id AND p.name = %s "
    f"AND p.gpu_model_id = m.id LEFT JOIN {ACCOUNT} a ON a.tenant_id = t.id AND a.cluster_id = c.id "
    f"WHERE t.slug = %s AND t.state = 'active' "
    f"AND t.id IN (SELECT content_object_id FROM {PERM} WHERE user_id = %s AND permission_id = %s)"
)
SQL_EARLIER = f"SELECT id FROM {JOB} WHERE submitted_by_id = %s AND idempotency_key = %s LIMIT 1"  # noqa: S608
SQL_RESERVE = (
    f"UPDATE {GRANT} SET gpu_hours_reserved = gpu_hours_reserved + %s WHERE id = ("  # noqa: S608
    f"SELECT id FROM {GRANT} WHERE tenant_id = %s AND scenario_id = %s AND gpu_model_id = %s "
    "AND starts_on <= %s AND ends_on >= %s AND gpus >= %s "
    "AND gpu_hours - gpu_hours_used - gpu_hours_reserved >= %s "
    "ORDER BY ends_on, id LIMIT 1 FOR NO KEY UPDATE) RETURNING id"
)
JOB_COLUMNS = (
    *("token", "tenant_id", "submitted_by_id", "name", "scenario_id", "gpu_model_id", "grant_id"),
    *("cluster_id", "partition_id", "gpus", "nodes", "walltime_minutes", "priority", "cpus_per_gpu"),
    *("mem_per_gpu_mb", "env", "script", "template", "parameters", "state", "reason", "raw_state"),
    *("backend_id", "cluster_user", "node_list", "created", "reserved_gpu_hours", "holds_gpus"),
    *("dispatch_attempts", "idempotency_key", "request_digest"),
)
SQL_INSERT_JOB = (
    f"INSERT INTO {JOB} ({', '.join(JOB_COLUMNS)}) VALUES ({', '.join(['%s'] * len(JOB_COLUMNS))}) "  # noqa: S608
    "RETURNING id"
)
SQL_INSERT_EVENT = (
    f"INSERT INTO {EVENT} (job_id, at, from_state, to_state, reason, raw_state) "  # noqa: S608
    "VALUES (%s, %s, '', %s, 'submitted', '')"
)
SQL_INSERT_AUDIT = (
    f"INSERT INTO {AUDIT} (at, actor_id, actor_username, tenant_id, tenant_slug, action, "  # noqa: S608
    "target_type, target_id, data) VALUES (%s, %s, %s, %s, %s, 'job.submit', 'jobs.job', %s, %s)"
)


def _problem(status: int, code: str) -> HttpResponse:
    body = {"type": f"urn:gpu-portal:problem:{code}", "status": status, "code": code}
    return HttpResponse(json.dumps(body), status=status, content_type="application/problem+json")


def _caller(request, cursor) -> int | HttpResponse:
    """The caller's user id, counted by the user throttle; else the problem to answer."""
    parts = request.META.get("HTTP_AUTHORIZATION", "").split()
    if len(parts) != 2 or parts[0] != "Token":
        return _problem(401, "not_authenticated")
    cursor.execute(SQL_TOKEN, [token_digest(parts[1])])
    row = cursor.fetchone()
    if row is None:
        return _problem(401, "authentication_failed")
    allowed, window_s = SimpleRateThrottle.parse_rate(None, settings.API_THROTTLE_RATES["user"])
    window = int(time.time() // window_s)
    if window_count(f"throttle:floor:{row[0]}:{window_s}:{window}", window_s) > allowed:  # not the portal's
        return _problem(429, "throttled")
    if not _view_perm:
        _view_perm.append(Permission.objects.get(codename=VIEW, content_type__app_label="tenants").pk)
        _submit_perm.append(Permission.objects.get(codename=SUBMIT_JOB, content_type__app_label="tenants").pk)
    return row[0]


def _rows(fetched: list[tuple]) -> list[dict]:
    """COLUMNS are API_JOB_FIELDS in their order: rows as the portal's list reads them."""
    return [dict(zip(API_JOB_FIELDS, row, strict=True)) for row in fetched]


def _json(body: dict) -> HttpResponse:
    return HttpResponse(json.dumps(body, cls=JSONEncoder), content_type="application/json")  # DRF's: Decimals


def job(request, pk: int) -> HttpResponse:
    with connection.cursor() as cursor:
        user_id = _caller(request, cursor)
        if isinstance(user_id, HttpResponse):
            return user_id
        cursor.execute(SQL_JOB, [user_id, _view_perm[0], pk])
        found = _rows(cursor.fetchall())
    if not found:
        return _problem(404, "not_found")
    return _json(job_answer(found[0], catalog_names(found), UTC))


def jobs(request) -> HttpResponse:
    states = request.GET.getlist("state")
    try:
        size = min(200, max(1, int(request.GET.get("page_size", 50))))
        before = int(request.GET.get("before", 2**62))
    except ValueError:
        return _problem(400, "invalid")
    if not states or "tenant" not in request.GET:
        return _problem(400, "invalid")
    with connection.cursor() as cursor:
        user_id = _caller(request, cursor)
        if isinstance(user_id, HttpResponse):
            return user_id
        sql = SQL_PAGE.format(states=", ".join(["%s"] * len(states)))
        cursor.execute(sql, [user_id, _view_perm[0], request.GET["tenant"], *states, before, size + 1])
        rows = _rows(cursor.fetchall())
    page = rows[:size]
    names = catalog_names(page)
    more = None
    if len(rows) > size:
        query = {
            "tenant": request.GET["tenant"],
            "state": states,
            "page_size": size,
            "before": page[-1]["id"],
        }
        more = "?" + urlencode(query, doseq=True)
    return _json({"next": more, "previous": None, "results": [job_answer(row, names, UTC) for row in page]})


def me(request) -> HttpResponse:
    """GET /api/v1/me/: the user's row, its staff powers by the portal's own rules
    (portal.core.staff: none, without a query, for a caller who is not staff, as the bench's
    users are), its memberships by hand-written SQL."""
    with connection.cursor() as cursor:
        user_id = _caller(request, cursor)
        if isinstance(user_id, HttpResponse):
            return user_id
        cursor.execute(SQL_ME, [user_id])
        user = User.from_db(connection.alias, list(ME_FIELDS), cursor.fetchone())
        cursor.execute(SQL_MY_TENANTS, [user_id])
        tenants = [{"slug": slug, "name": name, "role": role} for slug, name, role in cursor.fetchall()]
    body = {"username": user.username, "email": user.email, "is_staff": user.is_staff}
    body |= {
        "platform_admin": is_platform_admin(user),
        "staff_roles": staff_roles_of(user),
        "tenants": tenants,
    }
    return _json(body)


def submit(request) -> HttpResponse:
    try:
        body = json.loads(request.body)
        tenant, gpus, minutes = body["tenant"], int(body["gpus"]), int(body["walltime_minutes"])
        picks = [body["scenario"], body["gpu_model"], body["cluster"], body["partition"], tenant]
        name, script = str(body["name"]), str(body["script"])
    except (ValueError, KeyError, TypeError):
        return _problem(400, "invalid")
    if not (1 <= gpus <= 64 and 1 <= minutes <= 10_080):
        return _problem(400, "invalid")
    key = request.headers.get("Idempotency-Key", "")
    with connection.cursor() as cursor:
        user_id = _caller(request, cursor)
        if isinstance(user_id, HttpResponse):
            return user_id
        cursor.execute(SQL_SUBMIT_READS, [*picks, user_id, _submit_perm[0]])
        found = cursor.fetchone()
        if found is None:
            return _problem(404, "not_found")
        tenant_id, slug, scenario_id, env, cpus, model_id, partition_id, cluster_id, own, template, mem = (
            found
        )
        account = own if own is not None else (template or "").format(tenant=slug)
        if key:
            cursor.execute(SQL_EARLIER, [user_id, key])
            if cursor.fetchone():
                return _problem(409, "conflict")  # the bench sends a new key each time
        hours = (Decimal(gpus * minutes) / 60).quantize(Decimal("0.01"), ROUND_CEILING)
        now, today = timezone.now(), timezone.localdate()
        digest = hashlib.sha256(request.body).hexdigest() if key else ""
        with transaction.atomic():
            cursor.execute(SQL_RESERVE, [hours, tenant_id, scenario_id, model_id, today, today, gpus, hours])
            grant = cursor.fetchone()
            if grant is None:
                return _problem(409, "quota_exhausted")
            # The scenario's env as PostgreSQL wrote it: Django's psycopg setup hands jsonb over as
            # its text (JSONField decodes it), which goes back into the job's jsonb as it is.
            token = hashlib.sha256(f"{user_id}:{now.timestamp()}:{key}".encode()).hexdigest()[:32]
            values = {
                "token": token, "tenant_id": tenant_id, "submitted_by_id": user_id, "name": name,
                "scenario_id": scenario_id, "gpu_model_id": model_id, "grant_id": grant[0],
                "cluster_id": cluster_id, "partition_id": partition_id, "gpus": gpus, "nodes": 1,
                "walltime_minutes": minutes, "priority": "normal", "cpus_per_gpu": cpus, "mem_per_gpu_mb": mem,
                "env": env if isinstance(env, str) else json.dumps(env), "script": script, "template": "",
                "parameters": "{}",
                "state": JobState.QUEUED, "reason": "", "raw_state": "", "backend_id": "",
                "cluster_user": account, "node_list": "", "created": now, "reserved_gpu_hours": hours,
                "holds_gpus": False, "dispatch_attempts": 0, "idempotency_key": key, "request_digest": digest,
            }  # fmt: skip
            cursor.execute(SQL_INSERT_JOB, [values[column] for column in JOB_COLUMNS])
            job_id = cursor.fetchone()[0]
            cursor.execute(SQL_INSERT_EVENT, [job_id, now, JobState.QUEUED])
            data = json.dumps(
                {"gpus": gpus, "gpu_model": body["gpu_model"], "gpu_hours_reserved": str(hours)}
            )
            cursor.execute(SQL_INSERT_AUDIT, [now, user_id, "", tenant_id, slug, str(job_id), data])
    row = {column: values.get(column) for column in API_JOB_FIELDS}
    row |= {"id": job_id, "tenant__slug": slug, "submitted_by__username": None}
    row |= {"started_at": None, "finished_at": None, "exit_code": None, "gpu_hours": None}
    answer = _json(job_answer(row, catalog_names([row]), UTC))
    answer.status_code = 201
    return answer


@csrf_exempt  # a token, not a session's cookie, as DRF's views for token authentication
def jobs_or_submit(request) -> HttpResponse:
    return submit(request) if request.method == "POST" else jobs(request)


urlpatterns = [
    path("api/v1/me/", me),
    path("api/v1/jobs/<int:pk>/", job),
    path("api/v1/jobs/", jobs_or_submit),
]
