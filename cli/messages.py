"""The CLI's message catalog: `python cli/messages.py` updates
`gpuportal/locale/zh_Hans/LC_MESSAGES/gpuportal.po` with every message of the package (the
strings in `_()`, `N_()` and `ngettext()` calls) and of click (its usage and error texts, which
the CLI routes through the same catalog), keeping the translations it has, then compiles the
`.mo` next to it with polib. `--check` changes nothing and exits 1 if a message is missing or
untranslated, or if the `.mo` does not hold what the `.po` says (tests/cli/test_cli_i18n.py).

Needs polib (installed with the dev tools, not with the CLI).
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

import polib

HERE = Path(__file__).resolve().parent
PACKAGE = HERE / "gpuportal"
CATALOG = PACKAGE / "locale" / "zh_Hans" / "LC_MESSAGES"
PO, MO = CATALOG / "gpuportal.po", CATALOG / "gpuportal.mo"
CLICK_MODULES = (
    "core",
    "decorators",
    "exceptions",
    "formatting",
    "parser",
    "shell_completion",
    "termui",
    "types",
    "utils",
)
# Click's messages that reach `_()` through a variable: `_(extra["required"])` in Option's help.
CLICK_INDIRECT = {("required", None): "click/core.py:0"}
HEADER = {
    "Project-Id-Version": "gpuportal",
    "Language": "zh_Hans",
    "MIME-Version": "1.0",
    "Content-Type": "text/plain; charset=UTF-8",
    "Content-Transfer-Encoding": "8bit",
    "Plural-Forms": "nplurals=1; plural=0;",
}


def messages_of(path: Path, where: str) -> dict[tuple[str, str | None], str]:
    """(msgid, msgid_plural) → where it is used, for each literal message of a source file."""
    found: dict[tuple[str, str | None], str] = {}
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
            continue
        args = node.args
        literal = [isinstance(a, ast.Constant) and isinstance(a.value, str) for a in args]
        if node.func.id in ("_", "N_") and args and literal[0]:
            found.setdefault((args[0].value, None), f"{where}:{node.lineno}")
        elif node.func.id == "ngettext" and len(args) >= 2 and literal[0] and literal[1]:
            found.setdefault((args[0].value, args[1].value), f"{where}:{node.lineno}")
    found.pop(("", None), None)
    return found


def all_messages() -> dict[tuple[str, str | None], str]:
    import click

    found: dict[tuple[str, str | None], str] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        found.update(messages_of(path, f"gpuportal/{path.relative_to(PACKAGE).as_posix()}"))
    click_dir = Path(click.__file__).parent
    found.update(CLICK_INDIRECT)
    for name in CLICK_MODULES:
        for key, where in messages_of(click_dir / f"{name}.py", f"click/{name}.py").items():
            found.setdefault(key, where)
    return found


def load_po() -> polib.POFile:
    if PO.exists():
        return polib.pofile(str(PO), wrapwidth=0)
    po = polib.POFile(wrapwidth=0)
    po.metadata = dict(HEADER)
    return po


def problems(po: polib.POFile, wanted: dict[tuple[str, str | None], str]) -> list[str]:
    found = []
    have = {(e.msgid, e.msgid_plural or None): e for e in po if not e.obsolete}
    for key, where in sorted(wanted.items(), key=lambda kv: kv[1]):
        entry = have.get(key)
        if entry is None:
            found.append(f"missing: {key[0]!r} ({where})")
        elif not (entry.msgstr or any(entry.msgstr_plural.values())) or entry.fuzzy:
            found.append(f"untranslated: {key[0]!r} ({where})")
    return found


def mo_matches(po: polib.POFile) -> bool:
    if not MO.exists():
        return False
    mo = polib.mofile(str(MO))
    compiled = {
        (e.msgid, e.msgid_plural or None): (e.msgstr, tuple(sorted(e.msgstr_plural.items()))) for e in mo
    }
    for entry in po.translated_entries():
        key = (entry.msgid, entry.msgid_plural or None)
        if compiled.get(key) != (entry.msgstr, tuple(sorted(entry.msgstr_plural.items()))):
            return False
    return True


def update() -> int:
    wanted = all_messages()
    po = load_po()
    have = {(e.msgid, e.msgid_plural or None): e for e in po}
    for key, where in wanted.items():
        entry = have.get(key)
        if entry is None:
            entry = polib.POEntry(msgid=key[0], msgid_plural=key[1] or "", msgstr="")
            if key[1]:
                entry.msgstr_plural = {0: ""}
            po.append(entry)
        entry.occurrences = [tuple(where.rsplit(":", 1))]
        entry.obsolete = False
    for entry in [e for e in po if (e.msgid, e.msgid_plural or None) not in wanted]:
        po.remove(entry)  # a message no longer used (its translation goes with it)
    po.sort(key=lambda e: (e.occurrences[0] if e.occurrences else ("~", "0"), e.msgid))
    CATALOG.mkdir(parents=True, exist_ok=True)
    po.save(str(PO))
    po.save_as_mofile(str(MO))
    missing = problems(po, wanted)
    for line in missing:
        print(line, file=sys.stderr)
    print(f"{PO.relative_to(HERE)}: {len(wanted)} messages, {len(missing)} to translate; {MO.name} compiled")
    return 0


def check() -> int:
    po = load_po()
    found = problems(po, all_messages())
    if not mo_matches(po):
        found.append(f"{MO.name} is not compiled from {PO.name}: run python cli/messages.py")
    for line in found:
        print(line, file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 on a gap")
    sys.exit(check() if parser.parse_args().check else update())
