"""Benchmarks: each runs as python -m bench.NAME; the last line of output is one JSON object."""
