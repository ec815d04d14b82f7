"""API routes of jobs, templates and usage."""

from django.urls import path, re_path
from rest_framework.routers import SimpleRouter

from jobs import api
from portal.core.serializers import ID_LOOKUP

router = SimpleRouter()
router.register("jobs", api.JobViewSet, basename="job")

api_urlpatterns = [
    path("templates/", api.TemplateList.as_view(), name="templates"),
    path("usage/", api.Usage.as_view(), name="usage"),
    path("events/stream/", api.EventStream.as_view(), name="event-stream"),
    re_path(rf"^jobs/(?P<pk>{ID_LOOKUP})/log/stream/$", api.JobLogStream.as_view(), name="job-log-stream"),
    *router.urls,
]
