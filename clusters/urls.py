"""API routes of the catalog (GPU models, scenarios, the sizing advisor, clusters)."""

from rest_framework.routers import SimpleRouter

from clusters import api

router = SimpleRouter()
router.register("gpu-models", api.GpuModelViewSet, basename="gpu-model")
router.register("scenarios", api.ScenarioViewSet, basename="scenario")
router.register("clusters", api.ClusterViewSet, basename="cluster")

api_urlpatterns = router.urls
