import re

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS
from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from portal.core.compiled import CompiledQuery
from portal.core.errors import PROBLEM_CODES
from portal.core.models import ApiToken, TokenScope
from portal.core.validators import slug_validator

# The patterns as the schema states them: JSON Schema regexes, which have no \Z.
SLUG_PATTERN = slug_validator.regex.pattern
USERNAME_PATTERN = r"^[\w.@+-]{1,150}$"
_USERNAME_RE = re.compile(r"[\w.@+-]{1,150}")
# What DRF's CharField refuses beyond the length: a NUL byte always; and, where it trims and
# refuses blanks, a value of whitespace only.
NO_NUL = r"^[^\x00]*$"
NO_NUL_NOT_BLANK = r"^[^\x00]*[^\s\x00][^\x00]*$"
# Path lookups (a viewset's lookup_value_regex): a value of another form is no object's, and
# answers 404 from the URL resolver before any query; PostgreSQL would refuse a NUL byte with a 500.
SLUG_LOOKUP = SLUG_PATTERN.removeprefix("^").removesuffix("$")
ID_LOOKUP = "[0-9]{1,18}"


def is_username(value) -> bool:
    """Whether the value could name a user (Django's username rule), before asking the database."""
    return isinstance(value, str) and _USERNAME_RE.fullmatch(value) is not None


# --- JSON body fields that take the JSON type the schema states, and only that. DRF's own read
# 5 as "5" into a string, "5" as 5 into a number and true as 1.0; a client that sends the wrong
# type has a bug it should hear of, and the schema would otherwise not say what is accepted.
# (Query parameters are text, and keep DRF's fields.)


class _StringOnly:
    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class _NumberOnly:
    """A JSON number in an API request (whose serializer has the request in its context: the API
    reads JSON only). A page feeds some of the same serializers (the quota page's advisor) the
    text a person typed, so without a request a numeral passes too."""

    def to_internal_value(self, data):
        typed = isinstance(data, int | float) or (isinstance(data, str) and "request" not in self.context)
        if isinstance(data, bool) or not typed:
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictCharField(_StringOnly, serializers.CharField):
    pass


class StrictBooleanField(serializers.BooleanField):
    """JSON true or false only: DRF's own takes "yes", "on", 1 and the like."""

    def to_internal_value(self, data):
        if not isinstance(data, bool):
            self.fail("invalid")
        return data


class StrictEmailField(_StringOnly, serializers.EmailField):
    pass


class StrictIntegerField(_NumberOnly, serializers.IntegerField):
    """An integer; 2.0 passes, as JSON Schema counts it an integer, and 2.5 does not."""


class StrictFloatField(_NumberOnly, serializers.FloatField):
    def to_internal_value(self, data):
        try:
            return super().to_internal_value(data)
        except OverflowError:  # an integer beyond any float (JSON has no limit); DRF lets it through
            self.fail("invalid")


class StrictDecimalField(_NumberOnly, serializers.DecimalField):
    """A JSON number with at most `decimal_places` decimals (the schema's multipleOf)."""

    def __init__(self, **kwargs):
        kwargs.setdefault("coerce_to_string", False)
        super().__init__(**kwargs)


class TokenIn(serializers.Serializer):
    username = StrictCharField(max_length=150)
    password = StrictCharField(max_length=256, trim_whitespace=False, style={"input_type": "password"})
    name = StrictCharField(max_length=100, required=False, default="", allow_blank=True)
    scope = serializers.ChoiceField(
        choices=TokenScope.choices,
        required=False,
        help_text="read: GETs only; submit: also writes in the user's tenants; admin: also staff "
        "powers (staff only). Default: the widest the user may hold.",
    )
    expires_in_days = serializers.IntegerField(
        required=False,
        min_value=1,
        max_value=settings.API_TOKEN_MAX_DAYS,
        help_text="Default API_TOKEN_DAYS (90); at most API_TOKEN_MAX_DAYS (365).",
    )


class TokenOut(serializers.ModelSerializer):
    id = serializers.CharField(read_only=True)

    class Meta:
        model = ApiToken
        fields = ["id", "name", "scope", "created", "expires", "last_used"]


