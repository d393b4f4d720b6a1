"""What runs inside every rank, as the job's user, for any trainer: the control contract
(control.py: heartbeats, checkpoint requests, the completion marker), node heartbeats and the sweep of
stale node files, the step log and step metrics, agreement among ranks, the trainer's state and the
resumable loader, the SDC canary's vote, flight-recorder reductions and GPU events. May import
preflight/ (the canary), slurm/, common/ and errors; never the supervisor or the node's root side."""
