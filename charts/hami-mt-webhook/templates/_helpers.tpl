{{/* The name of every object; fixed, since the webhook configurations are cluster-scoped (one install per cluster). */}}
{{- define "hmw.name" -}}hami-mt-webhook{{- end -}}

{{/* The image reference: [registry/]repository[:tag][@digest]. The tag defaults to the chart's appVersion
     unless a digest is given: a digest names the image alone, and a tag set beside it is kept for readers
     (the runtime pulls by the digest). With the defaults: hami-mt-webhook:<appVersion>, as the kustomize base. */}}
{{- define "hmw.image" -}}
{{- $image := .Values.image -}}
{{- $ref := $image.repository -}}
{{- with $image.registry }}{{ $ref = printf "%s/%s" . $ref }}{{ end -}}
{{- $tag := toString ($image.tag | default "") -}}
{{- if and (not $tag) (not $image.digest) }}{{ $tag = .Chart.AppVersion }}{{ end -}}
{{- with $tag }}{{ $ref = printf "%s:%s" $ref . }}{{ end -}}
{{- with $image.digest }}{{ $ref = printf "%s@%s" $ref . }}{{ end -}}
{{- $ref -}}
{{- end -}}

{{/* Labels of every object: the selector label the kustomize base uses, plus Helm's bookkeeping. */}}
{{- define "hmw.labels" -}}
app.kubernetes.io/name: hami-mt-webhook
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* A resource name as a CEL string literal; names are DNS subdomain + path, so a quote means a typo. */}}
{{- define "hmw.celString" -}}
{{- if or (contains "'" .) (contains "\\" .) (eq . "") -}}
{{- fail (printf "resource name %q cannot be empty or contain quotes or backslashes" .) -}}
{{- end -}}
{{- squote . -}}
{{- end -}}

{{/* The slice resource names, in the order the server and the docs list them. */}}
{{- define "hmw.sliceNames" -}}
{{- $r := .Values.resourceNames -}}
{{- list $r.vgpu $r.memory $r.core | toJson -}}
{{- end -}}

{{/* The slice resource names as a CEL list literal: ['mthreads.com/vgpu', ...]. */}}
{{- define "hmw.sliceList" -}}
{{- $items := list -}}
{{- range (include "hmw.sliceNames" . | fromJsonArray) }}{{ $items = append $items (include "hmw.celString" .) }}{{ end -}}
[{{ join ", " $items }}]
{{- end -}}

{{/* The whole-card resource names (a list; a single string is accepted too). */}}
{{- define "hmw.wholeCardNames" -}}
{{- $w := .Values.resourceNames.wholeCard -}}
{{- if kindIs "string" $w }}{{ $w = list $w }}{{ end -}}
{{- if not $w }}{{ fail "resourceNames.wholeCard must name at least one resource" }}{{ end -}}
{{- toJson $w -}}
{{- end -}}

{{/* memoryPerCard as the server's flag value: "96" or "96,160". */}}
{{- define "hmw.memoryPerCard" -}}
{{- $m := .Values.memoryPerCard -}}
{{- if not (kindIs "slice" $m) }}{{ $m = list $m }}{{ end -}}
{{- $out := list -}}
{{- range $m }}{{ $out = append $out (int64 .) }}{{ end -}}
{{- join "," $out -}}
{{- end -}}

{{/* The namespaces no webhook looks at: the configured ones and the release namespace. */}}
{{- define "hmw.namespaceSelector" -}}
matchExpressions:
  - key: kubernetes.io/metadata.name
    operator: NotIn
    values: {{ concat .Values.excludedNamespaces (list .Release.Namespace) | uniq | toJson }}
  - key: hami.io/webhook
    operator: NotIn
    values: [ignore]
{{- end -}}

{{/* The matchCondition of the pod webhooks and the backstop: the pod names a slice resource. */}}
{{- define "hmw.podNamesSlice" -}}
{{- $slices := include "hmw.sliceList" . -}}
((has(object.spec.containers) ? object.spec.containers : []) +
(has(object.spec.initContainers) ? object.spec.initContainers : [])).exists(c,
has(c.resources) &&
((has(c.resources.limits) && c.resources.limits.exists(r, r in
{{ $slices }})) ||
(has(c.resources.requests) && c.resources.requests.exists(r, r in
{{ $slices }}))))
{{- end -}}