class TokenCreatedOut(TokenOut):
    token = serializers.CharField(read_only=True, help_text="The key. Shown this once; store it now.")

    class Meta(TokenOut.Meta):
        fields = ["id", "name", "token", "scope", "created", "expires"]


class ProblemOut(serializers.Serializer):
    """An error answer, application/problem+json (RFC 9457); `code` is the machine-readable part."""

    type = serializers.CharField(help_text="urn:gpu-portal:problem:<code>")
    title = serializers.CharField()
    status = serializers.IntegerField(help_text="The HTTP status, repeated.")
    detail = serializers.CharField(help_text="For a person; may change between releases.")
    code = serializers.ChoiceField(choices=PROBLEM_CODES)
    errors = serializers.DictField(
        child=serializers.ListField(child=serializers.CharField()),
        required=False,
        help_text="On `invalid`: each bad field or parameter (`parent.child` when nested) and its messages.",
    )
    retry_after_s = serializers.IntegerField(
        required=False,
        help_text="On `throttled`, and on `unavailable` when the portal is overloaded: seconds to wait.",
    )


class _PatternRef(serializers.SlugRelatedField):
    """A reference to an object by a name that has a fixed form. A value of another form is
    `invalid` before any query: PostgreSQL refuses a NUL byte in a text parameter with a
    DataError, which would otherwise reach the client as a 500."""

    regex: re.Pattern

    def to_internal_value(self, data):
        if not isinstance(data, str) or self.regex.fullmatch(data) is None:
            self.fail("invalid")
        return super().to_internal_value(data)


@extend_schema_field({"type": "string", "pattern": SLUG_PATTERN, "maxLength": 63})
class SlugRef(_PatternRef):
    """An object by its slug (docs/api.md: lowercase [a-z0-9-]). The lookup in the field's
    declared queryset is compiled once (object_by_slug): a submission makes four."""

    regex = slug_validator.regex

    def __init__(self, **kwargs):
        super().__init__(slug_field="slug", **kwargs)

    def to_internal_value(self, data):
        if type(self).get_queryset is not serializers.RelatedField.get_queryset or self.queryset is None:
            return super().to_internal_value(data)  # a queryset of the request's: the ORM's way
        if not isinstance(data, str) or self.regex.fullmatch(data) is None:
            self.fail("invalid")
        # Keyed by where the field is declared: DRF deep-copies each field, queryset included,
        # for every serializer it makes, so the queryset itself is a new object each time.
        found = object_by_slug(self.queryset, data, key=(type(self.parent), self.field_name))
        if found is None:
            self.fail("does_not_exist", slug_name=self.slug_field, value=data)
        return found


# The compiled lookups of object_by_slug, by their key: a declared queryset's id (the queryset
# kept here, so that its id is never another's) or the caller's own key.
SLUG_LOOKUPS: dict[object, tuple[QuerySet, CompiledQuery, list[str]]] = {}
_SLUG_PROBE = "probe-slug-7300003"


def object_by_slug(queryset: QuerySet, slug: str, key: object = None):
    """The queryset's object with this slug, or None: one query compiled once per key
    (portal.core.compiled), the model instance made from its row as the ORM makes it. The key is
    the queryset's identity unless given: only for querysets declared once (a module's), or for
    a key that names where one is declared (a serializer class and field), so that the cache
    stays as small as the code."""
    key = ("id", id(queryset)) if key is None else key
    entry = SLUG_LOOKUPS.get(key)
    if entry is None or (key[0] == "id" and entry[0] is not queryset):
        names = [field.attname for field in queryset.model._meta.concrete_fields]
        compiled = CompiledQuery(lambda slug: queryset.filter(slug=slug).values_list(*names), _SLUG_PROBE)
        entry = SLUG_LOOKUPS[key] = (queryset, compiled, names)
    queryset, compiled, names = entry
    rows = compiled.rows(slug)
    return queryset.model.from_db(DEFAULT_DB_ALIAS, names, rows[0]) if rows else None


@extend_schema_field({"type": "string", "pattern": USERNAME_PATTERN, "maxLength": 150})
class UsernameRef(_PatternRef):
    """A user by username."""

    regex = _USERNAME_RE

    def __init__(self, **kwargs):
        super().__init__(slug_field="username", **kwargs)
