"""Adapters that give a framework's trainer what TrainingControl gives a plain loop (README,
"Your trainer"): heartbeats, the checkpoint on the warning, completion, sealed checkpoints."""
