"""In-memory snapshots, inside every rank as the job's user: a step's state kept in node memory,
replicated to a peer node under the job's key, restored when the next run lands on the same nodes
(rules.py decides, store.py keeps, wire.py and torch_state.py move the bytes, fsdp.py is the
session a trainer opens). May import checkpoint/, train/, common/ and errors."""
