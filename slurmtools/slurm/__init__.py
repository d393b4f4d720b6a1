"""Slurm itself: the one place that runs its commands (commands.py), the parsers of what they print
(parse.py), and the drain with a structured reason that never touches a person's (drain.py). It runs
as its caller: the job's user in the supervisor and the CLI, root in the gate and the blame intake.
Imports common/ and errors only."""
