"""The floor every party may import: the control dir's names (control_dir.py) and the job's ledger
(ledger.py), the job's key (job_secret.py), the rendezvous convention, the schema every YAML config is
read with, file and signal helpers, and two tables (XID codes, metric names). It runs wherever its
importer runs, as that importer's user, and imports nothing of slurmtools but errors."""
