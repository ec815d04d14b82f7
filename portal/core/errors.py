"""Every API error as application/problem+json (RFC 9457) with a machine `code` (docs/api.md).

Services raise PortalError subclasses; DRF's own exceptions are reshaped here; anything else
is logged and answered as a 500 without detail, so no internal text reaches a client.
"""

import logging

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import HttpRequest, JsonResponse
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler, set_rollback

log = logging.getLogger(__name__)

PROBLEM_CONTENT_TYPE = "application/problem+json"

TITLES = {
    "not_authenticated": "Authentication required",
    "token_expired": "Token expired",
    "token_scope": "Outside the token's scope",
    "permission_denied": "Permission denied",
    "not_found": "Not found",
    "invalid": "Invalid input",
    "method_not_allowed": "Method not allowed",
    "no_quota": "No quota",
    "quota_exhausted": "Quota exhausted",
    "budget_exhausted": "Budget exhausted",
    "tenant_suspended": "Tenant suspended",
    "conflict": "Conflict",
    "last_owner": "Last owner",
    "throttled": "Too many requests",
    "unavailable": "Service unavailable",
    "server_error": "Server error",
}
# Every `code` an error body may carry (docs/api.md, Conventions), for the schema's enum.
PROBLEM_CODES = tuple(TITLES)

_CODE_BY_STATUS = {
    400: "invalid",
    401: "not_authenticated",
    403: "permission_denied",
    404: "not_found",
    405: "method_not_allowed",
    406: "invalid",
    409: "conflict",
    415: "invalid",
    429: "throttled",
    503: "unavailable",
}


class PortalError(Exception):
    """A domain error a service raises; the API answers it with `status` and `code`."""

    status = status.HTTP_409_CONFLICT
    code = "conflict"

    def __init__(self, detail: str, *, extra: dict | None = None):
        super().__init__(detail)
        self.detail = detail
        self.extra = extra or {}


class Conflict(PortalError):
    pass


class Forbidden(PortalError):
    """The caller can see the object but their role does not allow the action."""

    status = status.HTTP_403_FORBIDDEN
    code = "permission_denied"


class OutsideTokenScope(Forbidden):
    """403 `token_scope`: the user may do this, the request's API token does not carry it."""

    code = "token_scope"


class NotFound(PortalError):
    """The object went away while the request was being served (another request removed it)."""

    status = status.HTTP_404_NOT_FOUND
    code = "not_found"


class Invalid(PortalError):
    """A rule of the domain that input breaks, named by field like a serializer's error."""

    status = status.HTTP_400_BAD_REQUEST
    code = "invalid"

    def __init__(self, errors: dict[str, str | list[str]]):
        flat = {field: [m] if isinstance(m, str) else list(m) for field, m in errors.items()}
        super().__init__(f"Invalid input: {', '.join(sorted(flat))}.", extra={"errors": flat})


class Unavailable(PortalError):
    status = status.HTTP_503_SERVICE_UNAVAILABLE
    code = "unavailable"


def problem(status_code: int, code: str, detail: str, **extra) -> dict:
    return {
        "type": f"urn:gpu-portal:problem:{code}",
        "title": TITLES.get(code, code.replace("_", " ").capitalize()),
        "status": status_code,
        "detail": detail,
        "code": code,
        **extra,
    }


def problem_response(status_code: int, code: str, detail: str, **extra) -> JsonResponse:
    """A problem+json answer for plain Django views (health checks, the API's 404 and 500)."""
    return JsonResponse(
        problem(status_code, code, detail, **extra), status=status_code, content_type=PROBLEM_CONTENT_TYPE
    )


def _flatten(errors, prefix: str = "") -> dict[str, list[str]]:
    """DRF's nested error detail as {"field" or "parent.child" or "items.0": [messages]}."""
    if isinstance(errors, dict):
        flat: dict[str, list[str]] = {}
        for key, value in errors.items():
            flat |= _flatten(value, f"{prefix}.{key}" if prefix else str(key))
        return flat
    if isinstance(errors, list) and any(isinstance(item, dict | list) for item in errors):
        flat = {}
        for index, value in enumerate(errors):
            flat |= _flatten(value, f"{prefix}.{index}" if prefix else str(index))
        return flat
    messages = errors if isinstance(errors, list) else [errors]
    return {prefix or "non_field_errors": [str(m) for m in messages]} if messages else {}


def _validation_problem(exc: exceptions.ValidationError) -> dict:
    errors = _flatten(exc.detail)
    fields = ", ".join(sorted(errors))
    return problem(400, "invalid", f"Invalid input: {fields}.", errors=errors)


def problem_exception_handler(exc: Exception, context: dict) -> Response:
    if isinstance(exc, RequestDataTooBig):
        # Django raises this while DRF reads the body; unhandled it would be a 500.
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        return Response(
            problem(413, "invalid", f"The request body is larger than {limit} bytes."),
            status=413,
            content_type=PROBLEM_CONTENT_TYPE,
        )
    if isinstance(exc, DjangoValidationError):
        # A model's own validation (full_clean in a service) that no serializer caught first.
        exc = exceptions.ValidationError(exc.message_dict if hasattr(exc, "error_dict") else exc.messages)
    if isinstance(exc, PortalError):
        set_rollback()
        return Response(
            problem(exc.status, exc.code, exc.detail, **exc.extra),
            status=exc.status,
            content_type=PROBLEM_CONTENT_TYPE,
        )
    response = exception_handler(exc, context)
    if response is None:
        log.exception("unhandled error in %s", context.get("view").__class__.__name__)
        set_rollback()
        response = Response(status=500)
        body = problem(500, "server_error", "The server failed to answer this request; it has been logged.")
    elif isinstance(exc, exceptions.ValidationError):
        body = _validation_problem(exc)
    else:
        # An exception may name its own code (portal.core.auth's token refusals).
        code = getattr(exc, "problem_code", None) or _CODE_BY_STATUS.get(response.status_code, "server_error")
        detail = str(exc.detail if isinstance(exc, exceptions.APIException) else exc)
        # A bare Http404 (DRF raises one for a lookup value the field cannot hold) has no text.
        body = problem(response.status_code, code, detail or TITLES[code] + ".")
        if isinstance(exc, exceptions.Throttled) and exc.wait is not None:
            body["retry_after_s"] = int(exc.wait) + 1
    response.data = body
    response.content_type = PROBLEM_CONTENT_TYPE
    return response


def api_not_found(request: HttpRequest, exception: Exception | None = None) -> JsonResponse:
    return problem_response(404, "not_found", f"No such resource: {request.path}")


def api_server_error(request: HttpRequest) -> JsonResponse:
    return problem_response(
        500, "server_error", "The server failed to answer this request; it has been logged."
    )
