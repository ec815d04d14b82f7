"""Signals for apps above tenants (DESIGN.md: a lower app that must react to a higher one
gets a signal, not an import)."""

from django.dispatch import Signal

# Sent after commit when a tenant's grants, tier or state change: the schedulers' limits follow.
tenant_limits_changed = Signal()  # kwargs: tenant_id
