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

{{/* "true" when the labeller talks to the API server: every output but the features.d file, Events,
     and following the config label. Without it the labeller gets no RBAC and no ServiceAccount token. */}}
{{- define "gpu-labeller.labellerNeedsApi" -}}
{{- or (ne .Values.labeller.output "features-file") .Values.labeller.events.enabled (eq (include "gpu-labeller.followsLabel" .) "true") }}
{{- end }}

{{/* The named configs as given, as YAML: name -> a config (a mapping, or its YAML text). A
     `config` with keys of a config file (version, flags, sharing, ...: the chart's former shape) is the
     one config "default", over the former defaults; `map` (NVIDIA's device plugin chart) is another
     name for `data`; neither given: one config "default" with NVIDIA's defaults. (`data` is empty in
     values.yaml: Helm merges maps, so a default entry there could not be left out.) */}}
{{- define "gpu-labeller.givenConfigs" -}}
{{- $config := .Values.config -}}
{{- $file := pick $config "version" "flags" "sharing" "resources" "imex" "labeller" -}}
{{- if $file -}}
{{- toYaml (dict "default" (mergeOverwrite (dict "version" "v1" "flags" (dict "migStrategy" "none")) (deepCopy $file))) -}}
{{- else if $config.map -}}
{{- toYaml $config.map -}}
{{- else if $config.data -}}
{{- toYaml $config.data -}}
{{- else -}}
{{- toYaml (dict "default" (dict "version" "v1" "flags" (dict "migStrategy" "none"))) -}}
{{- end -}}
{{- end }}

{{/* The named configs the chart renders, as YAML: the given ones (gpu-labeller.givenConfigs), and with
     dra.enabled and dra.vendors, that list written into the default config as labeller.dra.vendors: on
     the nodes that config serves, the DRA plugin publishes those vendors' GPUs and the device plugin
     withholds them. A config given as YAML text is rewritten as YAML then (its comments are lost). */}}
{{- define "gpu-labeller.configData" -}}
{{- $data := include "gpu-labeller.givenConfigs" . -}}
{{- if and .Values.dra.enabled .Values.dra.vendors -}}
{{- if not .Values.config.create -}}
{{- fail "dra.vendors: the chart does not write into an existing ConfigMap (config.create is false): set labeller.dra.vendors in its configs instead" -}}
{{- end -}}
{{- $configs := fromYaml $data -}}
{{- $name := .Values.config.default -}}
{{- if and (not $name) (hasKey $configs "default") }}{{ $name = "default" }}{{ end -}}
{{- if and (not $name) (eq (len $configs) 1) }}{{ $name = keys $configs | first }}{{ end -}}
{{- if not (hasKey $configs $name) -}}
{{- fail (printf "dra.vendors: no default config to write it into (config.default %q; named configs: %s)" $name (keys $configs | sortAlpha | join ", ")) -}}
{{- end -}}
{{- $config := get $configs $name -}}
{{- if kindIs "string" $config }}{{ $config = fromYaml $config }}{{ end -}}
{{- if hasKey (dig "labeller" "dra" (dict) $config) "vendors" -}}
{{- fail (printf "dra.vendors and the labeller.dra.vendors of config %q both say which vendors DRA serves: keep one" $name) -}}
{{- end -}}
{{- $dra := dict "labeller" (dict "dra" (dict "vendors" .Values.dra.vendors)) -}}
{{- $_ := set $configs $name (mergeOverwrite (deepCopy $config) $dra) -}}
{{- $data = toYaml $configs -}}
{{- end -}}
{{- $data -}}
{{- end }}

{{/* The ConfigMap both components mount: config.name, else the one the chart creates. */}}
{{- define "gpu-labeller.configMapName" -}}
{{- if .Values.config.name -}}
{{- .Values.config.name -}}
{{- else if not .Values.config.create -}}
{{- fail "config.create is false: set config.name to the existing ConfigMap that holds the named configs" -}}
{{- else -}}
{{- printf "%s-config" (include "gpu-labeller.fullname" .) -}}
{{- end -}}
{{- end }}

{{/* "true" when both components follow the config label: there is a choice (several configs, or an
     existing ConfigMap whose keys are not known here) and config.nodeLabel is set. */}}
{{- define "gpu-labeller.followsLabel" -}}
{{- $count := len (include "gpu-labeller.configData" . | fromYaml) -}}
{{- and .Values.config.nodeLabel (or (not .Values.config.create) (gt $count 1)) | toString -}}
{{- end }}

{{/* "true" when a rendered config turns firmware labels on (the labeller then reads debugfs). */}}
{{- define "gpu-labeller.firmware" -}}
{{- $on := false -}}
{{- range (include "gpu-labeller.configDocs" . | fromYaml).docs -}}
{{- if dig "labeller" "labels" "firmware" false . }}{{ $on = true }}{{ end -}}
{{- end -}}
{{- $on | toString -}}
{{- end }}

