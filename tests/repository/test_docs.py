"""The repository explains itself: docs/api.md names every operation of the API's schema and no
other, docs/architecture.md's room table matches the tree, and no file points outside the
repository."""

import re
import subprocess
from pathlib import Path

from drf_spectacular.generators import SchemaGenerator

ROOT = Path(__file__).resolve().parents[2]
# `GET /api/v1/jobs/`, `GET|PATCH /tenants/{slug}/`: the API's prefix may be left out.
OPERATION = re.compile(r"`((?:GET|POST|PUT|PATCH|DELETE)(?:\|(?:GET|POST|PUT|PATCH|DELETE))*) (/[^`?\s]*)")
# Served beside the API and described in docs/api.md, but not operations of the schema itself.
NOT_IN_SCHEMA = {
    *(("GET", "/schema/"), ("GET", "/docs/"), ("GET", "/healthz"), ("GET", "/readyz")),
    *(("GET", "/metrics"), ("POST", "/hooks/alertmanager")),
}


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


# The directories whose every module and package has its own row in docs/architecture.md.
ROOMS = (
    "portal",
    "portal/core",
    "clusters",
    "clusters/backends",
    "tenants",
    "billing",
    "jobs",
    "jobs/services",
    "reports",
    "monitoring",
    "identity",
)
SKIPPED = {"__init__.py", "migrations", "__pycache__"}


def _rooms_in_tree() -> set[str]:
    rooms = set()
    for directory in ROOMS:
        for entry in (ROOT / directory).iterdir():
            if entry.name in SKIPPED:
                continue
            if entry.suffix == ".py":
                rooms.add(f"{directory}/{entry.name}")
            elif entry.is_dir() and (entry / "__init__.py").exists():
                rooms.add(f"{directory}/{entry.name}/")
    return rooms


def test_architecture_md_has_a_row_for_every_room_of_the_tree_and_no_other():
    text = (ROOT / "docs" / "architecture.md").read_text()
    # a row's first cell is a path (it has a slash): `jobs/services/admission.py`, `clusters/advisor/`
    rows = set(re.findall(r"^\| `([a-z_]+/[a-z_/]*(?:\.py)?)` \|", text, flags=re.MULTILINE))
    assert _rooms_in_tree() - rows == set(), "rooms of the tree that docs/architecture.md does not list"
    assert {row for row in rows if not (ROOT / row).exists()} == set(), "rows for rooms that do not exist"


def test_no_file_of_the_repository_points_outside_it():
    tracked = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, text=True
    ).stdout.split("\0")
    outside = re.compile(r"\.\./shared|(?<![\w/])shared/fixtures|\bDESIGN\.md|(?<![\w/])API\.md|\bSTYLE\.md")
    pointing = []
    for name in filter(None, tracked):
        path = ROOT / name
        if path == Path(__file__):
            continue  # it spells the patterns
        if path.suffix in {".png", ".ico", ".mo", ".map"} or not path.is_file() or "vendor" in path.parts:
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        pointing += [f"{name}: {match[0]}" for match in outside.finditer(text)]
    assert pointing == []
