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
Rules for prometheus-adapter, each per pod (the pool HPAs) and per TTSVoice (keyed by the
stream model's `model` label; the per-voice HPAs):
- voxfleet_load_ratio (per pod): the load of the pods the HPA asks about, taken together:
  their mean live streams over the window (the rate of voxfleet_stream_seconds_total, which
  counts every moment a stream is live, where scrapes of the live-streams gauge sample a few)
  over their count times the mean of the real-time streams each holds by its own measurement
  (the largest of its architectures', averaged over capacityWindow, the measures it has made;
  pods that have not measured yet count at that mean), the same for each pod. The capacity's
  longer window keeps its measuring noise out of the load; the streams follow a step at once.
  Both were the load's swings that held an unneeded pod. It rises with overload
  (a pod at 1 refuses new streams) and falls with idleness. Averaging each pod's own ratio
  instead made the HPA see load that was not there: with streams split unevenly (one client
  per listener), a pod holding three streams that just read its capacity low counted for
  more than the idle pod beside it, and one such moment in the five minutes of scale-down
  stabilization held a pod that was not needed. A pool with no measured pod reports each
  pod's own ratio (0).
- voxfleet_voice_load_pods (per TTSVoice): the voice's live streams on each pod over that pod's
  capacity, summed over its pods: how many pods' worth of streams the voice has. Pods that have
  not measured their capacity yet (never busy) count nothing.
- voxfleet_first_audio_p95_seconds and voxfleet_voice_first_audio_p95_seconds: the 95th
  percentile of time to first audio from the stream model's histogram.
An idle pod or voice reports 0 rather than NaN (0/0, or a quantile of empty buckets), so the HPA
can scale it down instead of treating silence as missing data.
*/}}
{{- define "voxfleet.adapterRules" -}}
{{- $window := .Values.prometheusAdapter.rules.rateWindow }}
{{- $capacityWindow := .Values.prometheusAdapter.rules.capacityWindow }}
{{- $keys := list (dict "key" "pod" "prefix" "voxfleet_") (dict "key" "model" "prefix" "voxfleet_voice_") }}
- seriesQuery: 'voxfleet_load_ratio{namespace!="",pod!=""}'
  resources:
    overrides:
      {{- include "voxfleet.adapterOverrides" (dict "key" "pod") | nindent 6 }}
  name:
    matches: ^voxfleet_load_ratio$
    as: voxfleet_load_ratio
  metricsQuery: >-
    (0 * max by (<<.GroupBy>>) (avg_over_time(<<.Series>>{<<.LabelMatchers>>}[{{ $window }}]))
    + scalar(sum(rate(voxfleet_stream_seconds_total{<<.LabelMatchers>>}[{{ $window }}]))
    / (avg(max by (<<.GroupBy>>) (avg_over_time((voxfleet_capacity_streams{<<.LabelMatchers>>} > 0)[{{ $capacityWindow }}:15s])))
    * count(max by (<<.GroupBy>>) (avg_over_time(<<.Series>>{<<.LabelMatchers>>}[{{ $window }}]))))))
    >= 0
    or max by (<<.GroupBy>>) (avg_over_time(<<.Series>>{<<.LabelMatchers>>}[{{ $window }}]))
- seriesQuery: 'voxfleet_live_streams{namespace!="",model!=""}'
  resources:
    overrides:
      {{- include "voxfleet.adapterOverrides" (dict "key" "model") | nindent 6 }}
  name:
    matches: ^voxfleet_live_streams$
    as: voxfleet_voice_load_pods
  metricsQuery: >-
    (sum by (<<.GroupBy>>) (avg_over_time(voxfleet_live_streams{<<.LabelMatchers>>}[{{ $window }}])
    / (avg_over_time(voxfleet_capacity_streams{<<.LabelMatchers>>}[{{ $window }}]) > 0)))
    or on (<<.GroupBy>>) (0 * sum by (<<.GroupBy>>) (voxfleet_live_streams{<<.LabelMatchers>>}))
{{- range $rule := $keys }}
- seriesQuery: 'voxfleet_first_audio_seconds_bucket{namespace!="",{{ $rule.key }}!=""}'
  resources:
    overrides:
      {{- include "voxfleet.adapterOverrides" $rule | nindent 6 }}
  name:
    matches: ^voxfleet_first_audio_seconds_bucket$
    as: {{ $rule.prefix }}first_audio_p95_seconds
  metricsQuery: >-
    (histogram_quantile(0.95, sum by (le, <<.GroupBy>>) (rate(<<.Series>>{<<.LabelMatchers>>}[{{ $window }}]))) >= 0)
    or on (<<.GroupBy>>) (0 * sum by (<<.GroupBy>>) (rate(voxfleet_first_audio_seconds_count{<<.LabelMatchers>>}[{{ $window }}])))
{{- end }}
{{- end }}

{{/* The resources a rule's key label maps to: a pod, or (the `model` label) a TTSVoice. */}}
{{- define "voxfleet.adapterOverrides" -}}
namespace:
  resource: namespace
{{ .key }}:
  {{- if eq .key "model" }}
  group: voxfleet.io
  resource: ttsvoices
  {{- else }}
  resource: pod
  {{- end }}
{{- end }}

{{/*
The operator's speech API settings (voxfleet_operator.speech_api.SpeechApiConfig), as JSON.
*/}}
{{- define "voxfleet.speechApiFile" -}}
{{- $api := .Values.speechApi }}
{{- $settings := dict "enabled" $api.enabled "image" (include "voxfleet.image" (list $api.image .)) "imagePullPolicy" $api.image.pullPolicy "replicas" $api.replicas "resources" $api.resources "voiceAliases" $api.voiceAliases }}
{{- with $api.defaultVoice }}{{ $_ := set $settings "defaultVoice" . }}{{ end }}
{{- with $api.apiKeysSecret }}{{ $_ := set $settings "apiKeysSecret" . }}{{ end }}
{{- toJson $settings }}
{{- end }}
