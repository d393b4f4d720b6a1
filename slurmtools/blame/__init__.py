"""Blames of nodes: reported by a job as its user, checked and drained by the root-owned health hooks."""