{{/* The webhooks' namespace selector: the scope above, and the rollout-mode label (SPEC 4.10): the base
registrations take namespaces not labelled hami.io/enforcement: warn (operator NotIn), their /warn/ copies
those labelled so (In). Call with (dict "root" $ "operator" "NotIn"). */}}
{{- define "hmw.webhookSelector" -}}
{{ include "hmw.namespaceSelector" .root }}
  - key: hami.io/enforcement
    operator: {{ .operator }}
    values: [warn]
{{- end -}}

{{/* The workload check's matchCondition for the built-in kinds: the pod template at spec.template or
spec.jobTemplate.spec.template names a slice resource. */}}
{{- define "hmw.workloadNamesSlice" -}}
((has(object.spec) && has(object.spec.template) ? [object.spec.template] : []) +
(has(object.spec) && has(object.spec.jobTemplate) && has(object.spec.jobTemplate.spec) &&
has(object.spec.jobTemplate.spec.template) ? [object.spec.jobTemplate.spec.template] : [])).exists(t,
{{ include "hmw.podNamesSlice" . | replace "object.spec" "t.spec" | printf "has(t.spec) &&\n%s" }})
{{- end -}}

{{/* The training jobs' webhook: rules and matchCondition, generated from hami_mt_webhook.rules.workloads.KINDS
(devtools.clusters.manifests.template_condition; the chart test compares them with the kustomize base). */}}
{{- define "hmw.trainingRules" -}}
- operations: [CREATE, UPDATE]
  apiGroups: [kubeflow.org]
  apiVersions: [v1, v2beta1]
  resources: [pytorchjobs, mpijobs]
  scope: Namespaced
- operations: [CREATE, UPDATE]
  apiGroups: [ray.io]
  apiVersions: [v1]
  resources: [rayclusters, rayjobs]
  scope: Namespaced
- operations: [CREATE, UPDATE]
  apiGroups: [leaderworkerset.x-k8s.io]
  apiVersions: [v1]
  resources: [leaderworkersets]
  scope: Namespaced
- operations: [CREATE, UPDATE]
  apiGroups: [jobset.x-k8s.io]
  apiVersions: [v1alpha2]
  resources: [jobsets]
  scope: Namespaced
- operations: [CREATE, UPDATE]
  apiGroups: [batch.volcano.sh]
  apiVersions: [v1alpha1]
  resources: [jobs]
  scope: Namespaced
{{- end -}}

{{- define "hmw.trainingNamesSlice" -}}
((has(object.spec) && has(object.spec.pytorchReplicaSpecs) ? object.spec.pytorchReplicaSpecs.filter(k,
has(object.spec.pytorchReplicaSpecs[k].template)).map(k, object.spec.pytorchReplicaSpecs[k].template) : []) +
(has(object.spec) && has(object.spec.mpiReplicaSpecs) ? object.spec.mpiReplicaSpecs.filter(k,
has(object.spec.mpiReplicaSpecs[k].template)).map(k, object.spec.mpiReplicaSpecs[k].template) : []) +
(has(object.spec) && has(object.spec.headGroupSpec) && has(object.spec.headGroupSpec.template) ?
[object.spec.headGroupSpec.template] : []) + (has(object.spec) && has(object.spec.workerGroupSpecs) ?
object.spec.workerGroupSpecs.filter(g, has(g.template)).map(g, g.template) : []) + (has(object.spec) &&
has(object.spec.rayClusterSpec) && has(object.spec.rayClusterSpec.headGroupSpec) &&
has(object.spec.rayClusterSpec.headGroupSpec.template) ? [object.spec.rayClusterSpec.headGroupSpec.template] :
[]) + (has(object.spec) && has(object.spec.rayClusterSpec) && has(object.spec.rayClusterSpec.workerGroupSpecs)
? object.spec.rayClusterSpec.workerGroupSpecs.filter(g, has(g.template)).map(g, g.template) : []) +
(has(object.spec) && has(object.spec.leaderWorkerTemplate) &&
has(object.spec.leaderWorkerTemplate.leaderTemplate) ? [object.spec.leaderWorkerTemplate.leaderTemplate] : [])
+ (has(object.spec) && has(object.spec.leaderWorkerTemplate) &&
has(object.spec.leaderWorkerTemplate.workerTemplate) ? [object.spec.leaderWorkerTemplate.workerTemplate] : [])
+ (has(object.spec) && has(object.spec.replicatedJobs) ? object.spec.replicatedJobs.filter(g, has(g.template)
&& has(g.template.spec) && has(g.template.spec.template)).map(g, g.template.spec.template) : []) +
(has(object.spec) && has(object.spec.tasks) ? object.spec.tasks.filter(g, has(g.template)).map(g, g.template)
: [])).exists(t,
{{ include "hmw.podNamesSlice" . | replace "object.spec" "t.spec" | printf "has(t.spec) &&\n%s" }})
{{- end -}}

