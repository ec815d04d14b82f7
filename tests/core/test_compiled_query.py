"""portal.core.compiled.CompiledQuery: the SQL compiled once answers what the QuerySet answers,
converted as the ORM converts it, for any values; a probe that does not stand for exactly one
parameter is refused; a thread with its own connection compiles its own."""

import threading
from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from jobs.models import Job
from portal.core.auth import token_and_user
from portal.core.compiled import CompiledQuery
from portal.core.models import ApiToken
from portal.core.tokens import token_create

pytestmark = pytest.mark.django_db(transaction=True)  # a second thread reads what this one wrote

FIELDS = ("id", "name", "state", "created", "finished_at", "gpu_hours", "parameters", "tenant__slug")


class Counted:
    """A build function that counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, tenant_id, state):
        self.calls += 1
        return Job.objects.filter(tenant_id=tenant_id, state=state).order_by("id").values_list(*FIELDS)


@pytest.fixture
def jobs(owner, make_job):
    made = [make_job(owner, state=state) for state in ("COMPLETED", "COMPLETED", "FAILED")]
    made[0].finished_at, made[0].gpu_hours = timezone.now() - timedelta(hours=1), Decimal("1.2345")
    made[0].parameters = {"steps": 10}
    made[0].save()
    return made


def test_rows_are_the_querysets_own_for_every_value(jobs):
    build = Counted()
    query = CompiledQuery(build, -1, "probe:state")
    tenant_id = jobs[0].tenant_id
    for state in ("COMPLETED", "FAILED", "RUNNING"):
        expected = list(build(tenant_id, state))
        assert query.rows(tenant_id, state) == expected
    assert len(query.rows(tenant_id, "COMPLETED")) == 2
    finished = query.rows(tenant_id, "COMPLETED")[0]
    # converted as the ORM converts: an aware datetime, a Decimal and JSON decoded (by the field's
    # from_db_value, on PostgreSQL too), on SQLite as on PostgreSQL
    assert finished[4].tzinfo is not None and finished[5] == Decimal("1.2345")
    assert finished[6] == {"steps": 10}
    assert build.calls == 3 + 1  # three QuerySets above, one compile for every call of rows()


def test_each_call_is_one_query(jobs):
    query = CompiledQuery(Counted(), -1, "probe:state")
    query.rows(jobs[0].tenant_id, "FAILED")
    with CaptureQueriesContext(connection) as queries:
        query.rows(jobs[0].tenant_id, "COMPLETED")
    assert len(queries) == 1


@pytest.mark.parametrize(
    ("probe", "why"),
    [
        ((-1, "COMPLETED"), "is 0 of"),  # a probe the query never binds: a string that is no parameter
        ((-1, -1), "is 2 of"),  # the same value twice: which parameter is which?
    ],
)
def test_a_probe_that_is_not_exactly_one_parameter_is_refused(db, probe, why):
    def build(tenant_id, other):
        if other == "COMPLETED":  # the probe value vanishes from the parameters
            return Job.objects.filter(tenant_id=tenant_id).values_list("id")
        return Job.objects.filter(tenant_id=tenant_id, id=other).values_list("id")

    with pytest.raises(ValueError, match=why):
        CompiledQuery(build, *probe).rows(1, 2)


def test_a_probe_equal_to_a_constant_of_the_query_is_refused(db):
    query = CompiledQuery(lambda state: Job.objects.filter(state=state, reason="x").values_list("id"), "x")
    with pytest.raises(ValueError, match="is 2 of"):
        query.rows("RUNNING")


def test_only_ints_and_strings_stand_for_parameters(db):
    with pytest.raises(TypeError):
        CompiledQuery(lambda hours: Job.objects.filter(gpu_hours=hours).values_list("id"), Decimal("1.5"))


def test_a_wrong_number_of_values_is_refused(jobs):
    with pytest.raises(ValueError):
        CompiledQuery(Counted(), -1, "probe:state").rows(jobs[0].tenant_id)


def test_another_thread_compiles_for_its_own_connection(jobs):
    build = Counted()
    query = CompiledQuery(build, -1, "probe:state")
    here = query.rows(jobs[0].tenant_id, "COMPLETED")
    there = []

    def read():
        try:
            there.append(query.rows(jobs[0].tenant_id, "COMPLETED"))
        finally:
            connection.close()

    thread = threading.Thread(target=read)
    thread.start()
    thread.join(timeout=30)
    assert there == [here]
    assert build.calls == 2


def test_a_token_finds_its_whole_user_and_loads_the_rest_when_read(member):
    key = token_create(user=member, name="ci")[1]
    token, user = token_and_user(key)
    assert (user.pk, user.username, user.is_active, user.email) == (
        member.pk,
        member.username,
        True,
        member.email,
    )
    assert token.user is user and token.pk == ApiToken.objects.get(user=member, name="ci").pk
    with CaptureQueriesContext(connection) as queries:
        assert token.name == "ci"  # not read with the token: loaded now
    assert len(queries) == 1
    assert token_and_user(key + "x") is None


def test_object_by_slug_is_the_orms_object_field_for_field(catalog):
    from clusters.models import Scenario
    from portal.core.serializers import object_by_slug

    declared = Scenario.objects.all()
    scenario, _ = catalog
    found = object_by_slug(declared, scenario.slug)
    expected = Scenario.objects.get(slug=scenario.slug)
    assert found is not None and not found._state.adding
    fields = [f.attname for f in Scenario._meta.concrete_fields]
    assert [getattr(found, f) for f in fields] == [getattr(expected, f) for f in fields]
    assert object_by_slug(declared, "no-such-scenario") is None
    with CaptureQueriesContext(connection) as queries:
        object_by_slug(declared, scenario.slug)
    assert len(queries) == 1


def test_a_body_field_compiles_its_lookup_once_whatever_drf_copies(
    client_for, member, grant, local_partition
):
    """DRF copies a field's queryset for every serializer it makes: the compiled lookups are
    keyed by where the field is declared, so they neither recompile nor pile up per request."""
    from portal.core import serializers as core
    from tests.jobs_support import JOB

    api = client_for(member)
    assert api.post("/api/v1/jobs/", JOB | {"name": "first"}, format="json").status_code == 201
    kept = len(core.SLUG_LOOKUPS)
    compiles: list[str] = []
    original = CompiledQuery._compile
    CompiledQuery._compile = lambda self, using: (compiles.append(using), original(self, using))[1]
    try:
        for n in range(3):
            assert api.post("/api/v1/jobs/", JOB | {"name": f"again-{n}"}, format="json").status_code == 201
    finally:
        CompiledQuery._compile = original
    assert len(core.SLUG_LOOKUPS) == kept and compiles == []
