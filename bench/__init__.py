"""Benchmarks: each prints figures and asserts nothing about time (README, Benchmarks)."""
