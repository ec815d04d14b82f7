"""What GPU time costs: the price list, tier multipliers and budgets (docs/cost-model.md)."""