{{/* The config arguments both components take. */}}
{{- define "gpu-labeller.configArgs" -}}
- --config-dir=/etc/gpu-labeller
{{- with .Values.config.default }}
- --config-name={{ . }}
{{- end }}
- --config-label={{ ternary .Values.config.nodeLabel "" (eq (include "gpu-labeller.followsLabel" .) "true") }}
{{- end }}

{{/* The user name the API server gives the labeller's ServiceAccount tokens. */}}
{{- define "gpu-labeller.labellerUsername" -}}
{{- printf "system:serviceaccount:%s:%s" (include "gpu-labeller.namespace" .) (include "gpu-labeller.labellerServiceAccount" .) }}
{{- end }}

{{/* Annotations on both pod templates. No config checksum: both components follow ConfigMap edits live. */}}
{{- define "gpu-labeller.podAnnotations" -}}
{{- with .Values.podAnnotations }}
annotations:
  {{- toYaml . | nindent 2 }}
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

{{/* Environment shared by every component on the node: the downward API's, and simulate.profile's. */}}
{{- define "gpu-labeller.downwardEnv" -}}
- name: NODE_NAME
  valueFrom:
    fieldRef:
      fieldPath: spec.nodeName
- name: NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
{{- with include "gpu-labeller.simulateEnv" . | trim }}
{{ . }}
{{- end }}
{{- end }}

{{/* simulate.profile (demos and CI only): GPU_LABELLER_SIMULATE for every component that probes the node.
     The same variable in a component's extraEnv as well is refused: the pod would get it twice. */}}
{{- define "gpu-labeller.simulateEnv" -}}
{{- with .Values.simulate.profile }}
{{- range $component := list "labeller" "devicePlugin" "dra" }}
{{- range (index $.Values $component).extraEnv }}
{{- if eq (.name | default "") "GPU_LABELLER_SIMULATE" }}
{{- fail (printf "simulate.profile and %s.extraEnv both set GPU_LABELLER_SIMULATE: keep simulate.profile" $component) }}
{{- end }}
{{- end }}
{{- end }}
# FOR DEMOS AND CI ONLY (simulate.profile): a simulated node's GPUs, not this node's hardware.
- name: GPU_LABELLER_SIMULATE
  value: {{ . | quote }}
{{- end }}
{{- end }}

{{/* The rendered named configs as a list of mappings (a config given as YAML text is parsed). */}}
{{- define "gpu-labeller.configDocs" -}}
{{- $docs := list -}}
{{- range $name, $doc := (include "gpu-labeller.configData" . | fromYaml) -}}
{{- if kindIs "string" $doc }}{{ $doc = fromYaml $doc }}{{ end -}}
{{- $docs = append $docs $doc -}}
{{- end -}}
{{- toYaml (dict "docs" $docs) -}}
{{- end }}

{{/* "true" when a named config shares GPUs by MPS (sharing.mps), or devicePlugin.mpsControlDaemon.enabled
     (configs in an existing ConfigMap are not known here): the device-plugin pod then runs
     gpu-labeller mps-control-daemon, and both DaemonSets mount the MPS root. */}}
{{- define "gpu-labeller.mpsEnabled" -}}
{{- $on := .Values.devicePlugin.mpsControlDaemon.enabled | default false -}}
{{- range (include "gpu-labeller.configDocs" . | fromYaml).docs -}}
{{- if not (empty (dig "sharing" "mps" "" .)) }}{{ $on = true }}{{ end -}}
{{- end -}}
{{- $on | toString -}}
{{- end }}

{{/* flags.mpsRoot, the host directory of the MPS daemons' pipes, logs and readiness file: one for
     every named config (the DaemonSets mount one directory). */}}
{{- define "gpu-labeller.mpsRoot" -}}
{{- $roots := list -}}
{{- range (include "gpu-labeller.configDocs" . | fromYaml).docs -}}
{{- $roots = append $roots (dig "flags" "mpsRoot" "/run/nvidia/mps" . | trimSuffix "/") -}}
{{- end -}}
{{- $roots = uniq $roots -}}
{{- if gt (len $roots) 1 -}}
{{- fail (printf "config: the named configs set different flags.mpsRoot (%s); the DaemonSets mount one" (join ", " $roots)) -}}
{{- end -}}
{{- $roots | first | default "/run/nvidia/mps" -}}
{{- end }}

