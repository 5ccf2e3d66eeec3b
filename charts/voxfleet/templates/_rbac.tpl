{{/*
What the operator does in a namespace it watches, and nothing more. Each rule names the
operator code path that needs it.
*/}}
{{- define "voxfleet.namespacedRules" -}}
# Reconciling voices: read and watch them, add and remove the finalizer (patch), and write
# status through the status subresource.
- apiGroups: ["voxfleet.io"]
  resources: ["ttsvoices"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["voxfleet.io"]
  resources: ["ttsvoices/status"]
  verbs: ["get", "patch"]
# Children carry owner references with blockOwnerDeletion; the API server asks for this.
- apiGroups: ["voxfleet.io"]
  resources: ["ttsvoices/finalizers"]
  verbs: ["update"]
# The children: engine-build Jobs, the pool Deployment, per-voice (ClusterIP and headless) and
# metrics Services, the pool's HPA, PDB and ServiceMonitor, and the speech API's Deployment
# and Service.
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["create", "get", "list", "watch", "patch", "delete"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["create", "get", "list", "watch", "patch", "delete"]
- apiGroups: [""]
  resources: ["services"]
  verbs: ["create", "get", "list", "watch", "patch", "delete"]
- apiGroups: ["autoscaling"]
  resources: ["horizontalpodautoscalers"]
  verbs: ["create", "get", "list", "watch", "patch", "delete"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["create", "get", "list", "watch", "patch", "delete"]
- apiGroups: ["monitoring.coreos.com"]
  resources: ["servicemonitors"]
  verbs: ["create", "get", "list", "watch", "patch", "delete"]
# The namespace's own repository key (the operator makes it at random) for the pool's Triton
# pods and the operator's load calls. Creating cannot be narrowed to a name in RBAC; reading,
# watching (a watch asks for that name) and changing are limited to that one Secret, so the
# operator can never read other Secrets.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["create"]
- apiGroups: [""]
  resources: ["secrets"]
  resourceNames: ["voxfleet-repository-key"]
  verbs: ["get", "list", "watch", "patch", "delete"]
{{- if .Values.speechApi.enabled }}
# The speech API gateway's voice table: one ConfigMap per namespace, `voxfleet-speech-api`.
# Creating cannot be narrowed to a name; reading and changing are that one object's.
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["create"]
- apiGroups: [""]
  resources: ["configmaps"]
  resourceNames: ["voxfleet-speech-api"]
  verbs: ["get", "patch", "delete"]
{{- end }}
# The engine-cache claim: read only to report it missing (EngineCacheMissing).
- apiGroups: [""]
  resources: ["persistentvolumeclaims"]
  verbs: ["get"]
# Pool pods: found by label, labelled with the voices loaded on them.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "patch"]
# kopf reports handler progress and failures as Events on the voice.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- end }}
