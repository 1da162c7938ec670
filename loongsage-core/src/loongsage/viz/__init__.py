"""Looking at runs: ``loongsage plot`` (curves from metrics.jsonl) and ``loongsage view`` (the
trajectory viewer page). Both only read a run directory's files, so they work on a finished
run, a killed one, or one that is still writing."""
