"""Measurements of remote-ops, by kind: gpu/ (harnesses run on a lent GPU machine, and their one library, lib/),
evidence/ (static and CPU evidence from the real wheels), controller/ (timings and memory on this machine),
faults/ (fault trials) and render/ (committed results -> the reports). Each script runs as
``python benchmarks/<kind>/<script>.py``; the reports (*.md) and results/ stay here."""
