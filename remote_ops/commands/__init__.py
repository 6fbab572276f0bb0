"""One module per sub-command; see docs/ARCHITECTURE.md for the contract."""
