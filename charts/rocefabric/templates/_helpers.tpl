{{/*
Names. Everything is prefixed with the release's full name so two releases never collide.
*/}}
{{- define "rocefabric.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "rocefabric.fullname" -}}
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

{{- define "rocefabric.operator.fullname" -}}
{{- printf "%s-operator" (include "rocefabric.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "rocefabric.node.fullname" -}}
{{- printf "%s-node" (include "rocefabric.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "rocefabric.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels. `component` is part of the selector so the operator and node pods never match each other.
*/}}
{{- define "rocefabric.labels" -}}
helm.sh/chart: {{ include "rocefabric.chart" . }}
app.kubernetes.io/part-of: rocefabric
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- if .Chart.AppVersion }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}
{{- end }}

{{- define "rocefabric.operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rocefabric.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "rocefabric.node.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rocefabric.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: node
{{- end }}

{{- define "rocefabric.operator.labels" -}}
{{ include "rocefabric.labels" . }}
{{ include "rocefabric.operator.selectorLabels" . }}
{{- end }}

{{- define "rocefabric.node.labels" -}}
{{ include "rocefabric.labels" . }}
{{ include "rocefabric.node.selectorLabels" . }}
{{- end }}

{{- define "rocefabric.operator.serviceAccountName" -}}
{{- if .Values.operator.serviceAccount.create }}
{{- default (include "rocefabric.operator.fullname" .) .Values.operator.serviceAccount.name }}
{{- else }}
{{- required "operator.serviceAccount.name is required when operator.serviceAccount.create is false" .Values.operator.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "rocefabric.node.serviceAccountName" -}}
{{- if .Values.node.serviceAccount.create }}
{{- default (include "rocefabric.node.fullname" .) .Values.node.serviceAccount.name }}
{{- else }}
{{- required "node.serviceAccount.name is required when node.serviceAccount.create is false" .Values.node.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
DRA (node.mode `dra` or `both`): "true", else empty, for `if include`. The driver name is fixed: the
daemon publishes its ResourceSlices under it and the DeviceClasses select on it.
*/}}
{{- define "rocefabric.node.dra" -}}
{{- if has .Values.node.mode (list "dra" "both") }}true{{ end }}
{{- end }}

{{- define "rocefabric.draDriver" -}}
rocefabric.io
{{- end }}

{{/*
An image reference: repository:tag, the tag defaulting to the chart's appVersion; a digest wins.
Call with (dict "image" .Values.operator.image "root" .)
*/}}
{{- define "rocefabric.image" -}}
{{- if .image.digest }}
{{- printf "%s@%s" .image.repository .image.digest }}
{{- else }}
{{- printf "%s:%s" .image.repository (default .root.Chart.AppVersion .image.tag) }}
{{- end }}
{{- end }}

{{/*
A CRD from files/crds/<file>, byte-for-byte the generated crds/<file>, with the chart's annotations and
labels spliced into its metadata. The YAML is not parsed and re-serialized, so the schema reaches the API
server exactly as `crdgen` wrote it.
Call with (dict "file" "rocefabrics.rocefabric.io.yaml" "root" .)
*/}}
{{- define "rocefabric.crd" -}}
{{- $path := printf "files/crds/%s" .file }}
{{- $body := .root.Files.Get $path }}
{{- if not $body }}
{{- fail (printf "%s is missing from the chart: copy it from crds/ (see the chart README)" $path) }}
{{- end }}
{{- if not (regexMatch "(?m)^metadata:\\n  name: " $body) }}
{{- fail (printf "%s: expected a top-level 'metadata:' followed by 'name:'" $path) }}
{{- end }}
{{- $meta := "metadata:\n" }}
{{- if .root.Values.crds.keep }}
{{- $meta = printf "%s  annotations:\n    helm.sh/resource-policy: keep\n" $meta }}
{{- end }}
{{- $meta = printf "%s  labels:\n%s\n" $meta (include "rocefabric.labels" .root | indent 4) }}
{{- regexReplaceAll "(?m)^metadata:\\n" $body $meta }}
{{- end }}

{{/*
The pod-level and container-level security settings every container of the chart starts from.
*/}}
{{- define "rocefabric.seccomp" -}}
seccompProfile:
  type: RuntimeDefault
{{- end }}
