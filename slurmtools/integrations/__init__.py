"""Adapters that give a framework's trainer what TrainingControl gives a plain loop (docs/user-guide.md,
"Your trainer"): heartbeats, the checkpoint on the warning, completion, sealed checkpoints. They run
inside the ranks as the job's user, and import only what a user's trainer would: train/,
checkpoint/, common/ and errors."""
