{{- define "servingtopology.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "servingtopology.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains (include "servingtopology.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "servingtopology.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "servingtopology.selectorLabels" -}}
app.kubernetes.io/name: {{ include "servingtopology.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "servingtopology.labels" -}}
{{ include "servingtopology.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: servingtopology
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "servingtopology.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "servingtopology.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* A Kubernetes memory quantity (bytes, or with a Ki/Mi/Gi/Ti or k/M/G/T suffix) in MiB. */}}
{{- define "servingtopology.mebibytes" -}}
{{- $q := toString . -}}
{{- $units := list (list "Ki" 1024.0) (list "Mi" 1048576.0) (list "Gi" 1073741824.0) (list "Ti" 1099511627776.0) (list "k" 1000.0) (list "M" 1000000.0) (list "G" 1000000000.0) (list "T" 1000000000000.0) -}}
{{- $bytes := 0.0 -}}
{{- $found := false -}}
{{- range $units -}}
{{- if and (not $found) (hasSuffix (index . 0) $q) -}}
{{- $bytes = mulf (float64 (trimSuffix (index . 0) $q)) (index . 1) -}}
{{- $found = true -}}
{{- end -}}
{{- end -}}
{{- if not $found -}}{{- $bytes = float64 $q -}}{{- end -}}
{{- divf $bytes 1048576.0 -}}
{{- end -}}

{{/* The memory the operator may use with its plan processes at their budgets, in MiB (operator/entry/main.py,
     memory_needed_mib): slots x (plan budget + 64 MiB a plan process may copy) + 64 MiB planner processes + 192 MiB
     the operator's own resident size. */}}
{{- define "servingtopology.memoryNeededMiB" -}}
{{- $plan := .Values.operator.plan -}}
{{- add (mul (int $plan.slots) (add (int $plan.memoryMiB) 64)) 64 192 -}}
{{- end -}}

{{/* "true" when the PodMonitors are rendered: podMonitors.enabled, and the cluster serves monitoring.coreos.com/v1
     PodMonitor (the Prometheus Operator's CRD) or podMonitors.assumeCRD says it will (helm template without
     --api-versions cannot see the cluster). Empty otherwise: NOTES then says why none were installed. */}}
{{- define "servingtopology.podMonitors" -}}
{{- if and .Values.podMonitors.enabled (or (.Capabilities.APIVersions.Has "monitoring.coreos.com/v1/PodMonitor") .Values.podMonitors.assumeCRD) -}}
true
{{- end -}}
{{- end -}}

{{/* "true" when the operator's ServiceMonitor is rendered (metrics.serviceMonitor.enabled and the CRD served or assumed). */}}
{{- define "servingtopology.serviceMonitor" -}}
{{- if and .Values.metrics.enabled .Values.metrics.serviceMonitor.enabled (or (.Capabilities.APIVersions.Has "monitoring.coreos.com/v1/ServiceMonitor") .Values.metrics.serviceMonitor.assumeCRD) -}}
true
{{- end -}}
{{- end -}}
