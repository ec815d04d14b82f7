"""What the reports' API takes and gives; money as decimal strings (billing/money.py)."""

# --- Statements

# --- Site report

# --- TCO
