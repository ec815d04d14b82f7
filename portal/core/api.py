from django.contrib.auth import authenticate
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.exceptions import ValidationError
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from portal.core.models import ApiToken
from portal.core.selectors import tokens_of
from portal.core.serializers import ID_LOOKUP, TokenCreatedOut, TokenIn, TokenOut
from portal.core.services import token_create, token_revoke
from portal.core.throttles import TokenCreateThrottle


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
        user = authenticate(
            request, username=data.validated_data["username"], password=data.validated_data["password"]
        )
        if user is None:
            # One message for an unknown user and a wrong password: nothing to enumerate.
            raise ValidationError({"password": ["Unable to log in with these credentials."]})
        token, key = token_create(user=user, name=data.validated_data["name"])
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
