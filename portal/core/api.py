from django.contrib.auth import authenticate
from drf_spectacular.utils import extend_schema
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework import mixins, status, viewsets
from rest_framework.exceptions import ValidationError
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from portal.core.errors import PROBLEM_CONTENT_TYPE
from portal.core.models import ApiToken
from portal.core.renderers import JSONRenderer
from portal.core.selectors import tokens_of
from portal.core.serializers import ID_LOOKUP, TokenCreatedOut, TokenIn, TokenOut
from portal.core.throttles import TokenCreateThrottle
from portal.core.tokens import token_create, token_revoke


class TokenCreate(APIView):
    """Trade a username and password for an API token."""

    authentication_classes: list = []
    permission_classes = [AllowAny]
    throttle_classes = [TokenCreateThrottle]
    schema_conflicts = False

    @extend_schema(request=TokenIn, responses={201: TokenCreatedOut})
    def post(self, request):
        data = TokenIn(data=request.data)
        data.is_valid(raise_exception=True)
        # Django's request, which the login lockout (portal.core.lockout) marks: a username or
        # address locked out answers 429 `throttled` with Retry-After from the lockout middleware,
        # whether or not the username exists; below the limit a wrong password stays 400 (docs/api.md).
        user = authenticate(
            request._request,
            username=data.validated_data["username"],
            password=data.validated_data["password"],
        )
        if user is None:
            # One message for an unknown user and a wrong password: nothing to enumerate.
            raise ValidationError({"password": ["Unable to log in with these credentials."]})
        token, key = token_create(
            user=user,
            name=data.validated_data["name"],
            scope=data.validated_data.get("scope"),
            days=data.validated_data.get("expires_in_days"),
        )
        token.token = key
        return Response(TokenCreatedOut(token).data, status=status.HTTP_201_CREATED)


class TokenViewSet(mixins.ListModelMixin, mixins.DestroyModelMixin, viewsets.GenericViewSet):
    """The caller's own tokens; another user's token answers 404."""

    serializer_class = TokenOut
    queryset = ApiToken.objects.none()  # for the schema; requests use get_queryset
    lookup_value_regex = ID_LOOKUP
    schema_conflicts = False

    def get_queryset(self):
        return tokens_of(user=self.request.user)

    def perform_destroy(self, instance):
        token_revoke(token=instance, actor=self.request.user)


class _ProblemOnError:
    """An error of these views as problem+json, whatever the request accepted: their own
    renderers (YAML, the Swagger page's HTML) would turn a 401 into text no client expects."""

    def handle_exception(self, exc):
        response = super().handle_exception(exc)
        self.request.accepted_renderer = JSONRenderer()
        self.request.accepted_media_type = PROBLEM_CONTENT_TYPE
        return response


class SchemaView(_ProblemOnError, SpectacularAPIView):
    """The OpenAPI schema; like every API answer, 401 without credentials (docs/api.md)."""


class DocsView(_ProblemOnError, SpectacularSwaggerView):
    """The Swagger UI page; a browser's session (or a token) opens it."""
