"""The reference trainer: a tiny real FSDP model (tiny_fsdp.py) with its data and its injected
faults, what the tests, the demo and the benches train. It runs inside the ranks as the job's user
and uses only what a user's own trainer would: train/, checkpoint/, snapshot/ and preflight/'s canary."""
