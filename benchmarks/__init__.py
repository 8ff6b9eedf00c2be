"""Ravex benchmarks: ``python -m benchmarks <suite>``; see benchmarks/RESULTS.md."""
