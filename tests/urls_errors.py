"""The project's URLs plus one API view that fails, to see how a 500 is answered."""

from django.urls import path
from rest_framework.views import APIView

from portal.urls import handler404, handler500  # noqa: F401
from portal.urls import urlpatterns as portal_urlpatterns


class Boom(APIView):
    def get(self, request):
        raise RuntimeError("database password is hunter2")  # must never reach the client


urlpatterns = [path("api/v1/boom/", Boom.as_view()), *portal_urlpatterns]
