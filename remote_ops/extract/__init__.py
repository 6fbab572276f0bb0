"""Extract: the job's spec, preflight and launch, status/logs/stop, following a log, verifying outputs."""
