"""Node health, run by root on every node: probes gather facts (NVML, sysfs, psutil, kernel log),
pure checks judge them, the runner time-boxes the probes, and the gate (the prolog and epilog)
drains with a reason we own, handles waiting blames and relays metrics. The root commands that read
its config live here too (command.py, blame_command.py, relay_command.py, admin_args.py). May import blame/,
metricsrelay/, slurm/, common/ and errors; never the job's side."""
