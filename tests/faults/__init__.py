"""Fault-injection helpers (cut proxy, trial harness).

FUZZ_COUNTER is shared by tests/test_fuzz.py and benchmarks/faults.py (pytest may import a test
module twice; this package is imported once).
"""

FUZZ_COUNTER = {"inputs": 0}