{{/* "true" when a named config's flags.plugin.deviceListStrategy (a string or a list) has
     cdi-annotations or cdi-cri, or devicePlugin.cdiEnabled: the plugin then writes CDI spec files and
     needs the host's CDI directory and driver files. */}}
{{- define "gpu-labeller.cdiEnabled" -}}
{{- $cdi := .Values.devicePlugin.cdiEnabled | default false -}}
{{- range (include "gpu-labeller.configDocs" . | fromYaml).docs -}}
{{- $strategies := dig "flags" "plugin" "deviceListStrategy" "envvar" . -}}
{{- range (kindIs "string" $strategies | ternary (list $strategies) $strategies) -}}
{{- if hasPrefix "cdi-" . }}{{ $cdi = true }}{{ end -}}
{{- end -}}
{{- end -}}
{{- $cdi | toString -}}
{{- end }}

{{/* "true" when a named config shares GPUs by memory (sharing.memory, gpushare's aliyun.com/gpu-mem), or
     devicePlugin.memorySharing.enabled (configs in an existing ConfigMap are not known here): the plugin
     then reads the pods bound to its node and annotates them (ALIYUN_COM_GPU_MEM_ASSIGNED). */}}
{{- define "gpu-labeller.memorySharing" -}}
{{- $on := .Values.devicePlugin.memorySharing.enabled | default false -}}
{{- range (include "gpu-labeller.configDocs" . | fromYaml).docs -}}
{{- if hasKey (dig "sharing" (dict) .) "memory" }}{{ $on = true }}{{ end -}}
{{- end -}}
{{- $on | toString -}}
{{- end }}

{{/* "true" when the device plugin calls the API server: to follow the config label, or for memory sharing. */}}
{{- define "gpu-labeller.devicePluginNeedsApi" -}}
{{- or (eq (include "gpu-labeller.followsLabel" .) "true") (eq (include "gpu-labeller.memorySharing" .) "true") | toString -}}
{{- end }}

{{/* The user name the API server gives the device plugin's ServiceAccount tokens. */}}
{{- define "gpu-labeller.devicePluginUsername" -}}
{{- printf "system:serviceaccount:%s:%s" (include "gpu-labeller.namespace" .) (include "gpu-labeller.devicePluginServiceAccount" .) }}
{{- end }}

{{- define "gpu-labeller.draPluginServiceAccount" -}}
{{- default (printf "%s-dra-plugin" (include "gpu-labeller.fullname" .)) .Values.dra.serviceAccount.name }}
{{- end }}

{{/* The user name the API server gives the DRA plugin's ServiceAccount tokens. */}}
{{- define "gpu-labeller.draPluginUsername" -}}
{{- printf "system:serviceaccount:%s:%s" (include "gpu-labeller.namespace" .) (include "gpu-labeller.draPluginServiceAccount" .) }}
{{- end }}

{{/* The DRA drivers of gpu-labeller's vendors (each vendor's vendors/<name>/dra.py), as JSON: the DRA plugin's socket
     directories, and the only drivers whose ResourceSlices it may write. */}}
{{- define "gpu-labeller.draDrivers" -}}
{{- toJson (list "gpu.nvidia.com" "gpu.amd.com") -}}
{{- end }}

