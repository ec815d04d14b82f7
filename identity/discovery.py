"""The OpenID provider's endpoints, from its discovery document (OpenID Connect Discovery 1.0),
read at first use and kept for the process's life: settings name the issuer only, and the
portal starts whether or not the provider answers then."""

import threading

import requests
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.functional import lazy

_lock = threading.Lock()
_documents: dict[str, dict] = {}


def discovered(issuer: str) -> dict:
    with _lock:
        if issuer not in _documents:
            url = f"{issuer}/.well-known/openid-configuration"
            response = requests.get(url, timeout=settings.OIDC_TIMEOUT)
            response.raise_for_status()
            document = response.json()
            if document.get("issuer", "").rstrip("/") != issuer:
                raise ImproperlyConfigured(f"{url} names another issuer: {document.get('issuer')!r}")
            _documents[issuer] = document
        return _documents[issuer]


def forget() -> None:
    """Read the documents again at next use (a test's new provider, a provider's new endpoints)."""
    with _lock:
        _documents.clear()


def _endpoint(name: str) -> str:
    value = discovered(settings.OIDC_ISSUER).get(name)
    if not value:
        raise ImproperlyConfigured(f"The provider {settings.OIDC_ISSUER} names no {name}")
    return value


# A setting's value that becomes the URL when first used as a string (mozilla-django-oidc reads
# its OIDC_OP_* settings per request).
endpoint = lazy(_endpoint, str)
