{{/*
Name of the chart, or nameOverride; also the app.kubernetes.io/name label.
*/}}
{{- define "abstain.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Fully qualified name for resources: fullnameOverride, else "<release>-<name>" (just the
release name when it already contains the chart name). Truncated to 63 characters, the DNS
label limit.
*/}}
{{- define "abstain.fullname" -}}
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
Chart name and version, for the helm.sh/chart label.
*/}}
{{- define "abstain.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels on every resource.
*/}}
{{- define "abstain.labels" -}}
helm.sh/chart: {{ include "abstain.chart" . }}
{{ include "abstain.selectorLabels" . }}
app.kubernetes.io/component: worker
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/*
Selector labels: stable for the life of a release (Deployment selectors are immutable).
*/}}
{{- define "abstain.selectorLabels" -}}
app.kubernetes.io/name: {{ include "abstain.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
ServiceAccount name.
*/}}
{{- define "abstain.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "abstain.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
Container image reference: repository@digest when a digest is given, else repository:tag
with the tag defaulting to the chart's appVersion.
*/}}
{{- define "abstain.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/*
Whether the Kafka protocol uses SASL / TLS.
*/}}
{{- define "abstain.kafkaSasl" -}}
{{- if hasPrefix "SASL" .Values.kafka.securityProtocol }}true{{ end }}
{{- end }}

{{- define "abstain.kafkaTls" -}}
{{- if hasSuffix "SSL" .Values.kafka.securityProtocol }}true{{ end }}
{{- end }}

{{/*
Name of the Secret holding the label token and the SASL password, and whether the chart
creates it (only when no existingSecret is named and some secret value is given).
*/}}
{{- define "abstain.secretName" -}}
{{- default (include "abstain.fullname" .) .Values.secrets.existingSecret }}
{{- end }}

{{- define "abstain.createSecret" -}}
{{- $s := .Values.secrets }}
{{- if and (not $s.existingSecret) (or $s.labelToken $s.saslPassword $s.snapshotKey $s.snapshotKeyPrevious) }}true{{ end }}
{{- end }}

{{/*
Whether a label token reaches the worker, and whether the SASL password does.
*/}}
{{- define "abstain.hasLabelToken" -}}
{{- if or .Values.secrets.existingSecret .Values.secrets.labelToken }}true{{ end }}
{{- end }}

{{- define "abstain.hasSaslPassword" -}}
{{- if or .Values.secrets.existingSecret .Values.secrets.saslPassword }}true{{ end }}
{{- end }}

{{/*
Consistency checks the schema cannot express; each fails the render with a message that
names the values to fix. Mirrors the worker's own start-up validation of these settings.
*/}}
{{- define "abstain.validate" -}}
{{- $k := .Values.kafka }}
{{- if include "abstain.kafkaSasl" . }}
{{- if not $k.sasl.mechanism }}
{{- fail (printf "kafka.securityProtocol=%s needs kafka.sasl.mechanism" $k.securityProtocol) }}
{{- end }}
{{- if not $k.sasl.username }}
{{- fail (printf "kafka.securityProtocol=%s needs kafka.sasl.username" $k.securityProtocol) }}
{{- end }}
{{- if not (include "abstain.hasSaslPassword" .) }}
{{- fail (printf "kafka.securityProtocol=%s needs a password: set secrets.existingSecret (key %s) or secrets.saslPassword" $k.securityProtocol .Values.secrets.saslPasswordKey) }}
{{- end }}
{{- else if $k.sasl.mechanism }}
{{- fail (printf "kafka.sasl.mechanism is set but kafka.securityProtocol=%s is not SASL_PLAINTEXT or SASL_SSL" $k.securityProtocol) }}
{{- end }}
{{- if and $k.tls.existingSecret (not (include "abstain.kafkaTls" .)) }}
{{- fail (printf "kafka.tls.existingSecret is set but kafka.securityProtocol=%s is not SSL or SASL_SSL" $k.securityProtocol) }}
{{- end }}
{{- if ne (empty $k.tls.certKey) (empty $k.tls.keyKey) }}
{{- fail "kafka.tls.certKey and kafka.tls.keyKey go together: set both or neither" }}
{{- end }}
{{- if and (not $k.tls.existingSecret) $k.tls.certKey }}
{{- fail "kafka.tls.certKey/keyKey need kafka.tls.existingSecret" }}
{{- end }}
{{- $names := keys (.Values.config.models | default dict) | sortAlpha }}
{{- if not $names }}
{{- $names = list "default" }}
{{- end }}
{{- $default := .Values.config.default_model | default "default" }}
{{- if not (has $default $names) }}
{{- fail (printf "config.default_model %q is not one of the models (%s)" $default (join ", " $names)) }}
{{- end }}
{{- end }}

{{/*
A Kubernetes LabelSelector from values: its non-empty matchLabels / matchExpressions; `{}`
(which selects everything) when both are empty. "abstain.selectorSet" is true when either is
given.
*/}}
{{- define "abstain.labelSelector" -}}
{{- $out := dict }}
{{- with .matchLabels }}{{ $_ := set $out "matchLabels" . }}{{ end }}
{{- with .matchExpressions }}{{ $_ := set $out "matchExpressions" . }}{{ end }}
{{- toYaml $out }}
{{- end }}

{{- define "abstain.selectorSet" -}}
{{- if or .matchLabels .matchExpressions }}true{{ end }}
{{- end }}
