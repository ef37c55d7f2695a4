"""Benchmarks and metrics (``specrag bench rag|rapid|load``)."""
