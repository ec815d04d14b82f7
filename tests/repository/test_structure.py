"""The structure docs/architecture.md describes, held: imports point one way (no module of
portal/core imports an app, clusters imports neither tenants nor jobs, tenants does not import
billing or jobs, billing does not import jobs, nothing imports reports, no app below monitoring
imports it), jobs/services has no cycle and admission sits at its
bottom (on lending, which stands on common alone), and no module uses another module's
underscore name."""

import ast
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
APPS = ("portal", "clusters", "tenants", "billing", "jobs", "reports", "monitoring", "identity", "webhooks")
CODE = (*APPS, "bench", "scripts", "tests")


def _modules(top: str) -> dict[str, Path]:
    """Dotted module name → file, migrations left out (Django writes them)."""
    found = {}
    for path in sorted((ROOT / top).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if "migrations" in parts:
            continue
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


@cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _imports(path: Path) -> set[str]:
    """Every module the file imports, at the top or inside a function (absolute imports only:
    the code base uses no other)."""
    names = set()
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def _importers(top: str, forbidden: tuple[str, ...]) -> dict[str, list[str]]:
    return {
        module: sorted(name for name in _imports(path) if name.split(".")[0] in forbidden)
        for module, path in _modules(top).items()
        if any(name.split(".")[0] in forbidden for name in _imports(path))
    }


def test_portal_core_imports_no_app():
    core = {m: p for m, p in _modules("portal").items() if m.startswith("portal.core")}
    offenders = {
        module: sorted(n for n in _imports(path) if n.split(".")[0] in APPS[1:])
        for module, path in core.items()
    }
    assert {module: names for module, names in offenders.items() if names} == {}


@pytest.mark.parametrize(
    ("app", "above"),
    [
        ("clusters", ("tenants", "billing", "jobs", "reports", "monitoring", "identity", "webhooks")),
        ("tenants", ("billing", "jobs", "reports", "monitoring", "identity", "webhooks")),
        ("billing", ("jobs", "reports", "monitoring", "identity", "webhooks")),
        ("jobs", ("reports", "monitoring", "identity", "webhooks")),
        ("reports", ("monitoring", "identity", "webhooks")),
        ("monitoring", ("reports", "identity", "webhooks")),
        ("identity", ("billing", "jobs", "reports", "monitoring", "webhooks")),
        ("webhooks", ("identity", "reports")),
    ],
)
def test_an_app_imports_no_app_above_it(app, above):
    assert _importers(app, above) == {}


SERVICES = "jobs.services"


def _service_graph() -> dict[str, set[str]]:
    modules = {m: p for m, p in _modules("jobs").items() if m.startswith(SERVICES + ".")}
    return {
        module: {name for name in _imports(path) if name in modules and name != module}
        for module, path in modules.items()
    }


def test_jobs_services_have_no_cycle_and_admission_sits_at_the_bottom():
    graph = _service_graph()
    order, done, stack = [], set(), set()

    def visit(module: str) -> None:
        assert module not in stack, f"an import cycle through {module}"
        if module in done:
            return
        stack.add(module)
        for name in sorted(graph[module]):
            visit(name)
        stack.discard(module)
        done.add(module)
        order.append(module)

    for module in sorted(graph):
        visit(module)
    assert graph[f"{SERVICES}.admission"] <= {f"{SERVICES}.common", f"{SERVICES}.lending"}
    assert graph[f"{SERVICES}.lending"] <= {f"{SERVICES}.common"}
    assert graph[f"{SERVICES}.common"] == set()
    importers_of_submit = sorted(m for m, names in graph.items() if f"{SERVICES}.submit" in names)
    assert importers_of_submit == []


def _underscore_uses(path: Path) -> list[str]:
    """`from x import _name`, and `x._name` where x is a module of this repository."""
    tree, modules, uses = _tree(path), {}, []
    ours = {name for top in CODE for name in _modules(top)}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    uses.append(f"{node.module}.{alias.name}")
                if f"{node.module}.{alias.name}" in ours:
                    modules[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            modules |= {
                alias.asname: alias.name for alias in node.names if alias.asname and alias.name in ours
            }
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in modules
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ):
            uses.append(f"{modules[node.value.id]}.{node.attr}")
    return uses


def test_no_module_uses_another_modules_underscore_name():
    found = {
        str(path.relative_to(ROOT)): uses
        for top in CODE
        for path in _modules(top).values()
        if (uses := _underscore_uses(path))
    }
    assert found == {}


def test_docs_say_what_each_of_jobs_services_stands_on():
    """docs/architecture.md's table of jobs/services names, for each module, exactly the
    modules of jobs/services it imports."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    rows = re.findall(r"^\| `jobs/services/(\w+)\.py` \| [^|]+ \| ([^|]+) \|$", text, flags=re.MULTILINE)
    documented = {
        f"{SERVICES}.{module}": {
            f"{SERVICES}.{name.strip()}" for name in stands_on.split(",") if name.strip() != "—"
        }
        for module, stands_on in rows
    }
    graph = {module: names for module, names in _service_graph().items() if module != SERVICES}
    assert documented == graph
