{{/* The operator's rules in the namespaces it watches (a Role there, or a ClusterRole). Called
with a dict: `secrets` false leaves out the Secret rule (rbac.secretNamespaces grants it in
Roles instead). */}}
{{- define "specdeploy.namespacedRules" -}}
# The SDs: kopf lists and watches them (the operator's store of them) and takes off the
# finalizer an earlier version set (patch); get before that store is filled; the reconcile
# merge-patches their status.
- apiGroups: [specdeploy.dev]
  resources: [speculativedeployments]
  verbs: [get, list, watch, patch]
- apiGroups: [specdeploy.dev]
  resources: [speculativedeployments/status]
  verbs: [patch]
# Every child's owner reference blocks its SD's deletion until the child is gone
# (blockOwnerDeletion); with the OwnerReferencesPermissionEnforcement admission plugin (on in
# OpenShift) setting one needs update on the owner's finalizers.
- apiGroups: [specdeploy.dev]
  resources: [speculativedeployments/finalizers]
  verbs: [update]
# Revision Deployments: listed, watched (kopf), read by name before a new one is applied (is
# the name another's?), server-side applied (a patch, which needs create too when it makes
# the object), deleted when pruned.
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, watch, create, patch, delete]
# A revision made before revisions were recorded is resized through its scale subresource.
- apiGroups: [apps]
  resources: [deployments/scale]
  verbs: [patch]
# Each revision's record: created once, replaced (delete + create), deleted when pruned.
- apiGroups: [apps]
  resources: [controllerrevisions]
  verbs: [list, watch, create, delete]
# The SD's Service: read, watched (kopf), server-side applied.
- apiGroups: [""]
  resources: [services]
  verbs: [get, list, watch, create, patch]
# The engine pods: read for readiness and the launcher's exit; watched (kopf).
- apiGroups: [""]
  resources: [pods]
  verbs: [list, watch]
# The probe's readiness gate (specdeploy.dev/probe-judged), set on a pod once its revision's
# probe was judged (spec.rollout.analysis.probe).
- apiGroups: [""]
  resources: [pods/status]
  verbs: [patch]
{{- if .secrets }}
{{ include "specdeploy.secretRules" . }}
{{- end }}
# Events kopf posts about each SD.
- apiGroups: [""]
  resources: [events]
  verbs: [create]
# The PodMonitor of each SD, when the Prometheus Operator's CRD is there.
- apiGroups: [monitoring.coreos.com]
  resources: [podmonitors]
  verbs: [get, list, watch, create, patch]
# Revisions whose replicas span nodes: one LeaderWorkerSet each, listed, watched (kopf), read
# by name before a new one is applied, server-side applied, deleted when pruned (when the LeaderWorkerSet CRD is there).
- apiGroups: [leaderworkerset.x-k8s.io]
  resources: [leaderworkersets]
  verbs: [get, list, watch, create, patch, delete]
# Kueue: the Workloads of gated pods (what quota is missing) and the SD's LocalQueue, read
# from watch-fed copies (get until the copy is filled).
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads]
  verbs: [list, watch]
- apiGroups: [kueue.x-k8s.io]
  resources: [localqueues]
  verbs: [get, list, watch]
{{- end }}

{{- define "specdeploy.secretRules" -}}
# The hub token a SpeculativeDeployment names (spec.modelSource.hub.tokenSecretRef): one get.
- apiGroups: [""]
  resources: [secrets]
  verbs: [get]
{{- end }}
