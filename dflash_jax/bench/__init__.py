"""Benchmarks: scripts that print and save numbers (never timed tests)."""
