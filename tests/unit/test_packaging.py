"""What users install: the extras leave a user's own framework release in place."""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_extras_accept_a_range_and_the_tests_pin_what_they_run():
    """Installing `slurmtools[lightning]` must not replace a user's Lightning with the one release
    the tests run: the extras give a range, the test environment's pins are scripts/test-pins.txt."""
    import configparser
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    extras = config["options.extras_require"]
    pins = dict(line.split("==") for line in (ROOT / "scripts" / "test-pins.txt").read_text().splitlines()
                if line and not line.startswith("#"))
    for extra, package in (("lightning", "lightning"), ("transformers", "transformers"),
                           ("transformers", "accelerate")):
        requirement = next(line.strip() for line in extras[extra].splitlines() if line.strip().startswith(package))
        assert "==" not in requirement and f">={'.'.join(pins[package].split('.')[:2])}," in requirement, requirement
    assert "-c scripts/test-pins.txt" in (ROOT / "scripts" / "bootstrap.sh").read_text()
