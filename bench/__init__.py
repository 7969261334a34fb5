"""Benchmarks: `python -m bench [NAME ...]` (`make bench`). Results go to docs/benchmarks.md."""
