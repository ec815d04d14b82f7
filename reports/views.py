"""Pages of statements (a tenant's), the site report and the TCO view (platform admins)."""

# --- Statements

# --- Site report

# --- TCO
