"""The job report as one self-contained HTML page: matplotlib draws each plot as SVG and the SVG
is inlined, so the page needs no network, no script and no file beside it to be viewed.

Plots (each a <figure class="plot" id="plot-...">): the timeline of the job chain, loss and
tokens/s over steps across attempts, step time per node, and the wall-time breakdown."""
from __future__ import annotations

import errno
import html
import io
import re
import warnings
from pathlib import Path
from typing import Any, Dict, List

from slurmtools.common.fsutil import write_text_atomic
from slurmtools.report.text import JobReport, format_text

PLOTS = ("timeline", "progress", "step-time", "breakdown")
_OUTCOME_COLOURS = {"completed": "#2e7d32", None: "#1565c0", "preempted": "#f9a825", "straggler": "#ef6c00"}
_FAILURE_COLOUR = "#c62828"
_MARK_STYLE = {"checkpoint": ("#455a64", "^"), "failure": (_FAILURE_COLOUR, "X"),
               "straggler": ("#ef6c00", "v"), "preflight": ("#6a1b9a", "D"), "refused": ("#795548", "s"),
               "snapshot": ("#00838f", "P")}
_BREAKDOWN_COLOURS = ["#2e7d32", "#1565c0", "#f9a825", _FAILURE_COLOUR, "#9e9e9e"]


def _figure(width_in: float, height_in: float) -> Any:
    """A figure outside pyplot: no global backend switched, nothing left open (in a notebook the
    user's own plotting is untouched)."""
    from matplotlib.figure import Figure
    return Figure(figsize=(width_in, height_in))


def _svg(fig: Any, salt: str) -> str:
    """The figure as inline SVG (no XML prolog; ids salted per plot, so two plots' clip paths and
    glyphs never share an id in one page)."""
    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context({"svg.hashsalt": salt, "svg.fonttype": "path"}):
        fig.savefig(buf, format="svg", bbox_inches="tight",
                    metadata={"Creator": None, "Date": None, "Format": None, "Type": None})
    text = buf.getvalue()
    return text[text.index("<svg"):]


def _timeline(report: JobReport) -> Any:
    rows = max(1, len(report.attempts))
    fig = _figure(10, 1.2 + 0.45 * rows)
    ax = fig.subplots()
    end_of_chain = max([a.end_s or a.start_s for a in report.attempts] + [m.time_s for m in report.marks]
                       + [report.start_s])
    for row, attempt in enumerate(report.attempts):
        begin = attempt.start_s - report.start_s
        width = max((attempt.end_s if attempt.end_s is not None else end_of_chain) - attempt.start_s, 0.5)
        colour = _OUTCOME_COLOURS.get(attempt.cause, _FAILURE_COLOUR)
        ax.barh(row, width, left=begin, height=0.6, color=colour)
        label = attempt.cause or "running"
        if attempt.node:
            label += f" on {attempt.node}"
        if attempt.action and attempt.action != "complete":
            label += f" -> {attempt.action}"
        ax.text(begin + width, row, f"  {label}", va="center", fontsize=8)
    for mark in report.marks:
        colour, marker = _MARK_STYLE.get(mark.kind, ("#000000", "o"))
        ax.plot([mark.time_s - report.start_s], [-0.7], marker=marker, color=colour, linestyle="none",
                label=mark.kind)
    handles: Dict[str, Any] = {}
    for handle, name in zip(*ax.get_legend_handles_labels()):
        handles.setdefault(name, handle)
    if handles:
        ax.legend(handles.values(), handles.keys(), loc="upper left", fontsize=8, ncol=len(handles))
    ax.set_yticks(range(rows), [a.attempt_id for a in report.attempts] or [""])
    ax.set_ylim(rows - 0.4, -1.2)
    ax.set_xlabel("seconds since the first attempt started")
    ax.set_title("job chain: attempts, failures and checkpoints")
    return fig


def _progress(report: JobReport) -> Any:
    fig = _figure(10, 5.5)
    loss_ax, rate_ax = fig.subplots(2, 1, sharex=True)
    for attempt_id, series in report.loss.items():
        loss_ax.plot([s for s, _ in series], [v for _, v in series], marker=".", label=attempt_id)
    for attempt_id, series in report.tokens_per_s.items():
        rate_ax.plot([s for s, _ in series], [v for _, v in series], marker=".", label=attempt_id)
    loss_ax.set_ylabel("loss")
    rate_ax.set_ylabel("tokens/s (job)")
    rate_ax.set_xlabel("step")
    loss_ax.set_title("training progress by attempt")
    for ax in (loss_ax, rate_ax):
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    return fig


def _step_time(report: JobReport) -> Any:
    fig = _figure(10, 3.5)
    ax = fig.subplots()
    for node, series in report.step_s_by_node.items():
        ax.plot([s for s, _ in series], [v for _, v in series], marker=".", label=node)
    ax.set_xlabel("step")
    ax.set_ylabel("step time (s)")
    ax.set_title("step time per node (its slowest rank): a straggler stands out")
    if report.step_s_by_node:
        ax.legend(fontsize=8)
    return fig


def _breakdown(report: JobReport) -> Any:
    fig = _figure(10, 1.8)
    ax = fig.subplots()
    left = 0.0
    wall = report.breakdown.wall_s
    for (name, value), colour in zip(report.breakdown.parts(), _BREAKDOWN_COLOURS):
        share = f" {value / wall:.0%}" if wall > 0 else ""
        ax.barh(0, value, left=left, color=colour, label=f"{name} {value:.1f} s{share}")
        left += value
    ax.set_yticks([])
    ax.set_xlabel("seconds of wall time")
    ax.set_title(f"where the wall time went (goodput {report.goodput.ratio:.0%})")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.45), ncol=5, fontsize=8)
    return fig


def render(report: JobReport) -> str:
    """The whole page. Names (nodes, attempts, causes) are drawn as plain text: mathtext off, so a
    node called `$\\frac{$` is a label, not a formula to parse; a glyph the font lacks is drawn as
    a box, without the warning matplotlib would print for it."""
    import matplotlib

    figures: List[str] = []
    with matplotlib.rc_context({"text.parse_math": False, "text.usetex": False}), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        for name, draw in zip(PLOTS, (_timeline, _progress, _step_time, _breakdown)):
            svg = _svg(draw(report), salt=f"{report.job}-{name}")
            figures.append(f'<figure class="plot" id="plot-{name}">\n{svg}\n</figure>')
    title = f"slurmtools report: job {html.escape(report.job)}"
    summary = html.escape(format_text(report))
    return "\n".join([
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{title}</title>",
        "<style>body{font-family:sans-serif;margin:1.5em;max-width:1100px}"
        "figure.plot{margin:1.5em 0}figure.plot svg{width:100%;height:auto}"
        "pre{background:#f5f5f5;padding:1em;overflow-x:auto}</style>",
        "</head><body>",
        f"<h1>{title}</h1>",
        *figures,
        "<h2>Summary</h2>",
        f"<pre>{summary}</pre>",
        "</body></html>",
        "",
    ])


def write_page(path: Path, page: str) -> None:
    """temp + rename (fsutil.write_text_atomic: a browser or a reader never sees half a page, a link
    planted at the temp name is never followed, nothing half-written is left beside the page)."""
    if not path.name:
        raise IsADirectoryError(errno.EISDIR, "is not a file name (give the page's file name)")
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, "is a directory (give the page's file name)")
    write_text_atomic(path, page, durable=False)


def plot_ids(page: str) -> List[str]:
    """The plots a page holds, by id (what a browser test looks for)."""
    return re.findall(r'<figure class="plot" id="plot-([a-z-]+)"', page)
