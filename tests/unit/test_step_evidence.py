"""The step's evidence keeps its first error lines beside its tail: at scale the cascade (every
rank's traceback, srun's line per task) pushed the first failing rank and its error out of the
300-line tail, and the decision read only the fallout."""
from __future__ import annotations

import os
import sys

from slurmtools.common.ledger import Cause
from slurmtools.requeue import step
from slurmtools.requeue.policy import Evidence, classify

FIRST = "[rank5]: RuntimeError: CUDA error: uncorrectable ECC error encountered\n"
CASCADE = "[rank{0}]: torch.distributed.DistNetworkError: failed to recv, got 0 bytes [node{0}]\n"


def _run(code: str) -> step.Step:
    launched = step.launch([sys.executable, "-c", code], {"PATH": "/usr/bin:/bin"})
    launched.child.wait(timeout=60)
    launched.finish(5.0)
    return launched


def test_the_first_failing_ranks_error_survives_a_cascade_of_a_thousand_lines():
    # one stream: the two pumps (stdout, stderr) are threads, their order between streams is not kept
    code = (f"import sys\nsys.stdout.write({FIRST!r})\n"
            f"for r in range(600):\n    sys.stdout.write({CASCADE!r}.format(r))\nsys.exit(1)\n")
    launched = _run(code)
    assert FIRST not in launched.tail                        # pushed out of the tail...
    text = launched.evidence()
    assert text.startswith(step.FIRST_ERRORS_MARK + FIRST)   # ...but kept first
    assert len(launched.first_errors) == step.FIRST_ERROR_LINES
    # the rank's own error before the platform's fallout: a crash, not an infrastructure failure
    diag = classify(Evidence(exit_code=1, log_tail=text, progressed=True))
    assert (diag.cause, diag.detail) == (Cause.CRASH, "exit 1")
    tail_only = classify(Evidence(exit_code=1, log_tail="".join(launched.tail), progressed=True))
    assert "infrastructure" in tail_only.detail              # what the tail alone said


def test_a_huge_line_is_kept_capped_and_a_quiet_step_adds_nothing():
    launched = _run("print('x' * 3_000_000 + ' error'); print('done')")
    assert max(len(line) for line in launched.tail) <= step.EVIDENCE_LINE_CHARS + 1
    assert _run("print('all well')").evidence() == "all well\n"


def test_evidence_text_leaves_out_first_errors_already_in_the_tail():
    assert step.evidence_text(["a error\n"], ["a error\n", "b\n"]) == "a error\nb\n"
    assert step.evidence_text(["a error\n"], ["b\n"]) == step.FIRST_ERRORS_MARK + "a error\nb\n"


def test_a_failing_line_reader_never_stops_the_pump(capsys):
    """The pump copies the step's output; if it died, the step would block on a full pipe (a hang)."""
    from slurmtools.requeue import step as step_module

    def broken(line: str) -> None:
        raise ValueError("boom")
    launched = step_module.launch([sys.executable, "-c", "print('\\n'.join(str(i) for i in range(20000)))"],
                                  dict(os.environ), broken)
    assert launched.child.wait(timeout=60) == 0
    launched.finish(5)
    assert list(launched.tail)[-1] == "19999\n"
    assert "slurmtools: progress from output lines off: ValueError: boom" in capsys.readouterr().err