{{/*
The CA and serving certificate, made once per render and memoized in .Values so that the Secret and every
webhook configuration carry the same pair. On upgrade the existing Secret is read back (`lookup`) and reused.
Returns a dict as JSON: caCert, cert, key (base64 PEM).
*/}}
{{- define "hmw.tls" -}}
{{- if not (hasKey .Values "__hmwTLS") -}}
{{- $secret := lookup "v1" "Secret" .Release.Namespace "hami-mt-webhook-tls" -}}
{{- $data := dict -}}
{{- if $secret }}{{ $data = $secret.data | default dict }}{{ end -}}
{{- if and (index $data "ca.crt") (index $data "tls.crt") (index $data "tls.key") -}}
{{- $_ := set .Values "__hmwTLS" (dict "caCert" (index $data "ca.crt") "cert" (index $data "tls.crt") "key" (index $data "tls.key")) -}}
{{- else -}}
{{- $svc := printf "%s.%s.svc" (include "hmw.name" .) .Release.Namespace -}}
{{- $days := int .Values.certificate.validityDays -}}
{{- $ca := genCA "hami-mt-webhook-ca" $days -}}
{{- $cert := genSignedCert $svc nil (list $svc (printf "%s.cluster.local" $svc)) $days $ca -}}
{{- $_ := set .Values "__hmwTLS" (dict "caCert" ($ca.Cert | b64enc) "cert" ($cert.Cert | b64enc) "key" ($cert.Key | b64enc)) -}}
{{- end -}}
{{- end -}}
{{- toJson (get .Values "__hmwTLS") -}}
{{- end -}}

{{/* Where a webhook is called: the development URL plus the path, or the Service's path. Call as hmw.clientConfig. */}}
{{- define "hmw.endpoint" -}}
{{- with .root.Values.development.webhookURL }}{{ printf "%s%s" (trimSuffix "/" .) $.path }}{{ else }}{{ .path }}{{ end -}}
{{- end -}}

{{/*
With cert-manager: the caBundle each of this release's webhooks holds now, by endpoint (hmw.endpoint), read
with `lookup` and memoized like hmw.tls. Rendered back unchanged, so an upgrade never drops the bundle before
cainjector injects, nor fights it over the value (Helm 3's three-way patch, Helm 4's server-side apply): on
the move from the chart's own CA to cert-manager the chart's CA stays trusted while cainjector adds the root
beside it (cainjector merges since cert-manager 1.19), until the old CA is removed by hand
(docs/upgrading.md, "to cert-manager"). Empty where `lookup` cannot reach the cluster, and on a first install.
*/}}
{{- define "hmw.liveBundles" -}}
{{- if not (hasKey .Values "__hmwLiveBundles") -}}
{{- $out := dict -}}
{{- $name := include "hmw.name" . -}}
{{- $configs := list (list "MutatingWebhookConfiguration" $name) (list "MutatingWebhookConfiguration" (printf "%s-warn" $name))
      (list "ValidatingWebhookConfiguration" $name) (list "ValidatingWebhookConfiguration" (printf "%s-warn" $name))
      (list "ValidatingWebhookConfiguration" (printf "%s-workloads" $name))
      (list "ValidatingWebhookConfiguration" "hami-mt-annotation-guard") -}}
{{- range $configs -}}
{{- $config := lookup "admissionregistration.k8s.io/v1" (index . 0) "" (index . 1) | default dict -}}
{{- range (get $config "webhooks" | default list) -}}
{{- $cc := get . "clientConfig" | default dict -}}
{{- $key := get $cc "url" | default (get (get $cc "service" | default dict) "path") -}}
{{- $bundle := get $cc "caBundle" -}}
{{- if and $key $bundle (not (hasKey $out $key)) }}{{ $_ := set $out $key $bundle }}{{ end -}}
{{- end -}}
{{- end -}}
{{- $_ := set .Values "__hmwLiveBundles" $out -}}
{{- end -}}
{{- toJson (get .Values "__hmwLiveBundles") -}}
{{- end -}}

