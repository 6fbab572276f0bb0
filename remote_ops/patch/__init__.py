"""Patch: playbooks, edits computed and validated locally, the plan cache, the atomic patch operation."""
