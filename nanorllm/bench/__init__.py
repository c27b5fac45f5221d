"""Benchmarks: figures measured side by side, each printed beside its ceiling."""
