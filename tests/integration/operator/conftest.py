"""Fixtures for the operator's end-to-end tests; the machinery is in operator_harness.py."""

from operator_harness import api, control_plane, operator

__all__ = ["api", "control_plane", "operator"]
