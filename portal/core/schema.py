from decimal import Decimal

from django.core.validators import RegexValidator
from drf_spectacular.extensions import OpenApiAuthenticationExtension, OpenApiSerializerFieldExtension
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.plumbing import force_instance
from drf_spectacular.utils import PolymorphicProxySerializer

from portal.core.errors import PROBLEM_CONTENT_TYPE
from portal.core.serializers import NO_NUL, NO_NUL_NOT_BLANK, ProblemOut


class HashedTokenScheme(OpenApiAuthenticationExtension):
    target_class = "portal.core.auth.HashedTokenAuthentication"
    name = "tokenAuth"

    def get_security_definition(self, auto_schema):
        return {
            "type": "apiKey",
            "in": "header",
            "name": "Authorization",
            "description": "`Token <key>`; create a key with POST /api/v1/auth/token/.",
        }


class StrictDecimalScheme(OpenApiSerializerFieldExtension):
    """A JSON number with its decimal places as multipleOf, which the schema otherwise omits."""

    target_class = "portal.core.serializers.StrictDecimalField"

    def map_serializer_field(self, auto_schema, direction):
        schema = auto_schema._map_serializer_field(self.target, direction, bypass_extensions=True)
        schema["multipleOf"] = float(Decimal(1).scaleb(-self.target.decimal_places))
        return schema


class StrictCharScheme(OpenApiSerializerFieldExtension):
    """A string field's pattern says what the field refuses, unless a validator gave one."""

    target_class = "portal.core.serializers.StrictCharField"
    match_subclasses = True

    def map_serializer_field(self, auto_schema, direction):
        schema = auto_schema._map_serializer_field(self.target, direction, bypass_extensions=True)
        field = self.target
        has_own = any(isinstance(v, RegexValidator) and not v.inverse_match for v in field.validators)
        if direction == "request" and not has_own:
            blank_ok = field.allow_blank or not field.trim_whitespace
            schema["pattern"] = NO_NUL if blank_ok else NO_NUL_NOT_BLANK
        return schema


UNSAFE_METHODS = {"POST", "PUT", "PATCH", "DELETE"}
# What each error status means wherever the schema lists it; the body is always a ProblemOut.
ERROR_DESCRIPTIONS = {
    400: "`invalid`: `errors` names each bad field or parameter.",
    401: "`not_authenticated`: no credentials, or a token that is unknown or revoked.",
    403: "`permission_denied`: the caller's role does not allow this (or a session without its CSRF token).",
    404: "`not_found`: no such object among those the caller may see.",
    409: (
        "The object's state does not allow this now: `conflict`, `last_owner`, `no_quota`, "
        "`quota_exhausted`, `budget_exhausted` or `tenant_suspended`."
    ),
    413: "`invalid`: the body is larger than the site accepts.",
    415: "`invalid`: the body is not JSON.",
    429: "`throttled`: too many requests; wait Retry-After seconds.",
}


class ProblemAutoSchema(AutoSchema):
    """Lists the error answers of each operation, as problem+json, next to its success.

    Which ones follow from the operation's shape, as the code answers them: 400 wherever input
    is read (a body, query parameters, a header), 401 and 403 where credentials are required
    (403 on GETs only where a view lists it or sets `schema_forbids_reads`), 404 where the path
    names an object, 409 on writes
    unless the view sets `schema_conflicts = False`, 413 and 415 with a body, and 429
    everywhere (every view is throttled). A status a view documents itself keeps its
    description and gains the problem body if it named none."""

    def _get_filter_parameters(self):
        # A django-filter text filter is a Django form field, which refuses a NUL byte.
        parameters = super()._get_filter_parameters()
        for parameter in parameters:
            schema = parameter.get("schema", {})
            if schema.get("type") == "string" and not schema.keys() & {"enum", "format", "pattern"}:
                schema["pattern"] = NO_NUL
        return parameters

    def _get_request_for_media_type(self, serializer, direction="request"):
        schema, required = super()._get_request_for_media_type(serializer, direction)
        if isinstance(serializer, PolymorphicProxySerializer):
            # drf-spectacular leaves a oneOf body optional; it is required when every variant
            # requires a field (advise/: each advisor's inputs).
            variants = serializer.serializers
            variants = variants.values() if isinstance(variants, dict) else variants
            required = all(any(f.required for f in force_instance(v).fields.values()) for v in variants)
        return schema, required

    def get_operation(self, path, path_regex, path_prefix, method, registry):
        operation = super().get_operation(path, path_regex, path_prefix, method, registry)
        if operation is None:
            return None
        for parameter in operation.get("parameters", []):
            # An empty optional query parameter reads as an absent one, in DRF's serializers,
            # django-filter and the pagination alike; a list of choices (jobs' `state`) excepted.
            optional = parameter["in"] == "query" and not parameter.get("required")
            if optional and parameter.get("schema", {}).get("type") != "array":
                parameter["allowEmptyValue"] = True
        responses = operation["responses"]
        for status_code in self._error_statuses(operation, responses):
            entry = responses.setdefault(str(status_code), {})
            if not entry.get("description"):
                entry["description"] = ERROR_DESCRIPTIONS.get(status_code, "")
            entry.setdefault("content", {PROBLEM_CONTENT_TYPE: {"schema": self._problem_ref()}})
            if status_code == 429:
                entry.setdefault("headers", {})["Retry-After"] = {
                    "schema": {"type": "integer"},
                    "description": "Seconds until the throttle lets the caller in again.",
                }
        return operation

    def _error_statuses(self, operation: dict, documented: dict) -> list[int]:
        statuses = {int(code) for code in documented if code.isdigit() and int(code) >= 400}
        places = {parameter["in"] for parameter in operation.get("parameters", [])}
        has_body = "requestBody" in operation
        security = operation.get("security", [])
        authenticated = bool(security) and {} not in security
        if has_body or places & {"query", "header"}:
            statuses.add(400)
        if authenticated:
            statuses.add(401)
            # A view that refuses reads to a caller's role (staff-only lists) says so.
            if self.method in UNSAFE_METHODS or getattr(self.view, "schema_forbids_reads", False):
                statuses.add(403)
        if "path" in places:
            statuses.add(404)
        if self.method in UNSAFE_METHODS and getattr(self.view, "schema_conflicts", True):
            statuses.add(409)
        if has_body:
            statuses |= {413, 415}
        if self.view.get_throttles():
            statuses.add(429)
        return sorted(statuses)

    def _problem_ref(self) -> dict:
        return self.resolve_serializer(ProblemOut, "response").ref
