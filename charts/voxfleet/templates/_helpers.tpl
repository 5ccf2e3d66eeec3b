{{/*
Chart name, overridable with nameOverride; 63 characters is the DNS-label limit of names.
*/}}
{{- define "voxfleet.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name: fullnameOverride, else `<release>-<name>` (or the release name alone when it already
contains the chart name), truncated to 63 characters.
*/}}
{{- define "voxfleet.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
A name derived from the full name with a suffix, still within 63 characters: the full name is
cut first so that the suffix survives.
*/}}
{{- define "voxfleet.suffixed" -}}
{{- $root := index . 0 }}
{{- $suffix := index . 1 }}
{{- $base := include "voxfleet.fullname" $root | trunc (int (sub 62 (len $suffix))) | trimSuffix "-" }}
{{- printf "%s-%s" $base $suffix }}
{{- end }}

{{- define "voxfleet.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Selector labels: fixed for the life of a release, because a Deployment's selector is immutable.
*/}}
{{- define "voxfleet.selectorLabels" -}}
app.kubernetes.io/name: {{ include "voxfleet.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
Labels on every object: selector labels, chart and version labels, then commonLabels.
*/}}
{{- define "voxfleet.labels" -}}
helm.sh/chart: {{ include "voxfleet.chart" . }}
{{ include "voxfleet.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: voxfleet
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "voxfleet.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "voxfleet.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
An image reference from {repository, tag, digest}: the digest wins, the tag defaults to the
chart's appVersion.
*/}}
{{- define "voxfleet.image" -}}
{{- $image := index . 0 }}
{{- $root := index . 1 }}
{{- if $image.digest }}
{{- printf "%s@%s" $image.repository $image.digest }}
{{- else }}
{{- printf "%s:%s" $image.repository (default $root.Chart.AppVersion $image.tag) }}
{{- end }}
{{- end }}

{{- define "voxfleet.poolsConfigMapName" -}}
{{- include "voxfleet.suffixed" (list . "pools") }}
{{- end }}

{{/*
The operator's pools file: the values' pools with the default Triton image filled in, in the
shape voxfleet_operator.pools.PoolsConfig reads.
*/}}
{{- define "voxfleet.poolsFile" -}}
{{- $root := . }}
{{- $pools := list }}
{{- range .Values.pools }}
{{- $pool := deepCopy . }}
{{- if not $pool.tritonImage }}
{{- $_ := set $pool "tritonImage" (include "voxfleet.image" (list $root.Values.tritonImage $root)) }}
{{- end }}
{{- $pools = append $pools $pool }}
{{- end }}
{{- $names := list }}
{{- range .Values.pools }}{{ $names = append $names .name }}{{ end }}
{{- if not (has .Values.defaultPool $names) }}
{{- fail (printf "defaultPool %q is not one of the pools: %s" .Values.defaultPool (join ", " $names)) }}
{{- end }}
{{- if ne (len $names) (len (uniq $names)) }}
{{- fail (printf "pool names must be unique, got: %s" (join ", " $names)) }}
{{- end }}
{{- toYaml (dict "defaultPool" .Values.defaultPool "pools" $pools) }}
{{- end }}

{{/*
Latency rules for prometheus-adapter.
- voxfleet_queue_seconds (per pod): the mean wait over the rate window, rate(sum) / rate(count),
  summed over the voices a pod serves.
- voxfleet_first_audio_p95_seconds (per pod; the pool HPAs) and
  voxfleet_voice_first_audio_p95_seconds (per TTSVoice, keyed by the `model` label; the per-voice
  HPAs): the 95th percentile of time to first audio from the stream model's histogram.
An idle pod or voice reports 0 rather than NaN (0/0, or a quantile of empty buckets), so the HPA
can scale it down instead of treating silence as missing data.
*/}}
{{- define "voxfleet.adapterRules" -}}
{{- $window := .Values.prometheusAdapter.rules.rateWindow }}
- seriesQuery: 'voxfleet_queue_seconds_count{namespace!="",pod!=""}'
  resources:
    overrides:
      namespace:
        resource: namespace
      pod:
        resource: pod
  name:
    matches: ^voxfleet_queue_seconds_count$
    as: voxfleet_queue_seconds
  metricsQuery: >-
    sum by (<<.GroupBy>>) (rate(voxfleet_queue_seconds_sum{<<.LabelMatchers>>}[{{ $window }}]))
    / clamp_min(sum by (<<.GroupBy>>) (rate(voxfleet_queue_seconds_count{<<.LabelMatchers>>}[{{ $window }}])), 1e-9)
{{- range $rule := list (dict "key" "pod" "as" "voxfleet_first_audio_p95_seconds" "group" "") (dict "key" "model" "as" "voxfleet_voice_first_audio_p95_seconds" "group" "voxfleet.io") }}
- seriesQuery: 'voxfleet_first_audio_seconds_bucket{namespace!="",{{ $rule.key }}!=""}'
  resources:
    overrides:
      namespace:
        resource: namespace
      {{ $rule.key }}:
        {{- if $rule.group }}
        group: {{ $rule.group }}
        resource: ttsvoices
        {{- else }}
        resource: pod
        {{- end }}
  name:
    matches: ^voxfleet_first_audio_seconds_bucket$
    as: {{ $rule.as }}
  metricsQuery: >-
    (histogram_quantile(0.95, sum by (le, <<.GroupBy>>) (rate(<<.Series>>{<<.LabelMatchers>>}[{{ $window }}]))) >= 0)
    or on (<<.GroupBy>>) (0 * sum by (<<.GroupBy>>) (rate(voxfleet_first_audio_seconds_count{<<.LabelMatchers>>}[{{ $window }}])))
{{- end }}
{{- end }}
