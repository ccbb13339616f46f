"""Benchmarks for bertattn (run with `make bench`)."""