{{/* A webhook's clientConfig: the Service, or the development URL. Call with (dict "root" $ "path" "/mutate-pods"). */}}
{{- define "hmw.clientConfig" -}}
{{- $root := .root -}}
{{- $dev := $root.Values.development -}}
{{- if $dev.webhookURL }}
url: {{ printf "%s%s" (trimSuffix "/" $dev.webhookURL) .path | quote }}
{{- else }}
service:
  namespace: {{ $root.Release.Namespace }}
  name: {{ include "hmw.name" $root }}
  port: 443
  path: {{ .path }}
{{- end }}
{{- if not $root.Values.certManager.enabled }}
caBundle: {{ $dev.caBundle | default (include "hmw.tls" $root | fromJson).caCert }}
{{- else if $dev.caBundle }}
caBundle: {{ $dev.caBundle }}
{{- else }}
{{- with get (include "hmw.liveBundles" $root | fromJson) (include "hmw.endpoint" .) }}
caBundle: {{ . }}
{{- end }}
{{- end }}
{{- end -}}

{{/* Annotations of a webhook configuration: cert-manager's cainjector fills the caBundle. */}}
{{- define "hmw.webhookAnnotations" -}}
{{- if and .Values.certManager.enabled (not .Values.development.caBundle) }}
annotations:
  {{- with .Values.certManager.caBundleSecret }}
  cert-manager.io/inject-ca-from-secret: {{ printf "%s/%s" $.Release.Namespace . }}
  {{- else }}
  cert-manager.io/inject-ca-from: {{ printf "%s/%s" .Release.Namespace (include "hmw.name" .) }}
  {{- end }}
{{- end }}
{{- end -}}

{{/* Checks of values the API server would otherwise refuse only at install time. */}}
{{- define "hmw.validate" -}}
{{- include "hmw.validateCertManager" . -}}
{{- if not (has .Values.failurePolicy (list "Fail" "Ignore")) }}{{ fail "failurePolicy must be Fail or Ignore" }}{{ end -}}
{{- if not (has .Values.enforcement (list "deny" "warn")) }}{{ fail "enforcement must be deny or warn" }}{{ end -}}
{{- if not (has .Values.workloadCheck.failurePolicy (list "Fail" "Ignore")) }}{{ fail "workloadCheck.failurePolicy must be Fail or Ignore" }}{{ end -}}
{{- $t := int .Values.timeoutSeconds -}}
{{- if or (lt $t 1) (gt $t 30) }}{{ fail "timeoutSeconds must be between 1 and 30" }}{{ end -}}
{{- if not (has .Values.antiAffinity (list "soft" "hard" "none")) }}{{ fail "antiAffinity must be soft, hard or none" }}{{ end -}}
{{- end -}}