{{/* "true" when the ValidatingAdmissionPolicies are rendered (admissionPolicy.enabled). auto, the default:
     where the cluster serves admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy (Kubernetes >= 1.30).
     true: always, and a cluster known not to serve it fails the render. false: never.
     Helm knows what the cluster serves on install and upgrade: discovery lists every served kind
     (apps/v1/DaemonSet among them). Offline (helm template, helm lint) it knows only group versions and
     what --api-versions adds: auto renders no policy there unless --api-versions names the kind, and true
     renders it as asked unless --kube-version is older than 1.30. */}}
{{- define "gpu-labeller.admissionPolicy" -}}
{{- $mode := .Values.admissionPolicy.enabled -}}
{{- $served := .Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy" -}}
{{- if eq (toString $mode) "auto" -}}
{{- $served | toString -}}
{{- else if $mode -}}
{{- $discovered := .Capabilities.APIVersions.Has "apps/v1/DaemonSet" -}}
{{- if or (and $discovered (not $served)) (semverCompare "<1.30-0" .Capabilities.KubeVersion.Version) -}}
{{- fail (printf "admissionPolicy.enabled is true but this cluster (Kubernetes %s) does not serve admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy (Kubernetes >= 1.30): set admissionPolicy.enabled to auto or false, and see docs/security.md for what the components' tokens may do without it" .Capabilities.KubeVersion.Version) -}}
{{- end -}}
true
{{- else -}}
false
{{- end -}}
{{- end }}

{{/* Fails the render when the cluster is known not to serve the Prometheus Operator's kind: include with
     (dict "ctx" $ "kind" "PodMonitor" "value" "monitoring.podMonitor.enabled"). Helm knows what the cluster
     serves on install and upgrade (discovery lists apps/v1/DaemonSet too); offline (helm template, lint) it
     does not, and the object is rendered as asked. */}}
{{- define "gpu-labeller.requireMonitoringApi" -}}
{{- $discovered := .ctx.Capabilities.APIVersions.Has "apps/v1/DaemonSet" -}}
{{- if and $discovered (not (.ctx.Capabilities.APIVersions.Has (printf "monitoring.coreos.com/v1/%s" .kind))) -}}
{{- fail (printf "%s is true but this cluster does not serve monitoring.coreos.com/v1 %s: install the Prometheus Operator's CRDs first (kube-prometheus-stack has them), or set %s to false" .value .kind .value) -}}
{{- end -}}
{{- end }}

{{/* Namespace of a monitoring object: its own `namespace` value, else the release's. */}}
{{- define "gpu-labeller.monitoringNamespace" -}}
{{- default (include "gpu-labeller.namespace" .ctx) .namespace -}}
{{- end }}

{{/* The Node label policies' variables (the labeller's, and the prune Job's): the label keys gpu-labeller owns
     (admissionPolicy.*: keep them equal to labeller/model/labels.py), the keys a request adds, changes and removes,
     and which removed keys gpu-labeller's field manager did not set. */}}
{{- define "gpu-labeller.labelOwnershipVariables" -}}
- name: ownedPrefixes
  expression: {{ toJson .Values.admissionPolicy.ownedPrefixes | squote }}
- name: ownedKeys
  expression: {{ toJson (.Values.admissionPolicy.ownedKeys | default list) | squote }}
- name: notOwnedPrefixes
  expression: {{ toJson .Values.admissionPolicy.notOwnedPrefixes | squote }}
- name: notOwnedKeys
  expression: {{ toJson (.Values.admissionPolicy.notOwnedKeys | default list) | squote }}
- name: newLabels
  expression: "has(object.metadata.labels) ? object.metadata.labels : {}"
- name: oldLabels
  expression: "request.operation == 'UPDATE' && has(oldObject.metadata.labels) ? oldObject.metadata.labels : {}"
- name: removedKeys
  expression: "variables.oldLabels.filter(k, !(k in variables.newLabels))"
# Keys added or changed, then keys removed.
- name: changedKeys
  expression: >-
    variables.newLabels.filter(k, !(k in variables.oldLabels) || variables.oldLabels[k] != variables.newLabels[k]) +
    variables.removedKeys
- name: foreignKeys
  expression: >-
    variables.changedKeys.filter(k,
      !(variables.ownedPrefixes.exists(p, k.startsWith(p)) || k in variables.ownedKeys) ||
      variables.notOwnedPrefixes.exists(p, k.startsWith(p)) || k in variables.notOwnedKeys)
# The labels listed by the old Node's managedFields entries of field manager gpu-labeller
# (labeller/model/labels.py FIELD_MANAGER; apply, or an update by an older version). Entries of a
# subresource do not count.
- name: labellerLabelFields
  expression: >-
    request.operation == 'UPDATE' && has(oldObject.metadata.managedFields)
    ? oldObject.metadata.managedFields.filter(e, e.manager == 'gpu-labeller' && !has(e.subresource) &&
        has(e.fieldsV1) && 'f:metadata' in e.fieldsV1 && 'f:labels' in e.fieldsV1['f:metadata'])
      .map(e, e.fieldsV1['f:metadata']['f:labels'])
    : []
- name: removedNotSetByLabeller
  expression: >-
    variables.removedKeys.filter(k, !variables.labellerLabelFields.exists(f, ('f:' + k) in f))
{{- end }}

{{/* A CEL expression: the Node request changes nothing but labels (metadata.managedFields and
     resourceVersion change on every write; status sent to the nodes resource is discarded anyway). */}}
{{- define "gpu-labeller.onlyLabelsChanged" -}}
request.operation == 'UPDATE' &&
object.spec == oldObject.spec &&
has(object.metadata.annotations) == has(oldObject.metadata.annotations) &&
(!has(object.metadata.annotations) || object.metadata.annotations == oldObject.metadata.annotations) &&
has(object.metadata.finalizers) == has(oldObject.metadata.finalizers) &&
(!has(object.metadata.finalizers) || object.metadata.finalizers == oldObject.metadata.finalizers) &&
has(object.metadata.ownerReferences) == has(oldObject.metadata.ownerReferences) &&
(!has(object.metadata.ownerReferences) || object.metadata.ownerReferences == oldObject.metadata.ownerReferences)
{{- end }}

{{/* The annotations of a postDeleteCleanup object (templates/prune.yaml): include with its hook weight
     ("-10": the ServiceAccount, RBAC and policy; "0": the Job, created last). */}}
{{- define "gpu-labeller.pruneHook" -}}
helm.sh/hook: post-delete
helm.sh/hook-weight: {{ . | quote }}
helm.sh/hook-delete-policy: before-hook-creation,hook-succeeded
{{- end }}
