"""API routes of jobs, templates and usage."""

from django.urls import path
from rest_framework.routers import SimpleRouter

from jobs import api

router = SimpleRouter()
router.register("jobs", api.JobViewSet, basename="job")

api_urlpatterns = [
    path("templates/", api.TemplateList.as_view(), name="templates"),
    path("usage/", api.Usage.as_view(), name="usage"),
    *router.urls,
]
