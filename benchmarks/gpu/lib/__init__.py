"""The GPU harnesses' one library: harness.py (the result document, steps, runs, the host environment), dataset.py
(the prepared-data builder), models.py (the tiny checkpoints of the model family), bundle.py (what travels)."""
