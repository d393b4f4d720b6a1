"""The Slurm releases a mini-cluster runs and the Debian roots they run from (pure parts)."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from slurmtools.minicluster import conf_text
from slurmtools.minicluster import release
from slurmtools.minicluster.debroot import last_error
from slurmtools.minicluster.layout import MiniClusterLayout


@pytest.mark.parametrize("text,expected", [("22.05.8-4+deb12u1", "22.05"), ("slurm-wlm 24.11.5", "24.11"),
                                           ("26.05.5-1", "26.05"), ("slurm 23.2.7", "23.02")])
def test_release_of_a_version(text, expected):
    assert release.release_of_version(text) == expected


def test_release_of_nonsense_is_refused():
    with pytest.raises(ValueError, match="not a Slurm version"):
        release.release_of_version("slurm-wlm")


def test_the_release_of_the_machines_suite():
    assert release.release_of_suite('PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nVERSION_CODENAME=bookworm\n') == "22.05"
    assert release.release_of_suite("VERSION_CODENAME=trixie\n") == "24.11"
    assert release.release_of_suite("VERSION_CODENAME=jammy\n") is None


def test_the_host_archive_is_its_first_non_security_source():
    deb822 = ("Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\nComponents: main\n\n"
              "Types: deb\nURIs: http://deb.debian.org/debian-security\nSuites: bookworm-security\n")
    assert release.archive_url(release.deb822_uris(deb822)) == "http://mirror.example/debian"
    one_line = ("# deb http://old.example/debian bookworm main\n"
                "deb [signed-by=/usr/share/keyrings/k.gpg] http://security.debian.org/ bookworm-security main\n"
                "deb https://m.example/debian/ bookworm main\n")
    assert release.archive_url(release.one_line_uris(one_line)) == "https://m.example/debian"
    assert release.archive_url([]) == release.DEFAULT_ARCHIVE
    assert release.archive_url(release.deb822_uris("Types: deb-src\nURIs: http://src.example/debian\n")) == \
        release.DEFAULT_ARCHIVE


def test_mmdebstrap_argv_per_release():
    trixie = release.mmdebstrap_argv("24.11", "/s/slurm-root.partial", "http://m/debian")
    assert trixie[:4] == ["mmdebstrap", "--variant=minbase", "--mode=root", "--quiet"]
    assert trixie[-3:] == ["trixie", "/s/slurm-root.partial", "http://m/debian"]
    assert "slurmdbd" in trixie[4] and "mariadb-server" in trixie[4]
    assert not any("Valid-Until" in arg for arg in trixie)
    sid = release.mmdebstrap_argv("26.05", "/s/r", "http://m/debian")
    assert '--aptopt=Acquire::Check-Valid-Until "false"' in sid and sid[-3] == "sid"
    with pytest.raises(ValueError, match="unknown Slurm release '25.05'"):
        release.mmdebstrap_argv("25.05", "/s/r", "http://m/debian")


def test_dpkg_version_reads_installed_packages_only():
    status = ("Package: slurm-client\nStatus: deinstall ok config-files\nVersion: 22.05.8-4\n\n"
              "Package: slurm-client\nStatus: install ok installed\nVersion: 24.11.5-4\n\n"
              "Package: munge\nStatus: install ok installed\nVersion: 0.5.16-1\n")
    assert release.dpkg_version(status, "slurm-client") == "24.11.5-4"
    assert release.dpkg_version(status, "slurmd") is None


def test_mmdebstraps_reason_is_its_last_error_line():
    assert last_error("I: a\nE: cannot reach http://m/debian\nW: b\n") == "E: cannot reach http://m/debian"
    assert last_error("I: a\nsomething broke\n") == "something broke"
    assert last_error("") == "no output"


def test_the_in_root_script_runs_a_command_with_the_roots_usr(tmp_path: Path):
    script = release.render_in_root("/var/lib/x/slurm-root")
    assert script.startswith("#!/bin/sh\n") and "root='/var/lib/x/slurm-root'" in script
    assert 'mount --rbind "$0/usr" /usr' in script and "unshare --mount --propagation private" in script
    # an ordinary user maps itself to root in a namespace of its own, binds, then back to its own ids
    assert "unshare --user --map-root-user --mount" in script and '--map-user="$uid" --map-group="$gid"' in script
    # where /usr already is the root's (inside a node) it only runs the command: a root whose
    # usr/bin/scontrol is the machine's own file takes that path here
    fake = tmp_path / "root"
    (fake / "usr" / "bin").mkdir(parents=True)
    (fake / "usr" / "bin" / "scontrol").symlink_to("/usr/bin/env")
    path = tmp_path / "in-root"
    path.write_text(release.render_in_root(str(fake)).replace("/usr/bin/scontrol -ef", "/usr/bin/env -ef"))
    path.chmod(0o755)
    assert subprocess.run([str(path), "/bin/echo", "ran"], capture_output=True, text=True).stdout == "ran\n"
    wrapper = release.render_client_wrapper("/s/bin/in-root", "sbatch")
    assert wrapper == "#!/bin/sh\nexec '/s/bin/in-root' /usr/bin/sbatch \"$@\"\n"


def test_a_layout_of_another_release_has_a_root_wrappers_and_its_settings():
    host = MiniClusterLayout(name="a", state_dir=Path("/s/a"))
    assert host.slurm_root is None and host.client_bin_dir is None
    assert host.command(["/usr/sbin/slurmctld"]) == ["/usr/sbin/slurmctld"]
    assert "SlurmctldParameters" not in conf_text.slurm_conf(host)
    new = MiniClusterLayout(name="b", state_dir=Path("/s/b"), slurm_release="26.05")
    assert new.slurm_root == Path("/s/b/slurm-root") and new.client_bin_dir == Path("/s/b/bin")
    assert new.command(["/usr/sbin/slurmctld"]) == ["/s/b/bin/in-root", "/usr/sbin/slurmctld"]
    assert "SlurmctldParameters=enable_expedited_requeue\n" in conf_text.slurm_conf(new)
    assert "SlurmctldParameters" not in conf_text.slurm_conf(MiniClusterLayout(name="c", state_dir=Path("/s/c"),
                                                                              slurm_release="24.11"))
    with pytest.raises(ValueError, match="unknown Slurm release '23.11'"):
        MiniClusterLayout(name="d", slurm_release="23.11")
    with pytest.raises(ValueError, match="must not contain spaces, quotes"):
        MiniClusterLayout(name="e", state_dir=Path("/s/it's"))


def test_debians_python_has_its_standard_library_carried_into_a_root():
    assert release.python_binds("/usr", (3, 11)) == ["/usr/lib/python3.11"]
    assert release.python_binds("/usr/", (3, 12)) == ["/usr/lib/python3.12"]
    assert release.python_binds("/opt/python-3.11", (3, 11)) == []        # outside /usr: nothing to carry
    script = release.render_in_root("/r", release.python_binds("/usr", (3, 11)))
    assert ("mounts='mount --bind /usr/lib/python3.11 \"$0/usr/lib/python3.11\" && mount --rbind \"$0/usr\" /usr && "
            "mount --bind \"$0/etc/ld.so.cache\" /etc/ld.so.cache'") in script


def test_a_root_is_rebuilt_when_its_package_list_changed(tmp_path: Path):
    import json

    from slurmtools.minicluster import debroot
    stamp = tmp_path / release.ROOT_STAMP
    stamp.write_text(json.dumps({"release": "24.11", "packages": list(release.ROOT_PACKAGES)}))
    assert debroot.root_ready(tmp_path, "24.11") and not debroot.root_ready(tmp_path, "26.05")
    stamp.write_text(json.dumps({"release": "24.11", "packages": ["slurmd"]}))
    assert not debroot.root_ready(tmp_path, "24.11")
    stamp.write_text(json.dumps({"release": "24.11"}))          # a root built before the list was recorded
    assert not debroot.root_ready(tmp_path, "24.11")
