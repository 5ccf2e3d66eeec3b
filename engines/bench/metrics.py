"""Batch sizes that a model reports on Triton's metrics port (Prometheus text format).

Triton's own per-batch-size statistics only see the batches Triton forms. voxfleet's stream
model batches inside itself (one vocoder call for the windows of many streams), so it counts
those calls in `voxfleet_vocoder_batches_total{model=..., batch_size=...}`; this module reads
that counter so the benchmark can show the batching it measured, next to Triton's numbers.
"""

from __future__ import annotations

import re
import urllib.error
import urllib.request

BATCH_METRIC = "voxfleet_vocoder_batches_total"

_SAMPLE = re.compile(
    r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+"
    r"(?P<value>[-+0-9.eE]+|NaN|[+-]Inf)(?:\s+\d+)?$"
)
_LABEL = re.compile(r'(?P<key>[a-zA-Z_][a-zA-Z0-9_]*)="(?P<value>(?:[^"\\]|\\.)*)"')


def parse_batch_counts(text: str, metric: str = BATCH_METRIC) -> dict[str, dict[int, int]]:
    """{model: {batch size: calls}} from a metrics page; models without the metric are absent."""
    counts: dict[str, dict[int, int]] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line.strip())
        if not match or match["name"] != metric:
            continue
        labels = {m["key"]: m["value"] for m in _LABEL.finditer(match["labels"] or "")}
        size = labels.get("batch_size")
        if size is None or not size.isdigit():
            continue
        model = f"{labels.get('model', '?')} (vocoder)"
        value = float(match["value"])
        # A voice served by several instances has a series per instance: they add up.
        sizes = counts.setdefault(model, {})
        sizes[int(size)] = sizes.get(int(size), 0) + int(value)
    return counts


def fetch_batch_counts(metrics_url: str, timeout_s: float = 5.0) -> dict[str, dict[int, int]]:
    try:
        with urllib.request.urlopen(metrics_url, timeout=timeout_s) as response:
            text = response.read().decode("utf-8", errors="replace")
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return {}
    return parse_batch_counts(text)
