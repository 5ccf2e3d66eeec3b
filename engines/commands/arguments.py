"""Argument types the subcommands share: a bad value gets argparse's error with a reason."""

from __future__ import annotations

import argparse
import math


def _number_of_seconds(value: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {value!r}") from None


def seconds(value: str) -> float:
    """0 or more seconds, finite."""
    number = _number_of_seconds(value)
    if not number >= 0 or math.isinf(number):
        raise argparse.ArgumentTypeError(f"expected 0 or more seconds, got {value!r}")
    return number


def positive_seconds(value: str) -> float:
    """More than 0 seconds, finite."""
    number = _number_of_seconds(value)
    if not number > 0 or math.isinf(number):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {value!r}")
    return number
