"""A failed `up` is cleaned by `down`. A cluster of its own name: it cannot touch any other."""
from __future__ import annotations

from pathlib import Path

import pytest

from slurmtools.errors import MiniClusterError
from slurmtools.minicluster import cluster as mc
from slurmtools.minicluster import daemons, netns
from slurmtools.minicluster.layout import MiniClusterLayout
from tests.conftest import REPO, cluster_up_lock

pytestmark = pytest.mark.cluster


def test_unreachable_state_dir_is_refused_in_one_line(tmp_path):
    """pytest's tmp dirs are 0700: MariaDB (user mysql) could not enter them."""
    layout = MiniClusterLayout(name="unreach", state_dir=tmp_path / "mc", controller_host="x")
    (tmp_path / "mc" / "run").mkdir(parents=True)
    with pytest.raises(MiniClusterError, match="is not world-traversable; choose a --state-dir"):
        daemons.start_mariadb(layout)


def test_failed_up_is_cleaned_by_down():
    hosts_before = Path("/etc/hosts").read_text()
    with cluster_up_lock():
        layout = mc.layout_for_up("failup", Path("/var/tmp/slurmtools-failed-up-test"), nodes=2, gpus_per_node=4,
                                  prolog_dir=REPO / "prolog.d", epilog_dir=REPO / "epilog.d")
        try:
            with pytest.raises(MiniClusterError, match="nodes not ready after 0 s"):
                mc.up(layout, install=True, wait_s=0)      # every daemon starts; the wait fails at once
        except BaseException:
            mc.down(layout, purge=True)
            raise
    try:
        started = mc.load_record(layout)["pids"]
        assert {"mariadbd", "munged", "slurmdbd", "slurmctld", "slurmd-node1", "slurmd-node2"} <= set(started)
        assert all(daemons.pid_alive(pid) for pid in started.values())
    finally:
        mc.down(layout, purge=True)
    assert not [name for name, pid in started.items() if daemons.daemon_alive(name, pid)]
    assert not any(netns.netns_exists(layout.netns(n)) for n in layout.node_names)
    assert not netns.link_exists(layout.bridge)
    assert Path("/etc/hosts").read_text() == hosts_before
    assert not (mc.ETC_SLURM_CONF.is_symlink() and str(mc.ETC_SLURM_CONF.resolve()).startswith(str(layout.root)))
    assert not layout.root.exists() and not layout.registry_file.exists()


def test_a_failed_root_build_leaves_nothing_half_made_and_says_why(tmp_path, monkeypatch):
    """mmdebstrap against an archive nobody serves: one line naming the suite and mmdebstrap's
    reason; neither the partial nor a root is left for a later `up` to take."""
    from slurmtools.minicluster import debroot

    mc.install_packages(("mmdebstrap",))
    monkeypatch.setattr(debroot, "host_archive", lambda: "http://127.0.0.1:9/debian")
    root = tmp_path / "slurm-root"
    with pytest.raises(MiniClusterError) as failed:
        debroot.build_root(root, "24.11")
    message = str(failed.value)
    assert message.startswith("building the Debian trixie root for Slurm 24.11 failed (mmdebstrap exited ")
    assert "\n" not in message
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    assert not debroot.root_ready(root, "24.11")
