from functools import cache

from django.contrib.auth import get_user_model
from django.db import DEFAULT_DB_ALIAS
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.exceptions import AuthenticationFailed, PermissionDenied
from rest_framework.request import Request

from portal.core.compiled import CompiledQuery
from portal.core.models import ApiToken, token_digest
from portal.core.tokens import token_allows_method, token_expired, token_touch

# What a request reads of its token: token_touch's fields, its scope and its expiry.
TOKEN_READ = {"id", "user_id", "scope", "expires", "last_used"}


class TokenExpired(AuthenticationFailed):
    """401 `token_expired`: the token was good and its time is over; a new one is needed."""

    problem_code = "token_expired"


class OutsideTokenScope(PermissionDenied):
    """403 `token_scope`: the token's scope does not reach this request, whatever its user may do."""

    problem_code = "token_scope"


@cache
def _token_fields() -> list[str]:
    """TOKEN_READ in the model's order of fields, the order Model.from_db takes values in."""
    return [field.attname for field in ApiToken._meta.concrete_fields if field.attname in TOKEN_READ]


@cache
def _user_fields() -> list[str]:
    return [field.attname for field in get_user_model()._meta.concrete_fields]


# The token and its whole user in one query, compiled once (portal.core.compiled): every API
# request makes it. key_digest is unique, so it finds one row or none.
_TOKEN_BY_DIGEST = CompiledQuery(
    lambda digest: ApiToken.objects.filter(key_digest=digest).values_list(
        *_token_fields(), *(f"user__{name}" for name in _user_fields())
    ),
    "probe:key_digest",
)


def token_and_user(key: str):
    """(token, user) for an API key, or None. The token holds only TOKEN_READ; the rest loads
    when read."""
    rows = _TOKEN_BY_DIGEST.rows(token_digest(key))
    if not rows:
        return None
    token_fields = _token_fields()
    user = get_user_model().from_db(DEFAULT_DB_ALIAS, _user_fields(), rows[0][len(token_fields) :])
    token = ApiToken.from_db(DEFAULT_DB_ALIAS, token_fields, rows[0][: len(token_fields)])
    ApiToken.user.field.set_cached_value(token, user)
    return token, user


class HashedTokenAuthentication(BaseAuthentication):
    """`Authorization: Token <key>`, looked up by the key's digest (tokens are stored hashed)."""

    keyword = "Token"

    def authenticate(self, request: Request):
        parts = get_authorization_header(request).split()
        if not parts or parts[0].lower() != self.keyword.lower().encode():
            return None
        if len(parts) != 2:
            raise AuthenticationFailed("Malformed Authorization header: expected 'Token <key>'.")
        try:
            key = parts[1].decode("ascii")
        except UnicodeDecodeError:
            raise AuthenticationFailed("Invalid token.") from None
        found = token_and_user(key)
        if found is None or not found[1].is_active:
            raise AuthenticationFailed("Invalid or revoked token.")
        token, user = found
        if token_expired(token):
            raise TokenExpired(f"This token expired at {token.expires:%Y-%m-%dT%H:%M:%SZ}; make a new one.")
        if not token_allows_method(token, request.method):
            raise OutsideTokenScope(f"This token's scope is {token.scope}: it may only read (GET).")
        user.token_scope = token.scope  # portal.core.staff: staff powers need an `admin` token
        token_touch(token=token)
        return user, token

    def authenticate_header(self, request: Request) -> str:
        return self.keyword
