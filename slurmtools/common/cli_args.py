"""argparse types shared by the CLI's command modules: every bad number is one line, exit 2."""
from __future__ import annotations

import argparse
import math
from typing import Callable, TypeVar

Number = TypeVar("Number", int, float)
MAX_CLI_NUMBER = 1e12


def positive(kind: Callable[[str], Number]) -> Callable[[str], Number]:
    """argparse type: a finite number >= 0 (NaN, infinity and huge values are refused)."""
    def parse(text: str) -> Number:
        if not text.isascii() or len(text) > 32:
            raise argparse.ArgumentTypeError(f"not a number (or too long to be one): {text[:40]!r}")
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not math.isfinite(value) or value > MAX_CLI_NUMBER:
            raise argparse.ArgumentTypeError(f"must be a finite number <= {MAX_CLI_NUMBER:g}, got {text}")
        if value < 0:
            raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
        return value
    return parse
