from drf_spectacular.utils import extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from tenants.selectors import memberships_of
from tenants.serializers import MeOut


class Me(APIView):
    """Who the caller is, and the tenants they belong to with their role in each."""

    @extend_schema(responses=MeOut)
    def get(self, request):
        user = request.user
        me = {
            "username": user.get_username(),
            "email": user.email,
            "is_staff": user.is_staff,
            "tenants": list(memberships_of(user=user)),
        }
        return Response(MeOut(me).data)
