{{/* Chart name, truncated to the 63 characters a label value allows. */}}
{{- define "gpu-labeller.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: the release name, unless it already contains the chart name. */}}
{{- define "gpu-labeller.fullname" -}}
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

{{- define "gpu-labeller.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride }}
{{- end }}

{{- define "gpu-labeller.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* Labels on every object. */}}
{{- define "gpu-labeller.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "gpu-labeller.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gpu-labeller
{{- end }}

{{/* Selector labels of one component: include with (dict "ctx" $ "component" "labeller"). */}}
{{- define "gpu-labeller.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpu-labeller.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "gpu-labeller.labellerServiceAccount" -}}
{{- default (include "gpu-labeller.fullname" .) .Values.labeller.serviceAccount.name }}
{{- end }}

{{- define "gpu-labeller.devicePluginServiceAccount" -}}
{{- default (printf "%s-device-plugin" (include "gpu-labeller.fullname" .)) .Values.devicePlugin.serviceAccount.name }}
{{- end }}

{{/* "true" when the labeller talks to the API server: every output but the features.d file, and
     Events. Without it the labeller gets no RBAC and no ServiceAccount token. */}}
{{- define "gpu-labeller.labellerNeedsApi" -}}
{{- or (ne .Values.labeller.output "features-file") .Values.labeller.events.enabled }}
{{- end }}

{{/* The user name the API server gives the labeller's ServiceAccount tokens. */}}
{{- define "gpu-labeller.labellerUsername" -}}
{{- printf "system:serviceaccount:%s:%s" (include "gpu-labeller.namespace" .) (include "gpu-labeller.labellerServiceAccount" .) }}
{{- end }}

{{/* Annotations on both pod templates: a config change rolls the pods. */}}
{{- define "gpu-labeller.podAnnotations" -}}
checksum/config: {{ include (print .Template.BasePath "/configmap.yaml") . | sha256sum }}
{{- with .Values.podAnnotations }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "gpu-labeller.tolerations" -}}
{{- $tolerations := .Values.tolerations }}
{{- if .Values.tolerateAllTaints }}
{{- $tolerations = list (dict "operator" "Exists") }}
{{- end }}
{{- with $tolerations -}}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* Container hardening shared by both components (the pod-level user differs); pass
     (dict "add" (list ...)) for the capabilities an enabled feature needs. */}}
{{- define "gpu-labeller.containerSecurityContext" -}}
privileged: false
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
  {{- with .add }}
  add: {{ toJson . }}
  {{- end }}
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* Downward-API environment shared by both components. */}}
{{- define "gpu-labeller.downwardEnv" -}}
- name: NODE_NAME
  valueFrom:
    fieldRef:
      fieldPath: spec.nodeName
- name: NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
{{- end }}
