{{- define "rft-operator.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "rft-operator.labels" -}}
app.kubernetes.io/name: rft-operator
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "rft-operator.selectorLabels" -}}
app.kubernetes.io/name: rft-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "rft-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "rft-operator.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}
