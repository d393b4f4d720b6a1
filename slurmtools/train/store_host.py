"""The store the generations of an in-place recovery meet on (train/inplace.py): a TCPStore served
by a process of its own on the batch host, which the supervisor starts when it launches a step
that can recover in place. It outlives any training node (the first group's store lives in rank
0's process, gone with it or with its group), and its import of torch is paid once, before any
failure. Its first line on stdout is `port N`; it serves until its stdin closes (the supervisor
ended, or closed it), then exits.

    python -m slurmtools.train.store_host [--port N]
"""
from __future__ import annotations

import argparse
import datetime
import sys

READY_PREFIX = "port "


def main(argv: "list[str] | None" = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m slurmtools.train.store_host", description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=0, help="the port to serve on (default 0: a free one)")
    args = ap.parse_args(argv)
    if not 0 <= args.port < 65536:
        print(f"store_host: error: --port must be 0 to 65535, got {args.port}", file=sys.stderr)
        return 2
    from torch.distributed import TCPStore  # type: ignore[attr-defined]  # documented, not re-exported

    try:
        store = TCPStore("0.0.0.0", args.port, is_master=True, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=60))
    except (RuntimeError, OSError) as exc:
        print(f"store_host: error: cannot serve on port {args.port}: {exc}", file=sys.stderr)
        return 1
    print(f"{READY_PREFIX}{store.port}", flush=True)
    sys.stdin.read()            # until the supervisor closes it, or dies
    return 0


if __name__ == "__main__":
    sys.exit(main())
