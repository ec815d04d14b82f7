"""The price list, tier multipliers and budgets in the console."""

# --- Prices

# --- Budgets
