"""The chart's prometheus-adapter rules, evaluated against a real Prometheus.

prometheus-adapter is a Go binary (it serves `custom.metrics.k8s.io` inside a cluster) that
cannot be installed here. This module does what it does for the rules the chart ships
(`charts/voxfleet/templates/configmap-adapter-rules.yaml`, the same text as
`charts/voxfleet/prometheus-adapter-values.yaml` and `manifests/prometheus-adapter-rules.yaml`),
through `prometheus-api-client`:

- discovery: each rule's `seriesQuery` is sent to `/api/v1/series`; a series name that
  `name.matches` becomes the metric `name.as` (a regexp replacement, `$1` style, as Go's
  `ReplaceAllString`), for every resource its `resources.overrides` (or
  `resources.template`) maps a label of the series to;
- a request (pods of a namespace with a selector, or one named object) renders the rule's
  `metricsQuery` as prometheus-adapter does: `<<.Series>>` is the discovered series name,
  `<<.LabelMatchers>>` is `namespace="ns"` plus the resource label equal to the one name
  (or `=~"a|b"` for several), `<<.GroupBy>>` is the resource label; the instant query's
  samples are read back by that label;
- values are returned as prometheus-adapter hands them to the HPA: whole milli-units
  (`int64(value * 1000)`, truncated); a NaN or missing sample means no value for that object.

Not emulated: `seriesFilters`, `metricsQuery` templates beyond the variables above (the
chart uses none), external-metrics rules (the chart has none), the adapter's discovery
interval (a metric once discovered keeps its rule and series; discovery runs again when a
request names a metric not found yet, so series that appear later are found at once), and
its API server (callers get Python values).
"""

from __future__ import annotations

import math
import re
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import yaml
from prometheus_api_client import PrometheusConnect

from autoscale.hpa import MetricUnavailable, PodSample

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "voxfleet"
NAMESPACE_RESOURCE = ("", "namespaces")
# The window kube-controller-manager's custom-metrics client assigns to every sample.
CUSTOM_WINDOW_S = 60.0
# Series seen this recently count, as with prometheus-adapter's --metrics-max-age default.
DISCOVERY_SECONDS = 600

_TEMPLATE_VAR = re.compile(r"<<\s*\.(\w+)\s*>>")
_GO_GROUP = re.compile(r"\$\{?(\d+)\}?")


def _resource_key(resource: str, group: str = "") -> tuple[str, str]:
    """(group, plural resource), the way the adapter's REST mapper names a resource."""
    name = resource.lower()
    if "." in name and not group:
        name, group = name.split(".", 1)
    if not name.endswith("s"):
        name += "s"
    return group, name


def resource_of_kind(api_version: str, kind: str) -> tuple[str, str]:
    group = api_version.rsplit("/", 1)[0] if "/" in api_version else ""
    return _resource_key(kind, group)


@dataclass(frozen=True)
class AdapterRule:
    """One entry of prometheus-adapter's `rules` (custom metrics)."""

    series_query: str
    metrics_query: str
    name_matches: str
    name_as: str
    resource_labels: Mapping[str, tuple[str, str]]

    @classmethod
    def from_config(cls, rule: Mapping[str, Any]) -> AdapterRule:
        resources = rule.get("resources") or {}
        if "template" in resources:
            raise ValueError("resources.template rules are not emulated; use overrides")
        labels = {
            label: _resource_key(target["resource"], target.get("group", ""))
            for label, target in (resources.get("overrides") or {}).items()
        }
        name = rule.get("name") or {}
        matches = name.get("matches") or ".*"
        default_as = "$1" if re.compile(matches).groups == 1 else "$0"
        return cls(
            series_query=rule["seriesQuery"],
            metrics_query=rule["metricsQuery"],
            name_matches=matches,
            name_as=name.get("as") or default_as,
            resource_labels=labels,
        )

    def metric_name(self, series: str) -> str | None:
        """The metric a series name becomes, or None when `name.matches` does not match."""
        pattern = re.compile(self.name_matches)
        if not pattern.search(series):
            return None
        replacement = _GO_GROUP.sub(r"\\g<\1>", self.name_as)
        return pattern.sub(replacement, series)

    def label_for(self, resource: tuple[str, str]) -> str | None:
        for label, target in self.resource_labels.items():
            if target == resource:
                return label
        return None

    def render(
        self, series: str, resource: tuple[str, str], namespace: str | None, names: Sequence[str]
    ) -> str:
        """The `metricsQuery` text for `names` of `resource`, as the adapter builds it."""
        label = self.label_for(resource)
        if label is None:
            raise MetricUnavailable(f"rule for {series} has no label for resource {resource}")
        matchers = []
        if namespace is not None:
            namespace_label = self.label_for(NAMESPACE_RESOURCE)
            if namespace_label is None:
                raise MetricUnavailable(f"rule for {series} has no namespace label")
            matchers.append(f'{namespace_label}="{namespace}"')
        if len(names) == 1:
            matchers.append(f'{label}="{names[0]}"')
        else:
            matchers.append(f'{label}=~"{"|".join(names)}"')
        values = {"Series": series, "LabelMatchers": ",".join(matchers), "GroupBy": label}

        def substitute(match: re.Match[str]) -> str:
            key = match.group(1)
            if key not in values:
                raise ValueError(f"metricsQuery variable .{key} is not emulated")
            return values[key]

        return _TEMPLATE_VAR.sub(substitute, self.metrics_query)


