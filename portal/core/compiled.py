"""A query that every request makes, compiled to SQL once per thread and connection.

Django builds and compiles a QuerySet anew on every call. For the few queries that every API
request makes (its token, its permissions), that Python cost was two to four times what
PostgreSQL took to answer them: 0.6 ms of the token's 0.8 ms, most of the permissions' 0.7 ms
(docs/performance.md). A CompiledQuery keeps the SQL that the ORM wrote for a values_list()
query and runs it with each call's values, converted by the same compiler's converters, so
what it returns is what the QuerySet itself would return. Which queries should be one:
docs/architecture/performance-layer.md.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.models import QuerySet


class CompiledQuery:
    """`build(*values)` returns a values_list() QuerySet; rows(*values) runs its SQL, compiled
    once per database connection, with these values in place of `probe`'s.

    Each probe value stands for one parameter: it must appear exactly once among the compiled
    query's parameters (the compile fails otherwise), so choose values that no constant of the
    query equals. The query's shape must not depend on the values (a None, an empty list).
    Probes and values are ints and strings: they go to the database as they are, without the
    field's conversion that a date, a Decimal or a model instance would need."""

    def __init__(self, build: Callable[..., QuerySet], *probe) -> None:
        if not all(type(value) in (int, str) for value in probe):
            raise TypeError("probe values must be ints or strings")
        self.build, self.probe = build, probe
        self._local = threading.local()

    def _compile(self, using: str) -> tuple:
        connection = connections[using]
        compiler = self.build(*self.probe).query.get_compiler(using=using)
        sql, params = compiler.as_sql()
        positions = []
        for value in self.probe:
            found = [i for i, param in enumerate(params) if type(param) is type(value) and param == value]
            if len(found) != 1:
                raise ValueError(f"probe value {value!r} is {len(found)} of the query's parameters, not one")
            positions.append(found[0])
        # The columns' converters, found once: results_iter would look them up on every call
        # (a fifth of the query's Python cost). No composite fields in a values_list() of columns.
        fields = [column[0] for column in compiler.select[0 : compiler.col_count]]
        converters = compiler.get_converters(fields)
        compiled = (connection, compiler, sql, list(params), positions, converters)
        self._compiled()[using] = compiled
        return compiled

    def _compiled(self) -> dict[str, tuple]:
        """This thread's compiled queries by database alias: a thread has its own connections."""
        if not hasattr(self._local, "by_alias"):
            self._local.by_alias = {}
        return self._local.by_alias

    def rows(self, *values, using: str = DEFAULT_DB_ALIAS) -> list[tuple]:
        compiled = self._compiled().get(using)
        # A compiler keeps the connection it was made with; a new one (tests swap them) recompiles.
        if compiled is None or compiled[0] is not connections[using]:
            compiled = self._compile(using)
        connection, compiler, sql, params, positions, converters = compiled
        bound = list(params)
        for position, value in zip(positions, values, strict=True):
            bound[position] = value
        with connection.cursor() as cursor:
            cursor.execute(sql, bound)
            fetched = cursor.fetchall()
        if not converters:
            return fetched
        return [tuple(row) for row in compiler.apply_converters(fetched, converters)]
