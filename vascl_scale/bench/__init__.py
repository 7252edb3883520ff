"""Benchmarks: every performance claim of the project comes from one of these commands."""
