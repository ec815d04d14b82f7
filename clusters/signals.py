"""Signals for apps above clusters (docs/architecture.md: a lower app that must react to a higher one gets
a signal, not an import)."""

from django.dispatch import Signal

# Sent when a cluster's circuit breaker closes after it was open: the jobs that waited for the
# cluster may go (clusters/breaker.py).
cluster_recovered = Signal()  # kwargs: cluster_id
