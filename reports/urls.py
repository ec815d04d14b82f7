"""API routes of statements, the site report and the TCO view; the pages' routes are in
`pages` (portal/urls.py includes both)."""

api_urlpatterns = [
    # --- Statements
    # --- Site report
    # --- TCO
]

pages = [
    # --- Statements
    # --- Site report
    # --- TCO
]