{{/*
The validating webhook's second matchCondition: send the pod only when it changed after the mutating webhook,
by rebuilding the record that webhook wrote (hami_mt_webhook/rules/record.py; templates/webhooks.yaml says why).
*/}}
{{- define "hmw.podChangedAfterMutation" -}}
{{- $whole := list -}}
{{- range (include "hmw.wholeCardNames" . | fromJsonArray) }}{{ $whole = append $whole (include "hmw.celString" .) }}{{ end -}}
request.operation != 'CREATE' ||
!has(object.metadata.annotations) ||
!('hami-mt.mthreads.com/admitted' in object.metadata.annotations) ||
!has(object.spec.schedulerName) || object.spec.schedulerName != {{ include "hmw.celString" .Values.schedulerName }} ||
(has(object.metadata.labels) && 'hami.io/webhook' in object.metadata.labels &&
object.metadata.labels['hami.io/webhook'] == 'ignore') ||
object.metadata.annotations['hami-mt.mthreads.com/admitted'] != 'v1|' +
(has(object.spec.nodeName) && object.spec.nodeName != '' ? 'N' : '') + '|' +
{{ include "hmw.ownedList" . }}.map(a,
a in object.metadata.annotations ? '1' : '0').join('') + '|' +
[has(object.spec.initContainers) ? object.spec.initContainers : [], object.spec.containers].map(g,
g.map(c,
(has(c.restartPolicy) && c.restartPolicy == 'Always' ? 'S' : '') +
(has(c.securityContext) && has(c.securityContext.privileged) && c.securityContext.privileged ? 'P' : '') +
(has(c.resources) && [{{ join ", " $whole }}].exists(r,
(has(c.resources.limits) && r in c.resources.limits) ||
(has(c.resources.requests) && r in c.resources.requests)) ? 'W' : '') + ':' +
{{ include "hmw.sliceList" . }}.map(r,
(has(c.resources) && has(c.resources.limits) && r in c.resources.limits ? c.resources.limits[r] : '-') +
'/' +
(has(c.resources) && has(c.resources.requests) && r in c.resources.requests ?
c.resources.requests[r] : '-')).join(',')).join('+')).join('|')
{{- end -}}

{{/* The owned annotations (SPEC 4.6) as a CEL list literal, and the owners' usernames as JSON. */}}
{{- define "hmw.ownedList" -}}
{{- $items := list -}}
{{- range .Values.annotationGuard.annotations }}{{ $items = append $items (include "hmw.celString" .) }}{{ end -}}
[{{ join ", " $items }}]
{{- end -}}

{{- define "hmw.annotationOwners" -}}
{{- $o := .Values.annotationGuard.owners -}}
{{- $out := list -}}
{{- range $o.serviceAccounts }}{{ $out = append $out (printf "system:serviceaccount:%s:%s" $o.namespace .) }}{{ end -}}
{{- concat $out ($o.users | default list) | toJson -}}
{{- end -}}

{{/* The guard's matchConditions, shared by its policy and its webhook registrations (SPEC 4.6). */}}
{{- define "hmw.guardConditions" -}}
{{- $owners := list -}}
{{- range (include "hmw.annotationOwners" . | fromJsonArray) }}{{ $owners = append $owners (include "hmw.celString" .) }}{{ end -}}
# Only requests that add, change or remove an owned annotation: kubelet's status updates never match.
- name: changes-owned-annotation
  expression: >-
    {{- include "hmw.ownedChanged" (dict "root" . "verb" "exists") | nindent 4 }}
# The owners may change them on UPDATE; no one may create a pod carrying one.
- name: not-an-owner
  expression: >-
    request.operation == 'CREATE' || !(request.userInfo.username in
    [{{ join ", " $owners }}])
{{- end -}}

{{/* The owned annotations that differ between oldObject and object; call with (dict "root" $ "verb" "exists"). */}}
{{- define "hmw.ownedChanged" -}}
{{ include "hmw.ownedList" .root }}.{{ .verb }}(a,
(has(object.metadata.annotations) && a in object.metadata.annotations ?
[object.metadata.annotations[a]] : []) !=
(request.operation == 'UPDATE' && has(oldObject.metadata.annotations) &&
a in oldObject.metadata.annotations ? [oldObject.metadata.annotations[a]] : []))
{{- end -}}

{{/* The selector every placement rule counts replicas by: the Deployment's own. */}}
{{- define "hmw.selector" -}}
{{- dict "matchLabels" (dict "app.kubernetes.io/name" (include "hmw.name" .)) | toYaml -}}
{{- end -}}

