from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.request import Request

from portal.core.models import ApiToken, token_digest
from portal.core.services import token_touch


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
        try:  # key_digest is unique: get(), not first(), which would order by id for nothing
            token = ApiToken.objects.select_related("user").get(key_digest=token_digest(key))
        except ApiToken.DoesNotExist:
            token = None
        if token is None or not token.user.is_active:
            raise AuthenticationFailed("Invalid or revoked token.")
        token_touch(token=token)
        return token.user, token

    def authenticate_header(self, request: Request) -> str:
        return self.keyword
