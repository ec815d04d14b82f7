"""API routes of the group mappings."""

from rest_framework.routers import SimpleRouter

from identity import api

router = SimpleRouter()
router.register("group-mappings", api.GroupMappingViewSet, basename="group-mapping")
api_urlpatterns = router.urls
