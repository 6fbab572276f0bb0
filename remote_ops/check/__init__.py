"""Check: call sites against the host's library (check, inspect) and drift against the baseline version."""