{{/* topologySpreadConstraints: by node, then by zone (docs/operating.md, "Where the replicas run"). */}}
{{- define "hmw.topologySpread" -}}
{{- $spread := .Values.topologySpread -}}
{{- $out := list -}}
{{- range (list (list "kubernetes.io/hostname" $spread.hostname) (list "topology.kubernetes.io/zone" $spread.zone)) -}}
{{- $c := index . 1 -}}
{{- if $c.enabled -}}
{{- $out = append $out (dict "topologyKey" (index . 0) "maxSkew" (int $c.maxSkew)
      "whenUnsatisfiable" $c.whenUnsatisfiable "nodeTaintsPolicy" "Honor"
      "labelSelector" (include "hmw.selector" $ | fromYaml) "matchLabelKeys" (list "pod-template-hash")) -}}
{{- end -}}
{{- end -}}
{{- if $out }}{{ toYaml $out }}{{ end -}}
{{- end -}}

{{/* The pods' affinity: the user's `affinity`, with the chart's terms appended to its lists (a preference
     for nodes without GPU labels, the antiAffinity term), so neither replaces the other. */}}
{{- define "hmw.affinity" -}}
{{- $affinity := deepCopy (.Values.affinity | default dict) -}}
{{- $avoid := .Values.avoidGpuNodes -}}
{{- if and $avoid.enabled $avoid.labelKeys -}}
{{- $expressions := list -}}
{{- range $avoid.labelKeys }}{{ $expressions = append $expressions (dict "key" . "operator" "DoesNotExist") }}{{ end -}}
{{- /* One term, its expressions ANDed: only a node with none of the labels earns the weight. */ -}}
{{- $term := dict "weight" (int $avoid.weight) "preference" (dict "matchExpressions" $expressions) -}}
{{- $node := get $affinity "nodeAffinity" | default dict -}}
{{- $terms := get $node "preferredDuringSchedulingIgnoredDuringExecution" | default list -}}
{{- $_ := set $node "preferredDuringSchedulingIgnoredDuringExecution" (append $terms $term) -}}
{{- $_ = set $affinity "nodeAffinity" $node -}}
{{- end -}}
{{- if ne .Values.antiAffinity "none" -}}
{{- $byHost := dict "topologyKey" "kubernetes.io/hostname" "labelSelector" (include "hmw.selector" . | fromYaml) -}}
{{- $key := "requiredDuringSchedulingIgnoredDuringExecution" -}}
{{- $term := $byHost -}}
{{- if eq .Values.antiAffinity "soft" -}}
{{- $key = "preferredDuringSchedulingIgnoredDuringExecution" -}}
{{- $term = dict "weight" 100 "podAffinityTerm" $byHost -}}
{{- end -}}
{{- $pod := get $affinity "podAntiAffinity" | default dict -}}
{{- $_ := set $pod $key (append (get $pod $key | default list) $term) -}}
{{- $_ = set $affinity "podAntiAffinity" $pod -}}
{{- end -}}
{{- if $affinity }}{{ toYaml $affinity }}{{ end -}}
{{- end -}}

{{/* cert-manager's durations: renewBefore shorter than the duration it renews (cert-manager would refuse the
Certificate only after install, leaving the webhook without a certificate). Go durations, compared in hours. */}}
{{- define "hmw.validateCertManager" -}}
{{- $cm := .Values.certManager }}
{{- if $cm.enabled }}
{{- range $what, $pair := dict "certManager" (list $cm.duration $cm.renewBefore) "certManager.root" (list $cm.root.duration $cm.root.renewBefore) }}
{{- $d := include "hmw.hours" (index $pair 0) | float64 }}
{{- $r := include "hmw.hours" (index $pair 1) | float64 }}
{{- if ge $r $d }}{{ fail (printf "%s.renewBefore (%s) must be shorter than %s.duration (%s)" $what (index $pair 1) $what (index $pair 0)) }}{{ end }}
{{- end }}
{{- if le (include "hmw.hours" $cm.root.duration | float64) (include "hmw.hours" $cm.duration | float64) }}
{{- fail (printf "certManager.root.duration (%s) must be longer than certManager.duration (%s): the root signs every serving certificate" $cm.root.duration $cm.duration) }}
{{- end }}
{{- end }}
{{- end -}}

