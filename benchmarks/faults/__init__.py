"""Fault trials: the long forms of the fault-injection, fuzzing and Ctrl-C suites."""
