"""Strict readers for settings from the environment.

A malformed value stops the start with a message that names the variable: a portal that
silently reads DEBUG=flase as True, or a timeout of "30s" as the default, is worse than one
that refuses to start. Every name read is recorded in READ, so a test can check that what
docker-compose.yml sets is something the portal reads.
"""

import os
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

READ: set[str] = set()

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _raw(name: str) -> str | None:
    READ.add(name)
    value = os.environ.get(name)
    return None if value is None or value.strip() == "" else value.strip()


def env_str(name: str, default: str = "") -> str:
    value = _raw(name)
    return default if value is None else value


def env_secret(name: str, default: str | None = None) -> str | None:
    """NAME, or the contents of the file that NAME_FILE points to (Docker and Kubernetes secrets)."""
    path = _raw(f"{name}_FILE")
    if path is not None:
        try:
            return Path(path).read_text().strip()
        except OSError as exc:
            raise ImproperlyConfigured(f"{name}_FILE={path!r} cannot be read: {exc.strerror}") from exc
    value = _raw(name)
    return default if value is None else value


def env_bool(name: str, default: bool) -> bool:
    value = _raw(name)
    if value is None:
        return default
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise ImproperlyConfigured(
        f"{name}={value!r} is not a boolean: use one of true/false, 1/0, yes/no, on/off"
    )


def env_int(name: str, default: int, *, minimum: int | None = None, maximum: int | None = None) -> int:
    value = _raw(name)
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={value!r} is not a whole number") from None
    if minimum is not None and number < minimum:
        raise ImproperlyConfigured(f"{name}={number} is below the minimum of {minimum}")
    if maximum is not None and number > maximum:
        raise ImproperlyConfigured(f"{name}={number} is above the maximum of {maximum}")
    return number


def env_list(name: str, default: list[str]) -> list[str]:
    value = _raw(name)
    if value is None:
        return list(default)
    return [item.strip() for item in value.split(",") if item.strip()]


def env_choice(name: str, default: str, choices: set[str]) -> str:
    value = env_str(name, default)
    if value not in choices:
        raise ImproperlyConfigured(f"{name}={value!r} is not one of {', '.join(sorted(choices))}")
    return value


_EMAIL_BACKENDS = {
    "smtp": "django.core.mail.backends.smtp.EmailBackend",
    "smtp+tls": "django.core.mail.backends.smtp.EmailBackend",
    "smtps": "django.core.mail.backends.smtp.EmailBackend",
    "console": "django.core.mail.backends.console.EmailBackend",
    "file": "django.core.mail.backends.filebased.EmailBackend",
    "locmem": "django.core.mail.backends.locmem.EmailBackend",
    "dummy": "django.core.mail.backends.dummy.EmailBackend",
}


def email_config(url: str) -> dict[str, object]:
    """Django's EMAIL_* settings from one URL: smtp://user:pass@host:587, smtp+tls://…,
    smtps://… (implicit TLS), console://, file:///var/mail, locmem://, dummy://.
    A ?from=portal@example.org query sets DEFAULT_FROM_EMAIL."""
    parts = urlsplit(url)
    if parts.scheme not in _EMAIL_BACKENDS:
        raise ImproperlyConfigured(
            f"EMAIL_URL scheme {parts.scheme!r} is not one of {', '.join(sorted(_EMAIL_BACKENDS))}"
        )
    config: dict[str, object] = {"EMAIL_BACKEND": _EMAIL_BACKENDS[parts.scheme]}
    if parts.scheme.startswith("smtp"):
        if not parts.hostname:
            raise ImproperlyConfigured("EMAIL_URL names no SMTP host")
        try:
            port = parts.port
        except ValueError:
            raise ImproperlyConfigured("EMAIL_URL has a port that is not a number") from None
        config |= {
            "EMAIL_HOST": parts.hostname,
            "EMAIL_PORT": port
            or (465 if parts.scheme == "smtps" else 587 if parts.scheme == "smtp+tls" else 25),
            "EMAIL_HOST_USER": unquote(parts.username or ""),
            "EMAIL_HOST_PASSWORD": unquote(parts.password or ""),
            "EMAIL_USE_TLS": parts.scheme == "smtp+tls",
            "EMAIL_USE_SSL": parts.scheme == "smtps",
        }
    if parts.scheme == "file":
        if not parts.path:
            raise ImproperlyConfigured("EMAIL_URL file:// needs a folder, e.g. file:///var/mail")
        config["EMAIL_FILE_PATH"] = parts.path
    sender = parse_qs(parts.query).get("from")
    if sender:
        config["DEFAULT_FROM_EMAIL"] = sender[0]
    return config
