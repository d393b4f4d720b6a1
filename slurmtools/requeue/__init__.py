"""Auto-requeue: pure policy (classify, decide), flag-only signals, heartbeat watchdog, the supervisor loop."""