{{/* A Go duration as the schema accepts it (e.g. 2160h, 90m, 1h30m) in hours. */}}
{{- define "hmw.hours" -}}
{{- $total := 0.0 }}
{{- range regexFindAll "[0-9]+(ms|s|m|h)" . -1 }}
{{- $n := regexFind "^[0-9]+" . | float64 }}
{{- $unit := regexReplaceAll "^[0-9]+" . "" }}
{{- $total = addf $total (divf $n (get (dict "h" 1.0 "m" 60.0 "s" 3600.0 "ms" 3600000.0) $unit)) }}
{{- end }}
{{- $total }}
{{- end -}}

{{/* A Kubernetes label key and value, for the checks below (RE2, as kubectl's parser reads them). */}}
{{- define "hmw.labelKeyRE" -}}([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?{{- end -}}
{{- define "hmw.labelValueRE" -}}[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?{{- end -}}

{{/* The flags an operator sets through values beyond the rules' (hami_mt_webhook/admission/chart.py maps
     each flag to its value), as a JSON list of arguments: none with the defaults, so the Deployment stays the
     kustomize base's. A value the schema cannot judge fails here, named, as the server would refuse it (or,
     for the node selector, as the API server would refuse every watch). */}}
{{- define "hmw.settingsArgs" -}}
{{- $args := list -}}
{{- with .Values.retiredSchedulers }}{{ $args = concat $args (list "--retired-schedulers" (join "," .)) }}{{ end -}}
{{- with .Values.slicedNodeTaint -}}
{{- if not (regexMatch (printf `^%s(=(%s)?)?:(NoSchedule|PreferNoSchedule|NoExecute)$` (include "hmw.labelKeyRE" $) (include "hmw.labelValueRE" $)) .) -}}
{{- fail (printf "slicedNodeTaint must read key[=value]:effect with effect NoSchedule, PreferNoSchedule or NoExecute, as kubectl taint writes it, e.g. example.com/sliced=true:NoSchedule; got %q" .) -}}
{{- end -}}
{{- $args = concat $args (list "--sliced-node-taint" .) -}}
{{- end -}}
{{- with .Values.nodeWatch -}}
{{- with .mode }}{{ $args = concat $args (list "--node-watch" .) }}{{ end -}}
{{- with .selector -}}
{{- $key := include "hmw.labelKeyRE" $ -}}
{{- $value := include "hmw.labelValueRE" $ -}}
{{- $one := printf `(!?%s|%s\s*(=|==|!=)\s*(%s)?|%s\s+(in|notin)\s+\(\s*%s(\s*,\s*%s)*\s*\))` $key $key $value $key $value $value -}}
{{- if not (regexMatch (printf `^\s*%s(\s*,\s*%s)*\s*$` $one $one) .) -}}
{{- fail (printf "nodeWatch.selector must be a label selector as kubectl get -l takes it, e.g. mthreads.com/gpu-node or gpu=on,zone in (a,b); got %q" .) -}}
{{- end -}}
{{- $args = concat $args (list "--node-selector" .) -}}
{{- end -}}
{{- end -}}
{{- with .Values.clientCA -}}
{{- if and .secret .configMap -}}
{{- fail (printf "clientCA.secret (%q) and clientCA.configMap (%q) are both set: name the one that holds the CA" .secret .configMap) -}}
{{- end -}}
{{- if or .secret .configMap }}{{ $args = concat $args (list "--client-ca" "/client-ca/ca.crt") }}{{ end -}}
{{- end -}}
{{- with .Values.certificate.reloadInterval }}{{ $args = concat $args (list "--reload-interval" (toString .)) }}{{ end -}}
{{- with .Values.logging -}}
{{- with .level }}{{ $args = concat $args (list "--log-level" .) }}{{ end -}}
{{- with .format }}{{ $args = concat $args (list "--log-format" .) }}{{ end -}}
{{- end -}}
{{- with .Values.listener.maxConnections }}{{ $args = concat $args (list "--max-connections" (int64 . | toString)) }}{{ end -}}
{{- range $value, $flag := dict "handshakeTimeout" "--handshake-timeout" "idleTimeout" "--idle-timeout" "requestTimeout" "--request-timeout" "writeTimeout" "--write-timeout" -}}
{{- with index $.Values.listener $value }}{{ $args = concat $args (list $flag (toString .)) }}{{ end -}}
{{- end -}}
{{- toJson $args -}}
{{- end -}}
