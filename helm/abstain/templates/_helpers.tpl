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
Name of the Secret holding the label token, the SASL password, the snapshot keys and the
desk's session key and users file, and whether the chart creates it (only when no
existingSecret is named and some secret value is given).
*/}}
{{- define "abstain.secretName" -}}
{{- default (include "abstain.fullname" .) .Values.secrets.existingSecret }}
{{- end }}

{{- define "abstain.createSecret" -}}
{{- $s := .Values.secrets }}
{{- if and (not $s.existingSecret) (or $s.labelToken $s.saslPassword $s.deskSaslPassword $s.snapshotKey $s.snapshotKeyPrevious $s.deskSessionKey $s.deskUsers (include "abstain.generateSnapshotKey" .)) }}true{{ end }}
{{- end }}

{{/*
Whether the chart generates the snapshot key: no key given, no existing Secret, and running
unsigned not chosen. The generated key is read back from the Secret the chart created
before (lookup), so an upgrade keeps it; `helm template` (no cluster) makes a new one.
*/}}
{{- define "abstain.generateSnapshotKey" -}}
{{- $s := .Values.secrets }}
{{- if and (not $s.existingSecret) (not $s.snapshotKey) (not $s.unsignedSnapshots) }}true{{ end }}
{{- end }}

{{- define "abstain.generatedSnapshotKey" -}}
{{- $existing := lookup "v1" "Secret" .Release.Namespace (include "abstain.fullname" .) }}
{{- $kept := "" }}
{{- if $existing }}
{{- $kept = index ($existing.data | default dict) .Values.secrets.snapshotKeyKey | default "" }}
{{- end }}
{{- if $kept }}{{ $kept }}{{ else }}{{ randAlphaNum 64 | b64enc }}{{ end }}
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
{{- if and $k.sasl.deskUsername .Values.desk.enabled (not (or .Values.secrets.existingSecret .Values.secrets.deskSaslPassword)) }}
{{- fail (printf "kafka.sasl.deskUsername needs the desk's password: set secrets.existingSecret (key %s) or secrets.deskSaslPassword" .Values.secrets.deskSaslPasswordKey) }}
{{- end }}
{{- else if $k.sasl.deskUsername }}
{{- fail (printf "kafka.sasl.deskUsername is set but kafka.securityProtocol=%s is not SASL_PLAINTEXT or SASL_SSL" $k.securityProtocol) }}
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

{{/*
The Kafka settings every container of the release needs (worker and desk): brokers, security
protocol, SASL user and password (Secret; the desk's own with kafka.sasl.deskUsername), TLS
files (mounted at $tlsDir), host-name verification.
*/}}
{{- define "abstain.kafkaEnv" -}}
{{- $tlsDir := "/etc/abstain/kafka-tls" }}
{{- $desk := and (hasSuffix "desk-deployment.yaml" .Template.Name) (not (empty .Values.kafka.sasl.deskUsername)) }}
- name: ABSTAIN_BROKER
  value: {{ join "," .Values.kafka.brokers | quote }}
- name: ABSTAIN_SECURITY__PROTOCOL
  value: {{ .Values.kafka.securityProtocol | quote }}
{{- if include "abstain.kafkaSasl" . }}
- name: ABSTAIN_SECURITY__SASL_MECHANISM
  value: {{ .Values.kafka.sasl.mechanism | quote }}
- name: ABSTAIN_SECURITY__USERNAME
  value: {{ ternary .Values.kafka.sasl.deskUsername .Values.kafka.sasl.username $desk | quote }}
- name: ABSTAIN_SECURITY__PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "abstain.secretName" . }}
      key: {{ ternary .Values.secrets.deskSaslPasswordKey .Values.secrets.saslPasswordKey $desk }}
{{- end }}
{{- if and (include "abstain.kafkaTls" .) (eq .Values.kafka.tls.checkHostname false) }}
- name: ABSTAIN_SECURITY__CHECK_HOSTNAME
  value: "false"
{{- end }}
{{- with .Values.kafka.tls }}
{{- if .existingSecret }}
{{- if .caKey }}
- name: ABSTAIN_SECURITY__CA_FILE
  value: {{ printf "%s/%s" $tlsDir .caKey | quote }}
{{- end }}
{{- if .certKey }}
- name: ABSTAIN_SECURITY__CERT_FILE
  value: {{ printf "%s/%s" $tlsDir .certKey | quote }}
