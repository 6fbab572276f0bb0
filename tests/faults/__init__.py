"""Fault-injection helpers (cut proxy, trial harness).

FUZZ_COUNTER is shared by tests/cli/test_fuzz.py and benchmarks/faults/suites.py (pytest may import a test
module twice; this package is imported once).
"""

FUZZ_COUNTER = {"inputs": 0}
