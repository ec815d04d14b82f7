"""The pages' guard against impossible input."""

from django.core.exceptions import SuspiciousOperation
from django.views.defaults import bad_request

FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")


def _has_nul(data) -> bool:
    """Whether a QueryDict (a query or a form) holds a NUL byte in a name or a value."""
    return any("\x00" in name or any("\x00" in value for value in values) for name, values in data.lists())


def refuse_impossible_input(get_response):
    """A page request with a NUL byte in its path, its query or its form is refused with 400
    before any view runs: no name, slug or search term of the portal can hold one, and
    PostgreSQL refuses one in a text parameter with an error that would be a 500 (the admin's
    search box, the tenant switcher's ?tenant=). The API answers its own 400s, naming the field,
    so it is left to its serializers. Impossible path parameters (overlong ids, odd usernames)
    are the URL converters' (portal.core.converters): a 404 there."""

    def middleware(request):
        if not request.path.startswith("/api/") and (
            "\x00" in request.path
            or _has_nul(request.GET)
            or (request.method == "POST" and request.content_type in FORM_TYPES and _has_nul(request.POST))
        ):
            return bad_request(request, SuspiciousOperation("NUL byte in the request"))
        return get_response(request)

    return middleware