def rules_from_config(text: str) -> list[AdapterRule]:
    """Rules from prometheus-adapter's config file (`rules:`) or its chart's values
    (`rules.custom`)."""
    document = yaml.safe_load(text)
    rules = document["rules"]
    if isinstance(rules, Mapping):
        rules = rules.get("custom") or []
    return [AdapterRule.from_config(r) for r in rules]


def rules_from_chart(helm: str, *helm_args: str, chart: Path = CHART) -> list[AdapterRule]:
    """The rules the chart renders into its adapter ConfigMap, via `helm template`."""
    result = subprocess.run(
        [helm, "template", "voxfleet", str(chart), *helm_args],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    if result.returncode != 0:
        raise RuntimeError(f"helm template failed: {result.stderr}")
    for document in yaml.safe_load_all(result.stdout):
        if document and document.get("kind") == "ConfigMap":
            config = (document.get("data") or {}).get("config.yaml")
            if config:
                return rules_from_config(config)
    raise RuntimeError("the chart rendered no adapter rules ConfigMap")


def adapter_milli(value: float) -> int:
    """A sample as prometheus-adapter returns it: int64(value * 1000), truncated."""
    return int(value * 1000)


ListPods = Callable[[str, Mapping[str, str] | None], Sequence[str]]


class PrometheusAdapter:
    """The custom metrics API of prometheus-adapter over the given rules and Prometheus.

    `list_pods(namespace, selector)` names the pods a Pods-metric request covers, as the
    adapter lists them from the Kubernetes API.
    """

    def __init__(self, prometheus_url: str, rules: Sequence[AdapterRule], list_pods: ListPods):
        self.prometheus = PrometheusConnect(url=prometheus_url, disable_ssl=True)
        self.rules = list(rules)
        self.list_pods = list_pods
        self.queries: list[str] = []
        self._discovered: dict[tuple[str, tuple[str, str]], tuple[AdapterRule, str]] = {}

    def discover(self) -> dict[tuple[str, tuple[str, str]], tuple[AdapterRule, str]]:
        """(metric name, resource) -> (rule, series name), as the adapter's discovery finds."""
        found: dict[tuple[str, tuple[str, str]], tuple[AdapterRule, str]] = {}
        end = datetime.now(timezone.utc)
        start = end - timedelta(seconds=DISCOVERY_SECONDS)
        for rule in self.rules:
            series_found = self.prometheus.get_series(
                start, end, params={"match[]": rule.series_query}
            )
            for labels in series_found:
                series = labels["__name__"]
                metric = rule.metric_name(series)
                if metric is None:
                    continue
                for label, resource in rule.resource_labels.items():
                    if label in labels:
                        found.setdefault((metric, resource), (rule, series))
        return found

    def _query(
        self, metric: str, resource: tuple[str, str], namespace: str, names: Sequence[str]
    ) -> dict[str, tuple[float, float]]:
        """(value, evaluation time) per object name."""
        entry = self._discovered.get((metric, resource))
        if entry is None:
            self._discovered = self.discover()
            entry = self._discovered.get((metric, resource))
        if entry is None:
            raise MetricUnavailable(f"no series for {metric} on {resource[1]} (yet)")
        rule, series = entry
        query = rule.render(series, resource, namespace, names)
        self.queries.append(query)
        label = rule.label_for(resource)
        values: dict[str, tuple[float, float]] = {}
        for sample in self.prometheus.custom_query(query):
            name = sample["metric"].get(label)
            timestamp, value = float(sample["value"][0]), float(sample["value"][1])
            if name is not None and not math.isnan(value):
                values[name] = (value, timestamp)
        return values

    def pod_metric(
        self, namespace: str, metric: str, selector: Mapping[str, str] | None
    ) -> dict[str, PodSample]:
        pods = list(self.list_pods(namespace, selector))
        if not pods:
            raise MetricUnavailable(f"no pods match {selector} in {namespace}")
        values = self._query(metric, ("", "pods"), namespace, pods)
        # The HPA's custom-metrics client gives every sample a one-minute window.
        return {
            name: PodSample(adapter_milli(v) / 1000, timestamp=t, window_seconds=CUSTOM_WINDOW_S)
            for name, (v, t) in values.items()
        }

    def object_metric(
        self,
        namespace: str,
        metric: str,
        described_object: Mapping[str, str],
        selector: Mapping[str, str] | None,
    ) -> float:
        resource = resource_of_kind(described_object["apiVersion"], described_object["kind"])
        name = described_object["name"]
        values = self._query(metric, resource, namespace, [name])
        if name not in values:
            raise MetricUnavailable(f"no {metric} for {described_object['kind']} {name}")
        return adapter_milli(values[name][0]) / 1000

    def external_metric(
        self, namespace: str, metric: str, selector: Mapping[str, str] | None
    ) -> list[float]:
        raise MetricUnavailable("the chart ships no external-metrics rules")
