"""The API of statements, the site report and the TCO view (docs/api.md, Cost)."""

# --- Statements

# --- Site report

# --- TCO
