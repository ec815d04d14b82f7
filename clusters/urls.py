"""API routes of the catalog (GPU models, scenarios, the sizing advisor, clusters)."""

api_urlpatterns: list = []
