"""Benchmark harness pieces: billing fidelity against recorded usage (more to come)."""
