{{/* Names fit Kubernetes' 63 characters with KubeRay's suffixes (-head-svc, -GROUP-...). */}}
{{- define "inferd.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 30 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 30 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "inferd.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "inferd.serveSelector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: serve
{{- end -}}

{{- define "inferd.image" -}}
{{ printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end -}}

{{/* The RayCluster; KubeRay names its head Service NAME-head-svc. */}}
{{- define "inferd.rayCluster" -}}
{{ include "inferd.fullname" . }}-ray
{{- end -}}

{{- define "inferd.rayAddress" -}}
{{ include "inferd.rayCluster" . }}-head-svc.{{ .Release.Namespace }}.svc:6379
{{- end -}}

{{- define "inferd.serviceUrl" -}}
http://{{ include "inferd.fullname" . }}.{{ .Release.Namespace }}.svc:{{ .Values.service.port }}
{{- end -}}

{{- define "inferd.cnpgCluster" -}}
{{ include "inferd.fullname" . }}-db
{{- end -}}

{{/* Containers run as the image's user (uid 10001), with nothing more. */}}
{{- define "inferd.containerSecurity" -}}
allowPrivilegeEscalation: false
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 0
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* `inferd node start` in a Ray pod: the node declares its location and
GPUs as Ray resources itself (KubeRay's generated `ray start` is replaced,
see ray.io/overwrite-container-cmd on the RayCluster). */}}
{{- define "inferd.nodeStartArgs" -}}
- node
- start
{{- if .head }}
- --head
{{- else }}
- --address
- {{ .address | quote }}
{{- end }}
- --location
- {{ .location | quote }}
{{- if .gpuType }}
- --gpu-type
- {{ .gpuType | quote }}
- --gpu-count
- {{ .gpuCount | quote }}
{{- end }}
- --node-ip-address
- $(POD_IP)
- --
- --block
{{- if .noWork }}
- --num-cpus=0
{{- end }}
{{- end -}}

{{- define "inferd.podIpEnv" -}}
- name: POD_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
{{- end -}}

{{/* A container that asks for no GPU sees none, even where the NVIDIA
runtime is the node's default (the image asks for all): otherwise `inferd
node start` would declare GPUs that the device plugin gives to other pods. */}}
{{- define "inferd.noGpuEnv" -}}
- name: NVIDIA_VISIBLE_DEVICES
  value: void
{{- end -}}
