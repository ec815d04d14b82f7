"""API routes of the price list and the tier multipliers."""

from rest_framework.routers import SimpleRouter

from billing import api

router = SimpleRouter()
router.register("prices", api.PriceViewSet, basename="price")
router.register("tier-multipliers", api.TierMultiplierViewSet, basename="tier-multiplier")

api_urlpatterns = router.urls
