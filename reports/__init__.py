"""What the money adds up to: monthly statements per tenant, site-wide reports and the TCO view
(docs/cost-model.md)."""
