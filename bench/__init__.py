"""Benchmarks: each prints figures and asserts nothing about time (README, Benchmarks).
seeding/ makes the large site they run against (manage.py seed_site)."""
