{{/* The chart's name, or nameOverride. */}}
{{- define "specdeploy.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* <release>-<chart>, or fullnameOverride; the release name alone when it contains the chart's. */}}
{{- define "specdeploy.fullname" -}}
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

{{/* Labels of every object of the release. */}}
{{- define "specdeploy.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "specdeploy.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: specdeploy
{{- end }}

{{/* Labels that select the operator pod. */}}
{{- define "specdeploy.selectorLabels" -}}
app.kubernetes.io/name: {{ include "specdeploy.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/* The ServiceAccount the operator runs as. */}}
{{- define "specdeploy.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "specdeploy.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The operator image reference: the digest wins over the tag. */}}
{{- define "specdeploy.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* The operator config file: the values' config plus the probe and metrics endpoints and
the Lease's namespace (the release's, where the chart grants access to it). */}}
{{- define "specdeploy.config" -}}
{{- $endpoints := dict "livenessEndpoint" (printf "http://0.0.0.0:%d%s" (int .Values.probes.port) .Values.probes.path) "metricsEndpoint" (printf "http://0.0.0.0:%d/metrics" (int .Values.metrics.port)) }}
{{- $config := merge $endpoints (deepCopy .Values.config) }}
{{- $_ := set $config "leaderElection" (merge (dict "namespace" .Release.Namespace) (deepCopy .Values.leaderElection)) }}
{{- toYaml $config }}
{{- end }}
