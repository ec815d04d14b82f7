"""Bulk writes for the seed: COPY into a model's table, ids from the table's own sequence.

PostgreSQL only (the caller checks): COPY is what makes 600,000 rows take seconds, not minutes.
"""

import itertools
from collections.abc import Iterable, Iterator

from django.db import connection
from django.db.models import Model
from psycopg import sql


class SeedError(Exception):
    """Why the site cannot be seeded as asked; the command shows the message."""


def copy_rows(model: type[Model], fields: list[str], rows: Iterable[tuple]) -> int:
    """COPY rows (values in the order of `fields`) into the model's table; returns how many.
    Every column that needs a value must be named: COPY applies none of Django's Python-side
    defaults, so a field added to the model later fails here, by name, not as a NULL."""
    meta = model._meta
    columns = [meta.get_field(name).column for name in fields]
    missing = [
        f.name
        for f in meta.concrete_fields
        if f.column not in columns and not f.null and not f.primary_key and not f.has_db_default()
    ]
    if missing:
        raise SeedError(f"{meta.label} has fields the seed does not fill: {', '.join(missing)}")
    statement = sql.SQL("COPY {} ({}) FROM STDIN").format(
        sql.Identifier(meta.db_table), sql.SQL(", ").join(map(sql.Identifier, columns))
    )
    written = 0
    with connection.cursor() as cursor, cursor.cursor.copy(statement) as copy:
        for row in rows:
            copy.write_row(row)
            written += 1
    return written


def copy_dicts(model: type[Model], rows: Iterator[dict]) -> int:
    """copy_rows for rows built as dicts keyed by field name, each with the same keys in the
    same order (one dict literal): the names stay next to the values they name."""
    first = next(rows, None)
    if first is None:
        return 0
    return copy_rows(model, list(first), (tuple(row.values()) for row in itertools.chain([first], rows)))


def reserve_ids(model: type[Model], n: int) -> list[int]:
    """n ids from the table's own sequence, ascending: rows written with them never collide
    with rows the portal inserts later, nor with another writer's."""
    if n <= 0:
        return []
    meta = model._meta
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT nextval(pg_get_serial_sequence(%s, %s)) FROM generate_series(1, %s)",
            [meta.db_table, meta.pk.column, n],
        )
        return sorted(row[0] for row in cursor.fetchall())


def analyze(models: list[type[Model]]) -> None:
    """Fresh planner statistics for the tables the seed filled. Until autovacuum gets to them,
    the planner takes 100,000 jobs for a few hundred, and a staff listing of COMPLETED jobs
    sorted 130 MB on disk (570 ms) instead of walking the primary key (17 ms)."""
    tables = sql.SQL(", ").join(sql.Identifier(model._meta.db_table) for model in models)
    with connection.cursor() as cursor:
        cursor.execute(sql.SQL("ANALYZE {}").format(tables))
