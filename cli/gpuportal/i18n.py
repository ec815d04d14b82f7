"""Messages in English or Simplified Chinese, chosen by the locale.

The first of LANGUAGE, LC_ALL, LC_MESSAGES and LANG that is set decides (gettext's order): a value
starting with ``zh`` gives Chinese (the catalog ``locale/zh_Hans/LC_MESSAGES/gpuportal.mo``,
shipped in the package), anything else English. Click's own messages (usage, option errors,
help headings) go through the same catalog: ``translate_click`` points the ``_`` and ``ngettext``
names of click's modules at it.
"""

from __future__ import annotations

import gettext
import os
from collections.abc import Mapping
from pathlib import Path

DOMAIN = "gpuportal"
LOCALE_DIR = Path(__file__).resolve().parent / "locale"
CHINESE = "zh_Hans"
LOCALE_VARIABLES = ("LANGUAGE", "LC_ALL", "LC_MESSAGES", "LANG")


def language_of(environ: Mapping[str, str]) -> str:
    """`zh_Hans` or `en`, from the first locale variable that is set."""
    for name in LOCALE_VARIABLES:
        value = environ.get(name, "").strip()
        if value:
            return CHINESE if value.lower().startswith("zh") else "en"
    return "en"


LANGUAGE = language_of(os.environ)
_catalog: gettext.NullTranslations = (
    gettext.translation(DOMAIN, LOCALE_DIR, languages=[CHINESE], fallback=True)
    if LANGUAGE == CHINESE
    else gettext.NullTranslations()
)


def _(message: str) -> str:
    return _catalog.gettext(message)


def N_(message: str) -> str:
    """Marks a message for the catalog where it is defined; `_` translates it where it is shown."""
    return message


def ngettext(singular: str, plural: str, n: int) -> str:
    return _catalog.ngettext(singular, plural, n)


def translate_click() -> None:
    """Click's messages through this catalog (click calls gettext's global domain, which looks
    for a `zh_CN` folder that the package does not have)."""
    import click.core
    import click.decorators
    import click.exceptions
    import click.formatting
    import click.parser
    import click.shell_completion
    import click.termui
    import click.types
    import click.utils

    for module in (
        click.core,
        click.decorators,
        click.exceptions,
        click.formatting,
        click.parser,
        click.shell_completion,
        click.termui,
        click.types,
        click.utils,
    ):
        if hasattr(module, "_"):
            module._ = _
        if hasattr(module, "ngettext"):
            module.ngettext = ngettext
