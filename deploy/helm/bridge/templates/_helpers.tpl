{{/* Names and labels. */}}
{{- define "bridge.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "bridge.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "bridge.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "bridge.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "bridge.selectorLabels" -}}
app.kubernetes.io/name: {{ include "bridge.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "bridge.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "bridge.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "bridge.secretName" -}}
{{- default (include "bridge.fullname" .) .Values.secret.name -}}
{{- end -}}

{{- define "bridge.configMapName" -}}
{{- default (include "bridge.fullname" .) .Values.config.existingConfigMap -}}
{{- end -}}

{{- define "bridge.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/* Whether serve.auth has a key to verify JWTs with. */}}
{{- define "bridge.jwtKeys" -}}
{{- $j := .Values.auth.jwt -}}
{{- $n := 0 -}}
{{- if $j.hs256SecretKey }}{{ $n = add1 $n }}{{ end -}}
{{- if $j.jwksUrl }}{{ $n = add1 $n }}{{ end -}}
{{- if $j.jwksConfigMap }}{{ $n = add1 $n }}{{ end -}}
{{- $n -}}
{{- end -}}

{{/*
bridge.validate fails the render when the values would open a door without
authentication, or ask for something the bridge refuses at start. Every
message names the value to change.
*/}}
{{- define "bridge.validate" -}}
{{- $keys := include "bridge.jwtKeys" . | atoi -}}
{{- if gt $keys 1 -}}
{{- fail "auth.jwt: set one of hs256SecretKey, jwksUrl and jwksConfigMap" -}}
{{- end -}}
{{- if and .Values.http.console.enabled (eq $keys 0) -}}
{{- fail "http.console.enabled: the web console shows rows and has pause, resume and snapshot buttons, and every pod of the cluster reaches the pod's port: set auth.jwt (hs256SecretKey, jwksUrl or jwksConfigMap; the console asks the scopes bridge:status and bridge:control), or leave the console off" -}}
{{- end -}}
{{- if and .Values.http.console.enabled (not .Values.http.tls.enabled) (not .Values.http.console.allowPlaintext) -}}
{{- fail "http.console.enabled: tokens and rows would cross the network in clear: set http.tls.enabled with http.tls.secretName, or http.console.allowPlaintext: true behind a TLS-terminating proxy or mesh" -}}
{{- end -}}
{{- if and .Values.serve.enabled (eq $keys 0) -}}
{{- fail "serve.enabled: the feeds serve every row to whoever reaches the Service: set auth.jwt (hs256SecretKey, jwksUrl or jwksConfigMap) with auth.jwt.tablesClaim or where to limit each caller; the chart never serves feeds without authentication" -}}
{{- end -}}
{{- if and .Values.serve.enabled (not .Values.serve.tls.enabled) (not .Values.serve.allowPlaintext) -}}
{{- fail "serve.enabled: tokens and rows would cross the network in clear: set serve.tls.enabled with serve.tls.secretName, or serve.allowPlaintext: true behind a TLS-terminating proxy or mesh" -}}
{{- end -}}
{{- if and .Values.auth.jwt.jwksUrl (not (hasPrefix "https://" .Values.auth.jwt.jwksUrl)) -}}
{{- fail (printf "auth.jwt.jwksUrl: %q must be https: keys fetched over plain http could be replaced on the way" .Values.auth.jwt.jwksUrl) -}}
{{- end -}}
{{- range $what, $t := dict "http.tls" .Values.http.tls "serve.tls" .Values.serve.tls "nats.tls" .Values.nats.tls -}}
{{- if and $t.enabled (not $t.secretName) -}}
{{- fail (printf "%s.secretName: %s.enabled needs the Secret holding the certificate (tls.crt, tls.key; ca.crt)" $what $what) -}}
{{- end -}}
{{- end -}}
{{- if not (has .Values.nats.auth.type (list "creds" "nkey" "userPassword" "token" "none")) -}}
{{- fail (printf "nats.auth.type: %q is none of creds, nkey, userPassword, token, none" .Values.nats.auth.type) -}}
{{- end -}}
{{- if and (gt (int .Values.replicaCount) 1) (not .Values.fleet.enabled) -}}
{{- fail (printf "replicaCount: %d replicas would read one replication slot: Postgres lets one of them stream and the others wait; set fleet.enabled to share the sources between them (docs/fleet.md), or replicaCount: 1" (int .Values.replicaCount)) -}}
{{- end -}}
{{- if not .Values.config.existingConfigMap -}}
{{- $b := .Values.config.bridge -}}
{{- if and .Values.fleet.enabled (not (and $b.nats (or $b.nats.url $b.nats.context))) -}}
{{- fail "fleet.enabled: the members share their leases on one NATS server or cluster: set config.bridge.nats.url" -}}
{{- end -}}
{{- range $src, $sc := $b.sources -}}
{{- if not (regexMatch "^[a-z][a-z0-9_-]*$" $src) -}}
{{- fail (printf "config.bridge.sources.%s: name it with lowercase letters, digits, '_' and '-' (a letter first), so that BRIDGE_SOURCES__%s__CONFIG__DSN can reach it" $src (upper $src)) -}}
{{- end -}}
{{- if and (not (hasKey $.Values.postgres.dsn $src)) (not (and $sc.config $sc.config.dsn)) -}}
{{- fail (printf "postgres.dsn.%s: the source %s has no DSN: name the key of the Secret that holds it (postgres.dsn.%s.key)" $src $src $src) -}}
{{- end -}}
{{- end -}}
{{- range $src, $d := .Values.postgres.dsn -}}
{{- if not (hasKey $b.sources $src) -}}
{{- fail (printf "postgres.dsn.%s: config.bridge.sources has no source %s (Helm merges maps: set postgres.dsn.%s: null to drop a default)" $src $src $src) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The volumes of the Secrets and ConfigMaps both workloads mount (Postgres' only bridge run's). */}}
{{- define "bridge.secretVolumes" -}}
{{- $a := .Values.nats.auth -}}
{{- if has $a.type (list "creds" "nkey") }}
- name: nats-auth
  secret:
    secretName: {{ include "bridge.secretName" . }}
    defaultMode: 0440
    items:
      {{- if eq $a.type "creds" }}
      - key: {{ $a.credsKey }}
        path: user.creds
      {{- else }}
      - key: {{ $a.nkeyKey }}
        path: user.nk
      {{- end }}
{{- end }}
{{- if .Values.nats.tls.enabled }}
- name: nats-tls
  secret:
    secretName: {{ .Values.nats.tls.secretName }}
    defaultMode: 0440
{{- end }}
{{- if .Values.auth.jwt.jwksConfigMap }}
- name: jwks
  configMap:
    name: {{ .Values.auth.jwt.jwksConfigMap }}
    items:
      - key: jwks.json
        path: jwks.json
{{- end }}
{{- end -}}

{{- define "bridge.secretMounts" -}}
{{- if has .Values.nats.auth.type (list "creds" "nkey") }}
- name: nats-auth
  mountPath: /run/secrets/bridge/nats
  readOnly: true
{{- end }}
{{- if .Values.nats.tls.enabled }}
- name: nats-tls
  mountPath: /run/secrets/bridge/nats-tls
  readOnly: true
{{- end }}
{{- if .Values.auth.jwt.jwksConfigMap }}
- name: jwks
  mountPath: /run/secrets/bridge/jwks
  readOnly: true
{{- end }}
{{- end -}}

{{/* Each source's DSN, for bridge run. */}}
{{- define "bridge.dsnEnv" -}}
{{- $secret := include "bridge.secretName" . -}}
{{- range $src, $d := .Values.postgres.dsn }}
- name: BRIDGE_SOURCES__{{ upper $src }}__CONFIG__DSN
  valueFrom:
    secretKeyRef:
      name: {{ $d.secretName | default $secret }}
      key: {{ $d.key }}
{{- end }}
{{- end -}}

{{/*
bridge serve never connects to Postgres, and only logs problems in the
sections it does not read (sources among them): it gets a DSN without
credentials, so that the pod the feeds' clients reach holds no replication
password and logs no unset variable at each start.
*/}}
{{- define "bridge.serveDSNEnv" -}}
{{- range $src, $d := .Values.postgres.dsn }}
- name: BRIDGE_SOURCES__{{ upper $src }}__CONFIG__DSN
  value: postgres://bridge-serve-does-not-connect@127.0.0.1:1/none
{{- end }}
{{- end -}}

{{/* The environment both workloads share: NATS and serve.auth. */}}
{{- define "bridge.commonEnv" -}}
{{- $secret := include "bridge.secretName" . -}}
{{- $a := .Values.nats.auth -}}
{{- if eq $a.type "creds" }}
- name: BRIDGE_NATS__CREDS
  value: /run/secrets/bridge/nats/user.creds
{{- else if eq $a.type "nkey" }}
- name: BRIDGE_NATS__NKEY_SEED_FILE
  value: /run/secrets/bridge/nats/user.nk
{{- else if eq $a.type "userPassword" }}
- name: BRIDGE_NATS__USER
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ $a.userKey }}
- name: BRIDGE_NATS__PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ $a.passwordKey }}
{{- else if eq $a.type "token" }}
- name: BRIDGE_NATS__TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ $a.tokenKey }}
{{- end }}
{{- with .Values.nats.tls }}
{{- if .enabled }}
- name: BRIDGE_NATS__TLS__CA_FILE
  value: /run/secrets/bridge/nats-tls/ca.crt
{{- if .clientCert }}
- name: BRIDGE_NATS__TLS__CERT_FILE
  value: /run/secrets/bridge/nats-tls/tls.crt
