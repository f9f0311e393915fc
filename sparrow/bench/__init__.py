"""Benchmarks run as `sparrow-bench <name>`: scripts that print a table and can write JSON."""
