"""Warnings that /readyz reports without failing: a part that works, but not as it should.

Apps register a provider in their AppConfig.ready(), so that the core imports none of them.
"""

import logging
from collections.abc import Callable

log = logging.getLogger(__name__)

_providers: list[Callable[[], list[str]]] = []


def readiness_warning_register(provider: Callable[[], list[str]]) -> None:
    """Add a provider of warning lines; each line must name no host, user, path or secret, since
    /readyz answers anyone."""
    if provider not in _providers:
        _providers.append(provider)


def readiness_warnings() -> list[str]:
    """Every provider's lines; a provider that fails is logged and left out, never a 500."""
    lines: list[str] = []
    for provider in _providers:
        try:
            lines += provider()
        except Exception as exc:  # a warning must never make readiness fail
            log.warning("readyz: warning provider %s failed: %s", provider.__name__, exc.__class__.__name__)
    return lines