- name: BRIDGE_NATS__TLS__KEY_FILE
  value: /run/secrets/bridge/nats-tls/tls.key
{{- end }}
{{- if .serverName }}
- name: BRIDGE_NATS__TLS__SERVER_NAME
  value: {{ .serverName | quote }}
{{- end }}
{{- end }}
{{- end }}
{{- $j := .Values.auth.jwt -}}
{{- if gt (include "bridge.jwtKeys" . | atoi) 0 }}
- name: BRIDGE_SERVE__AUTH__MODE
  value: jwt
{{- if $j.hs256SecretKey }}
- name: BRIDGE_SERVE__AUTH__HS256_SECRET
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ $j.hs256SecretKey }}
{{- else if $j.jwksUrl }}
- name: BRIDGE_SERVE__AUTH__JWKS_URL
  value: {{ $j.jwksUrl | quote }}
{{- else }}
- name: BRIDGE_SERVE__AUTH__JWKS_FILE
  value: /run/secrets/bridge/jwks/jwks.json
{{- end }}
{{- end }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The pod-level settings both workloads share. */}}
{{- define "bridge.podCommon" -}}
automountServiceAccountToken: false
enableServiceLinks: false
serviceAccountName: {{ include "bridge.serviceAccountName" . }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The bridge.yaml rendered from values: config.bridge with auth.jwt's claims under serve.auth. */}}
{{- define "bridge.config" -}}
{{- $cfg := deepCopy .Values.config.bridge -}}
{{- $j := .Values.auth.jwt -}}
{{- $auth := dict -}}
{{- range $k, $v := dict "issuer" $j.issuer "audience" $j.audience "tables_claim" $j.tablesClaim "scope_claim" $j.scopeClaim -}}
{{- if $v }}{{ $_ := set $auth $k $v }}{{ end -}}
{{- end -}}
{{- if $j.where }}{{ $_ := set $auth "where" $j.where }}{{ end -}}
{{- if $auth -}}
{{- $serve := get $cfg "serve" | default dict -}}
{{- $_ := set $serve "auth" (mergeOverwrite (get $serve "auth" | default dict) $auth) -}}
{{- $_ := set $cfg "serve" $serve -}}
{{- end -}}
{{- toYaml $cfg -}}
{{- end -}}
