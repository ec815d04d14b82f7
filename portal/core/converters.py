"""URL converters of the pages: each takes only what could name an object, so that any other
value is a 404 from the URL resolver, before a view or PostgreSQL sees it (a 30-digit id is out
of bigint's range, a NUL byte is refused by PostgreSQL: either would otherwise be a 500)."""

from portal.core.serializers import ID_LOOKUP, SLUG_LOOKUP


class IdConverter:
    regex = ID_LOOKUP  # at most 18 digits: always within a bigint

    def to_python(self, value: str) -> int:
        return int(value)

    def to_url(self, value) -> str:
        return str(value)


class SlugConverter:
    regex = SLUG_LOOKUP  # lowercase [a-z0-9-], as every slug the portal makes (docs/api.md)

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value) -> str:
        return str(value)


class UsernameConverter:
    """A username: Django's rule."""

    regex = r"[\w.@+-]{1,150}"  # Django's username rule (portal.core.serializers.USERNAME_PATTERN)

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value) -> str:
        return str(value)


class Base64IdConverter(UsernameConverter):
    """A password reset link's user id, base64 of a number (django.utils.http.urlsafe_base64_encode)."""

    regex = r"[0-9A-Za-z_\-]{1,64}"


class ResetTokenConverter(UsernameConverter):
    """A password reset token (base-36 time, a hyphen, the digest; or Django's "set-password")."""

    regex = r"[0-9A-Za-z]{1,13}-[0-9A-Za-z]{1,64}"


class WebhookActionConverter(UsernameConverter):
    """What the webhooks page's buttons ask of an endpoint: any other word is no page (404)."""

    regex = r"enable|disable|delete|ping"
