"""The repository explains itself: docs/api.md names every operation of the API's schema and no
other, docs/architecture.md's room table matches the tree, and no file points outside the
repository."""

import re
from pathlib import Path

from drf_spectacular.generators import SchemaGenerator

ROOT = Path(__file__).resolve().parents[1]
# `GET /api/v1/jobs/`, `GET|PATCH /tenants/{slug}/`: the API's prefix may be left out.
OPERATION = re.compile(r"`((?:GET|POST|PUT|PATCH|DELETE)(?:\|(?:GET|POST|PUT|PATCH|DELETE))*) (/[^`?\s]*)")
# Served beside the API and described in docs/api.md, but not operations of the schema itself.
NOT_IN_SCHEMA = {("GET", "/schema/"), ("GET", "/docs/"), ("GET", "/healthz"), ("GET", "/readyz")}


def _normal(path: str) -> str:
    path = path.removeprefix("/api/v1")
    return re.sub(r"\{[^}]+\}", "{}", path)


def test_api_md_names_every_operation_of_the_schema_and_no_other():
    text = (ROOT / "docs" / "api.md").read_text()
    documented = {
        (method, _normal(match[2]))
        for match in OPERATION.finditer(text)
        if not text[: match.start()].endswith("There is no ")  # "There is no `GET /audit/{id}/`"
        for method in match[1].split("|")
    }
    schema = SchemaGenerator().get_schema(request=None, public=True)
    served = {
        (method.upper(), _normal(path))
        for path, operations in schema["paths"].items()
        for method in operations
        if method in ("get", "post", "put", "patch", "delete")
    }
    assert served - documented == set(), "operations of the schema that docs/api.md does not name"
    assert documented - served - NOT_IN_SCHEMA == set(), "operations in docs/api.md that the API lacks"
