{{/* The operator's name: every object's, as in manifests/operator (its ClusterRoles are cluster-wide, so one
release per cluster). */}}
{{- define "hpc-bridge.name" -}}hpcbridge-operator{{- end }}

{{- define "hpc-bridge.labels" -}}
app.kubernetes.io/name: {{ include "hpc-bridge.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{- define "hpc-bridge.selector" -}}
app.kubernetes.io/name: {{ include "hpc-bridge.name" . }}
{{- end }}

{{- define "hpc-bridge.subject" -}}
- kind: ServiceAccount
  name: {{ include "hpc-bridge.name" . }}
  namespace: {{ .Release.Namespace }}
{{- end }}
