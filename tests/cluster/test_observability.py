"""What people look at, on the real mini-cluster: a 2-node job with one injected crash writes its
metrics as textfiles, one node_exporter per node reads them, a real Prometheus scrapes those and
answers queries; and the job's HTML report loads in a real headless Chromium with every plot drawn.

Debian's prometheus, prometheus-node-exporter and chromium are installed when missing (apt starts
no daemon: policy-rc.d). Every process runs on loopback and is stopped, and its data removed, at
the end of the module."""
from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

from slurmtools.common import ledger
from slurmtools.common.control_dir import control_dir_for
from slurmtools.common.metric_names import JOB_PLACEHOLDER, NODE_PLACEHOLDER
from slurmtools.minicluster import cluster as mc
from slurmtools.requeue import goodput
from tests import browser
from tests.cluster import asuser, training
from tests.cluster.test_faults import _expand
from tests.conftest import wait_for
from tests.prepare import OBSERVABILITY_PACKAGES

pytestmark = pytest.mark.cluster
SCRAPE_INTERVAL_S = 1


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


class Stack:
    """node_exporter per node (textfile collector only: the directory the cluster's root-owned
    relay writes vetted job metrics to) and one Prometheus scraping them."""

    def __init__(self, root: Path, layout) -> None:
        self.root = root
        self.layout = layout
        self.procs: List[subprocess.Popen] = []
        targets = []
        for node in layout.node_names:
            textfiles = layout.metrics_textfiles / node
            textfiles.mkdir(mode=0o755, parents=True, exist_ok=True)
            port = _free_port()
            self._start(node, ["prometheus-node-exporter", f"--web.listen-address=127.0.0.1:{port}",
                               "--collector.disable-defaults", "--collector.textfile",
                               f"--collector.textfile.directory={textfiles}"])
            wait_for(lambda: _ready(f"http://127.0.0.1:{port}/metrics"), 30, f"node_exporter for {node}")
            targets.append({"targets": [f"127.0.0.1:{port}"], "labels": {"exporter_node": node}})
        self.port = _free_port()
        config = {"global": {"scrape_interval": f"{SCRAPE_INTERVAL_S}s", "evaluation_interval": "5s"},
                  "scrape_configs": [{"job_name": "node", "static_configs": targets}]}
        (root / "prometheus.yml").write_text(json.dumps(config))          # JSON is YAML
        self._start("prometheus", ["prometheus", f"--config.file={root / 'prometheus.yml'}",
                                   f"--storage.tsdb.path={root / 'tsdb'}",
                                   f"--web.listen-address=127.0.0.1:{self.port}"])
        wait_for(lambda: _ready(f"http://127.0.0.1:{self.port}/-/ready"), 60, "prometheus ready")

    @property
    def inbox_pattern(self) -> str:
        """A job's metrics_dir: its own inbox on each node, which the prolog made for it."""
        return f"{self.layout.metrics_inbox}/{NODE_PLACEHOLDER}/{JOB_PLACEHOLDER}"

    def _start(self, name: str, argv: List[str]) -> None:
        log = open(self.root / f"{name}.log", "w")
        self.procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
        log.close()

    def query(self, promql: str) -> List[Dict[str, Any]]:
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(url, timeout=10) as response:
            body = json.load(response)
        assert body["status"] == "success", body
        return list(body["data"]["result"])

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture(scope="module")
def stack(cluster, tmp_path_factory) -> Iterator[Stack]:
    mc.install_packages(extra=OBSERVABILITY_PACKAGES)
    root = tmp_path_factory.mktemp("observability")
    root.chmod(0o755)
    running = Stack(root, cluster)
    try:
        yield running
    finally:
        running.stop()
        shutil.rmtree(root / "tsdb", ignore_errors=True)
        assert all(proc.poll() is not None for proc in running.procs)


@pytest.fixture(scope="module")
def crashed_once(stack) -> Dict[str, Any]:
    """A 2-node job of the user's with metrics on that crashes at step 6 and restarts in its allocation."""
    training.settle()
    workdir = asuser.user_dir("observed")
    spec = training.fault_spec(workdir, "observed", extra=["--fail-at-step", "6"],
                               metrics_dir=stack.inbox_pattern)
    job = training.submit(spec)
    info = training.wait_finished(job, 240)
    assert info.state == "COMPLETED", training.describe(spec, job)
    control = control_dir_for(spec.checkpoint_dir, spec.output_dir, str(job))
    events = ledger.read(control)
    return {"job": str(job), "spec": spec, "control": control, "events": events,
            "nodes": sorted(_expand(next(e.nodes for e in events if isinstance(e, ledger.AttemptStart))))}


