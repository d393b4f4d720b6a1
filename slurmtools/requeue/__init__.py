"""The supervisor: the batch step, run by `slurmtools run` as the job's user. Pure policy (classify,
decide), flag-only signals, the heartbeat watchdog, the straggler and node watches, the preflight
step it launches (preflight_*.py), the job's metrics file, and the loop that restarts in the
allocation or requeues. May import the spec, health/'s config and blame/'s report (to file a
blame), checkpoint/, train/, preflight/, slurm/, common/ and errors; nothing imports it but the
job's side, the report and the CLI."""
