"""Fixtures for the operator's end-to-end tests; the machinery is in operator_harness.py."""

from operator_harness import api, operator

__all__ = ["api", "operator"]