def test_prometheus_has_the_jobs_training_metrics_restarts_by_cause_and_goodput(stack, crashed_once):
    job, nodes = crashed_once["job"], crashed_once["nodes"]
    restarted = f"{job}.0.1"

    def train_series() -> List[Dict[str, Any]]:
        found = stack.query(f'slurmtools_train_step{{slurm_job="{job}"}}')
        final = {s["metric"]["attempt"] for s in found} == {restarted} and {s["value"][1] for s in found} == {"20"}
        return found if final and len(found) == 2 else []
    # the files' last version (written as the job ended) is in Prometheus after its next scrape
    series = wait_for(train_series, 30, "both nodes' training metrics of the restarted attempt's last step")
    assert sorted((s["metric"]["node"], s["metric"]["rank"]) for s in series) == [(nodes[0], "0"), (nodes[1], "1")]
    # each node's own exporter served its own ranks' file, relayed as the job's user's
    assert {(s["metric"]["node"], s["metric"]["exporter_node"]) for s in series} == {(n, n) for n in nodes}
    assert {s["metric"]["user"] for s in series} == {asuser.user().name}
    for name in ("slurmtools_train_tokens_per_second", "slurmtools_train_loss", "slurmtools_train_grad_norm",
                 "slurmtools_train_step_data_wait_seconds",
                 "slurmtools_train_step_collective_seconds", "slurmtools_train_collective_share_ratio"):
        assert len(stack.query(f'{name}{{slurm_job="{job}",attempt="{restarted}"}}')) == 2, name
    restarts = wait_for(lambda: stack.query(f'slurmtools_job_restarts_total{{slurm_job="{job}"}}'), 30, "restarts")
    assert [(r["metric"]["cause"], r["value"][1]) for r in restarts] == [("crash", "1")]
    assert restarts[0]["metric"]["node"] == nodes[0]                     # the supervisor runs on the batch host
    expected = goodput.goodput(crashed_once["events"]).ratio
    ratios = wait_for(lambda: [g for g in stack.query(f'slurmtools_job_goodput_ratio{{slurm_job="{job}"}}')
                               if float(g["value"][1]) == pytest.approx(expected, rel=1e-6)], 30,
                      f"the chain's final goodput {expected:.4f}")
    assert len(ratios) == 1 and ratios[0]["metric"]["node"] == nodes[0]
    attempts = stack.query(f'slurmtools_job_attempts_total{{slurm_job="{job}"}}')
    assert [a["value"][1] for a in attempts] == ["2"]


SPOOF = """# TYPE slurmtools_train_loss gauge
slurmtools_train_loss{{slurm_job="{job}",rank="0"}} 1.5
slurmtools_train_loss{{slurm_job="{other}",rank="0"}} 9.0
slurmtools_train_loss{{attempt="{other}.0",rank="1"}} 9.0
# TYPE slurmtools_health_status gauge
slurmtools_health_status{{node="node3"}} 0
"""


def _write(path: Path, text: str) -> str:
    """As the user: write a file; "" or the error's name."""
    try:
        path.write_text(text)
        return ""
    except OSError as exc:
        return type(exc).__name__


def test_a_job_cannot_put_series_in_another_jobs_name(stack, cluster, reference_run):
    """A user's job writes into its own inbox only; what it writes there is relayed as its own
    (job, node and user labels set by root), and a sample naming another job is refused."""
    training.settle()
    job = training.submit_script("#!/bin/bash\n#SBATCH -N1 -w node1 -o /dev/null\nsleep 120\n")
    try:
        inbox = cluster.metrics_inbox / "node1" / str(job)
        wait_for(lambda: inbox.is_dir(), 30, "the prolog to make the job's inbox")
        assert (inbox.stat().st_uid, oct(inbox.stat().st_mode & 0o777)) == (asuser.user().uid, "0o755")
        other = str(reference_run["job"])
        assert asuser.call(_write, inbox / "spoof.prom", SPOOF.format(job=job, other=other)) == ""
        # node_exporter's directory and the inbox root are root's: nothing can be put there directly
        assert asuser.call(_write, cluster.metrics_textfiles / "node1" / "forged.prom", "x 1\n") == "PermissionError"
        assert asuser.call(_write, cluster.metrics_inbox / "node1" / "forged.prom", "x 1\n") == "PermissionError"
        relay = subprocess.run([sys.executable, "-m", "slurmtools", "metrics", "relay", "--node", "node1",
                                "--config", str(cluster.health_config)], capture_output=True, text=True, timeout=60)
        assert relay.returncode == 0, relay.stderr
        assert relay.stdout.splitlines() == [
            f"slurmtools: metrics of job {job} (user {asuser.user().name}): spoof.prom: 3 refused: "
            f"slurmtools_train_loss: names another job (slurm_job='{other}'); "
            f"slurmtools_train_loss: names another job (attempt='{other}.0'); "
            "slurmtools_health_status: not a job metric"]
        mine = wait_for(lambda: stack.query(f'slurmtools_train_loss{{slurm_job="{job}"}}'), 30, "the job's own sample")
        assert [(m["metric"]["user"], m["metric"]["node"], m["value"][1]) for m in mine] == [
            (asuser.user().name, "node1", "1.5")]
        assert stack.query(f'slurmtools_train_loss{{slurm_job="{other}"}}') == []
        assert stack.query('slurmtools_health_status') == []
    finally:
        training.cancel(job)
    wait_for(lambda: not inbox.exists(), 60, "the epilog to remove the job's inbox")


def test_the_html_report_renders_every_plot_in_a_real_browser(crashed_once):
    control, nodes = crashed_once["control"], crashed_once["nodes"]
    tmp_path = asuser.user_dir("report")
    text = asuser.run([sys.executable, "-m", "slurmtools", "report", str(control)])
    assert text.returncode == 0, text.stderr
    assert "crash -> restart" in text.stdout and "completed -> complete" in text.stdout
    page = tmp_path / "report.html"
    made = asuser.run([sys.executable, "-m", "slurmtools", "report", str(control), "--html", str(page)],
                      timeout=300)
    assert made.returncode == 0, made.stderr
    view = browser.load(page)
    (tmp_path / "report.png").write_bytes(view.screenshot_png)
    assert view.errors == []
    assert view.requests == [page.resolve().as_uri()]                      # self-contained: nothing fetched
    assert [p["id"] for p in view.plots] == ["plot-timeline", "plot-progress", "plot-step-time", "plot-breakdown"]
    for plot in view.plots:
        assert plot["width"] > 500 and plot["height"] > 100 and plot["shapes"] > 50, plot
    assert view.screenshot_png.startswith(b"\x89PNG\r\n\x1a\n") and len(view.screenshot_png) > 20_000
    html_text = page.read_text()
    assert all(node in html_text for node in nodes)        # the step-time plot's legend names both nodes
