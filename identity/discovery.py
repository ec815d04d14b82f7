"""The OpenID provider's endpoints, from its discovery document (OpenID Connect Discovery 1.0),
read at first use and kept for the process's life: settings name the issuer only, and the
portal starts whether or not the provider answers then. A failed read is remembered for
FAILURE_HOLD_S, so that an outage costs each request nothing, not a timeout each."""

import threading
import time

import requests
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.functional import lazy

FAILURE_HOLD_S = 30.0

_lock = threading.Lock()
_documents: dict[str, dict] = {}
_failures: dict[str, tuple[float, str]] = {}


def _fetch(issuer: str) -> dict:
    url = f"{issuer}/.well-known/openid-configuration"
    response = requests.get(url, timeout=settings.OIDC_TIMEOUT)
    response.raise_for_status()
    document = response.json()
    named = document.get("issuer") if isinstance(document, dict) else None
    if not isinstance(named, str) or named.rstrip("/") != issuer:
        raise ImproperlyConfigured(f"{url} names another issuer: {named!r}")
    return document


def discovered(issuer: str) -> dict:
    """The document of `issuer` (its `issuer` as the provider writes it, trailing slash and all)."""
    with _lock:
        if issuer in _documents:
            return _documents[issuer]
        failed = _failures.get(issuer)
        if failed and time.monotonic() - failed[0] < FAILURE_HOLD_S:
            raise ImproperlyConfigured(f"The provider's discovery document could not be read: {failed[1]}")
    try:  # outside the lock: a slow provider holds up no other thread's read of a known document
        document = _fetch(issuer)
    except (requests.RequestException, ValueError, ImproperlyConfigured) as exc:
        with _lock:
            _failures[issuer] = (time.monotonic(), type(exc).__name__)
        raise ImproperlyConfigured(f"The provider's discovery document could not be read: {exc}") from exc
    with _lock:
        _failures.pop(issuer, None)
        return _documents.setdefault(issuer, document)


def forget() -> None:
    """Read the documents again at next use (a test's new provider, a provider's new endpoints)."""
    with _lock:
        _documents.clear()
        _failures.clear()


def _endpoint(name: str) -> str:
    value = discovered(settings.OIDC_ISSUER).get(name)
    if not isinstance(value, str) or not value:
        raise ImproperlyConfigured(f"The provider {settings.OIDC_ISSUER} names no {name}")
    return value


# A setting's value that becomes the URL when first used as a string (mozilla-django-oidc reads
# its OIDC_OP_* settings per request).
endpoint = lazy(_endpoint, str)