- name: ABSTAIN_SECURITY__KEY_FILE
  value: {{ printf "%s/%s" $tlsDir .keyKey | quote }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The snapshot signing keys (optional in an existing Secret): the workers sign and check model
snapshots with them, the desk checks the snapshots it reads for "weighing most in the score".
*/}}
{{- define "abstain.snapshotKeyEnv" -}}
{{- with .Values.secrets }}
{{- if or .existingSecret .snapshotKey (include "abstain.generateSnapshotKey" $) }}
- name: ABSTAIN_SNAPSHOT_KEY
  valueFrom:
    secretKeyRef:
      name: {{ include "abstain.secretName" $ }}
      key: {{ .snapshotKeyKey }}
      {{- if and .existingSecret .unsignedSnapshots }}
      optional: true
      {{- end }}
{{- end }}
{{- if or .existingSecret .snapshotKeyPrevious }}
- name: ABSTAIN_SNAPSHOT_KEY_PREVIOUS
  valueFrom:
    secretKeyRef:
      name: {{ include "abstain.secretName" $ }}
      key: {{ .snapshotKeyPreviousKey }}
      {{- if .existingSecret }}
      optional: true
      {{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The label desk (templates/desk-*.yaml). Its pods carry their own app.kubernetes.io/name
("<name>-desk") so that no selector of the workers (Deployment, Service, PodDisruptionBudget,
NetworkPolicy, ServiceMonitor: all on name + instance, the Deployment's immutable) ever
matches a desk pod; app.kubernetes.io/component=desk is what the workers' NetworkPolicy lets
in. The ServiceMonitor's job is that name: job="abstain-desk".
*/}}
{{- define "abstain.desk.name" -}}
{{- printf "%s-desk" (include "abstain.name" . | trunc 58 | trimSuffix "-") }}
{{- end }}

{{- define "abstain.desk.fullname" -}}
{{- printf "%s-desk" (include "abstain.fullname" . | trunc 58 | trimSuffix "-") }}
{{- end }}

{{- define "abstain.desk.selectorLabels" -}}
app.kubernetes.io/name: {{ include "abstain.desk.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: desk
{{- end }}

{{- define "abstain.desk.labels" -}}
helm.sh/chart: {{ include "abstain.chart" . }}
{{ include "abstain.desk.selectorLabels" . }}
app.kubernetes.io/part-of: {{ include "abstain.name" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/*
Name of the Secret holding the desk's users file, empty when the desk gets none:
desk.usersSecret if set; else the release's Secret (secrets.existingSecret, which must then
hold the key with auth=users, or the chart-made one when secrets.deskUsers is given).
*/}}
{{- define "abstain.desk.usersSecret" -}}
{{- $s := .Values.secrets }}
{{- if .Values.desk.usersSecret }}
{{- .Values.desk.usersSecret }}
{{- else if and $s.existingSecret (eq .Values.desk.auth "users") }}
{{- $s.existingSecret }}
{{- else if and (not $s.existingSecret) $s.deskUsers }}
{{- include "abstain.fullname" . }}
{{- end }}
{{- end }}

{{/*
Checks of the desk's values the schema cannot express (mirroring `abstain desk`'s start-up
checks): a session key shared by every replica, a users file with auth=users, and with
auth=proxy a NetworkPolicy that lets only the proxy in and the proxy's addresses in
config.desk.trusted_proxies (the desk believes the proxy's header from those only, so
whoever else reaches it cannot claim any name).
*/}}
{{- define "abstain.desk.validate" -}}
{{- $d := .Values.desk }}
{{- $s := .Values.secrets }}
{{- if not (or $s.existingSecret $s.deskSessionKey) }}
{{- fail (printf "desk.enabled needs a session key, the same on every replica: set secrets.deskSessionKey (at least 32 characters) or secrets.existingSecret (key %s)" $s.deskSessionKeyKey) }}
{{- end }}
{{- if and (eq $d.auth "users") (not (include "abstain.desk.usersSecret" .)) }}
{{- fail (printf "desk.auth=users needs a users file (abstain desk hash-password): set secrets.deskUsers (e.g. --set-file secrets.deskUsers=desk-users.toml), secrets.existingSecret or desk.usersSecret (key %s)" $s.deskUsersKey) }}
{{- end }}
{{- if and (eq $d.auth "proxy") (not (and .Values.networkPolicy.enabled $d.networkPolicy.from)) }}
{{- fail "desk.auth=proxy: the desk believes the proxy's header, so only the proxy may reach it: set networkPolicy.enabled=true and desk.networkPolicy.from to the proxy's pods" }}
{{- end }}
{{- if and (eq $d.auth "proxy") (not ((.Values.config.desk | default dict).trusted_proxies)) }}
{{- fail "desk.auth=proxy: the desk believes the proxy's header from the proxy's addresses only: set config.desk.trusted_proxies to them (e.g. the Ingress controller pods' network, [10.244.0.0/16])" }}
{{- end }}
{{- end }}

{{/*
Checksums of the secret values each Deployment reads, so that a change rolls only the pods
that use it (a new desk user must not rebalance the workers). A Secret managed outside the
chart is not seen: restart the pods after changing it.
*/}}
{{- define "abstain.workerSecretChecksum" -}}
{{- $s := .Values.secrets }}
{{- list $s.existingSecret $s.labelTokenKey $s.labelToken $s.saslPasswordKey $s.saslPassword $s.snapshotKeyKey $s.snapshotKey $s.snapshotKeyPreviousKey $s.snapshotKeyPrevious $s.unsignedSnapshots | toJson | sha256sum }}
{{- end }}

{{- define "abstain.deskSecretChecksum" -}}
{{- $s := .Values.secrets }}
{{- list $s.existingSecret $s.saslPasswordKey $s.saslPassword $s.snapshotKeyKey $s.snapshotKey $s.snapshotKeyPreviousKey $s.snapshotKeyPrevious $s.unsignedSnapshots $s.deskSessionKeyKey $s.deskSessionKey $s.deskUsersKey $s.deskUsers .Values.desk.usersSecret | toJson | sha256sum }}
{{- end }}

{{/*
config.json from a `config` map (see templates/configmap.yaml): empty values left out.
The workers' checksum leaves out the `desk` section, which only the desk reads.
*/}}
{{- define "abstain.configJson" -}}
{{- $cfg := dict }}
{{- range $key, $value := .config }}
{{- if not (empty $value) }}
{{- $_ := set $cfg $key $value }}
{{- end }}
{{- end }}
{{- toPrettyJson $cfg }}
{{- end }}

{{- define "abstain.workerConfigChecksum" -}}
{{- include "abstain.configJson" (dict "config" (omit .Values.config "desk")) | sha256sum }}
{{- end }}

{{- define "abstain.deskConfigChecksum" -}}
{{- include "abstain.configJson" (dict "config" .Values.config) | sha256sum }}
{{- end }}
