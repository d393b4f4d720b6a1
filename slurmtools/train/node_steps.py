"""The step log gathered per node: one line per node and step in the shared control dir, not one
per rank (at 8,000 ranks and a 1-s step, ~150 B per rank and step is ~100 GB a day).

Where heartbeats are gathered per node (node_beat.py), each rank's StepLog puts its buffered step
lines into its node's memory (`<node dir>/steps/<rank>-<n>.jsonl`, written whole, then renamed);
the node's local rank 0 takes them at each of its flushes, and every rank at its last (training
completed or stopped): a file is taken by renaming it first, so two takers never read one twice.
The taken lines become one record per attempt and step (`aggregate`): the node's slowest rank and
its step time, the tokens of every rank, the loss of the node's lowest rank (rank 0's on its node,
what the report plots), the longest collective and data wait; appended to
`steps/<attempt>.node-<host>.by<rank>.jsonl` (one writer per file). Lines of one step taken at two
moments make two partial records; the reader merges them (steplog.read). A node lost takes its
untaken lines with it, as a rank killed between flushes did before.
"""
from __future__ import annotations

import itertools
import json
import os
from pathlib import Path
from typing import Any, Dict, Iterable, List, Tuple

from slurmtools.common.fsutil import json_lines, read_small_regular, write_text_atomic
from slurmtools.train.node_beat import STEPS_SUBDIR, node_file_name

NODE_STEP_KIND = "node_step"
# one flush of one rank: lines of ~150 B at most every flush interval; a larger file is not ours
MAX_PUT_BYTES = 64 * 1024 * 1024
_MAX_FIELDS = ("step_s", "time_s", "collective_s", "data_wait_s")


def aggregate(records: Iterable[Dict[str, Any]], host: str) -> List[Dict[str, Any]]:
    """Rank step records (StepLog's lines) -> one node record per (attempt, step), in step order."""
    groups: Dict[Tuple[str, int], List[Dict[str, Any]]] = {}
    for record in records:
        if record.get("kind") == "step" and isinstance(record.get("rank"), int) and isinstance(record.get("step"), int):
            groups.setdefault((str(record.get("attempt_id")), record["step"]), []).append(record)
    out = []
    for (attempt_id, step), ranks in sorted(groups.items(), key=lambda item: (item[0][0], item[0][1])):
        lowest = min(ranks, key=lambda record: record["rank"])
        slowest = max(ranks, key=lambda record: (_number(record.get("step_s")) or 0.0, -record["rank"]))
        node: Dict[str, Any] = {"kind": NODE_STEP_KIND, "attempt_id": attempt_id, "host": host, "step": step,
                                "rank": lowest["rank"], "slowest_rank": slowest["rank"], "ranks": len(ranks)}
        for name in _MAX_FIELDS:
            values = [value for value in (_number(record.get(name)) for record in ranks) if value is not None]
            if values:
                node[name] = max(values)
        tokens = [value for value in (_number(record.get("tokens")) for record in ranks) if value is not None]
        if tokens:
            node["tokens"] = sum(tokens)
        if lowest.get("loss") is not None:
            node["loss"] = lowest["loss"]
        out.append(node)
    return out


def _number(value: Any) -> Any:
    """value when it is a number (a rank's line is another process's word: a string "1.5" in it
    would end the final flush in a TypeError), else None."""
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


class NodeSteps:
    """One rank's side of the node's step log: put its lines; take the node's (local rank 0 at
    each flush, every rank at its last)."""

    def __init__(self, directory: Path, steps_dir: Path, attempt_id: str, rank: int, host: str,
                 gathers: bool) -> None:
        self.directory = directory / STEPS_SUBDIR
        self.rank, self.host, self.gathers = rank, host, gathers
        self.path = steps_dir / f"{attempt_id}.{node_file_name(host).removesuffix('.json')}.by{rank}.jsonl"
        self._count = itertools.count()

    def put(self, lines: List[str]) -> None:
        """This rank's step lines into node memory, whole (a taker never sees half a file)."""
        if not lines:
            return
        self.directory.mkdir(mode=0o700, exist_ok=True)
        write_text_atomic(self.directory / f"{self.rank}-{next(self._count)}.jsonl",
                          "".join(line + "\n" for line in lines), durable=False, mode=0o600)

    def take(self) -> int:
        """Every rank's lines waiting in node memory, as node records appended to this rank's node
        file; how many records. A file another rank took first is skipped."""
        try:
            names = sorted(entry.name for entry in os.scandir(self.directory)
                           if entry.name.endswith(".jsonl") and not entry.name.startswith("."))
        except OSError:
            return 0
        records: List[Dict[str, Any]] = []
        for name in names:
            claimed = self.directory / f".taken-{self.rank}-{name}"
            try:
                os.rename(self.directory / name, claimed)
            except OSError:
                continue                 # taken by another rank
            raw = read_small_regular(claimed, MAX_PUT_BYTES)
            claimed.unlink(missing_ok=True)
            records += json_lines(raw.decode(errors="replace")) if raw is not None else []
        nodes = aggregate(records, self.host)
        if nodes:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a") as handle:
                handle.write("".join(json.dumps(node, sort_keys=True, allow_nan=False) + "\n" for node in nodes))
        return len(nodes)
