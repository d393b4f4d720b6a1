"""Install every Debian package the cluster tests need, once, before scripts/test.sh runs its
cluster lanes side by side: two pytest processes installing at once would race for dpkg's lock.

Run as root: .venv/bin/python -m tests.prepare  (prints what it installed; exit 1 with one line on failure)
"""
from __future__ import annotations

import sys

from slurmtools.errors import MiniClusterError
from slurmtools.minicluster.packages import install_packages
from tests.browser import CHROMIUM_PACKAGE

# Prometheus, node_exporter and Chromium serve tests/cluster/test_observability.py (which installs
# them itself when run alone); mmdebstrap builds the other releases' roots.
OBSERVABILITY_PACKAGES = ("prometheus", "prometheus-node-exporter", CHROMIUM_PACKAGE)
TEST_PACKAGES = ("mmdebstrap", *OBSERVABILITY_PACKAGES)


def main() -> int:
    try:
        installed = install_packages(TEST_PACKAGES)
    except MiniClusterError as error:
        print(f"tests.prepare: {error}", file=sys.stderr)
        return 1
    print(f"tests.prepare: installed {' '.join(installed)}" if installed else "tests.prepare: nothing missing")
    return 0


if __name__ == "__main__":
    sys.exit(main())
