"""Renderers: committed results (benchmarks/results/, test runs) -> the markdown reports."""
