#!/usr/bin/env bash
# Builds the processes of a Kubernetes control plane for the e2e harness
# (test/harness/controlplane.go, controllers.go) from the Go module proxy:
#   ${INPLACED_TOOLS:-/var/cache/inplaced/tools}/kube-apiserver-${KUBE_APISERVER_VERSION}/kube-apiserver
#   ${INPLACED_TOOLS:-/var/cache/inplaced/tools}/etcd-${ETCD_VERSION}/etcd
#   ${INPLACED_TOOLS:-/var/cache/inplaced/tools}/kubectl-${KUBE_APISERVER_VERSION}/kubectl
#   ${INPLACED_TOOLS:-/var/cache/inplaced/tools}/kube-controller-manager-${KUBE_APISERVER_VERSION}/kube-controller-manager
#   ${INPLACED_TOOLS:-/var/cache/inplaced/tools}/kube-scheduler-${KUBE_APISERVER_VERSION}/kube-scheduler
# and skips each one that is already there (--force rebuilds them). Most
# tests bind pods with spec.nodeName and talk to the API with client-go; the
# node guest also runs the controller-manager and the scheduler, so that the
# installer's DaemonSet and the chart's uninstall Job are rolled out by the
# real controllers (kube-scheduler is the same path hack/build-openkruise.sh
# uses: whichever runs first builds it). kubectl is there to run the
# kubectl-inplace plugin the way users do (`kubectl inplace ...`).
set -euo pipefail

KUBE_APISERVER_VERSION="${KUBE_APISERVER_VERSION:-v1.37.2}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
TOOLS="${INPLACED_TOOLS:-/var/cache/inplaced/tools}"
HACK="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
APISERVER="${TOOLS}/kube-apiserver-${KUBE_APISERVER_VERSION}/kube-apiserver"
ETCD="${TOOLS}/etcd-${ETCD_VERSION}/etcd"
KUBECTL="${TOOLS}/kubectl-${KUBE_APISERVER_VERSION}/kubectl"
KCM="${TOOLS}/kube-controller-manager-${KUBE_APISERVER_VERSION}/kube-controller-manager"
SCHEDULER="${TOOLS}/kube-scheduler-${KUBE_APISERVER_VERSION}/kube-scheduler"

log() { printf '[build-control-plane] %s\n' "$*" >&2; }
# shellcheck source=lib/k8s-build.sh
source "${HACK}/lib/k8s-build.sh"
# shellcheck source=lib/timing.sh
source "${HACK}/lib/timing.sh"

force=0
[[ "${1:-}" == "--force" ]] && force=1

# etcd's server module cannot be `go install`ed either (its go.mod has replace
# directives): a scratch main package calls etcdmain.Main, the etcd command.
build_etcd() {
	local work
	work="$(mktemp -d "${TMPDIR:-/tmp}/inplaced-etcd.XXXXXX")"
	(
		trap 'rm -rf "${work}"' EXIT
		cd "${work}"
		export GOFLAGS="${GOFLAGS:-} -mod=mod"
		go mod init inplaced.local/etcd-build >/dev/null 2>&1
		cat >main.go <<'GO'
// Command etcd is etcd's own command (etcdmain), built from the module proxy.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
		go get "go.etcd.io/etcd/server/v3@${ETCD_VERSION}" >/dev/null
		go mod tidy >/dev/null
		mkdir -p "$(dirname "${ETCD}")"
		CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "${ETCD}.tmp" .
	)
	mv "${ETCD}.tmp" "${ETCD}"
}

# One after the other: each build uses every core on its own.
if [[ -x "${ETCD}" && ${force} == 0 ]]; then
	log "etcd ${ETCD_VERSION} present at ${ETCD}"
else
	start=$(date +%s)
	log "building etcd ${ETCD_VERSION}"
	build_etcd
	log "built ${ETCD} in $(( $(date +%s) - start ))s"
	timing_record etcd $(( $(date +%s) - start ))
	"${ETCD}" --version >&2
fi

# kube-apiserver and kubectl share most of their packages: one build.
k8s_cmds=()
if [[ -x "${APISERVER}" && ${force} == 0 ]]; then
	log "kube-apiserver ${KUBE_APISERVER_VERSION} present at ${APISERVER}"
else
	k8s_cmds+=(k8s.io/kubernetes/cmd/kube-apiserver "${APISERVER}")
fi
if [[ -x "${KUBECTL}" && ${force} == 0 ]]; then
	log "kubectl ${KUBE_APISERVER_VERSION} present at ${KUBECTL}"
else
	k8s_cmds+=(k8s.io/kubernetes/cmd/kubectl "${KUBECTL}")
fi
if (( ${#k8s_cmds[@]} > 0 )); then
	start=$(date +%s)
	log "building ${k8s_cmds[0]##*/}${k8s_cmds[2]:+ and ${k8s_cmds[2]##*/}} ${KUBE_APISERVER_VERSION}"
	k8s_build "${KUBE_APISERVER_VERSION}" "${k8s_cmds[@]}"
	log "built in $(( $(date +%s) - start ))s"
	timing_record kube-apiserver+kubectl $(( $(date +%s) - start ))
	"${APISERVER}" --version >&2
	"${KUBECTL}" version --client >&2
fi

# The controller-manager and the scheduler: one more build of the same
# scratch module (their packages are mostly in the build cache by now).
k8s_cmds=()
if [[ -x "${KCM}" && ${force} == 0 ]]; then
	log "kube-controller-manager ${KUBE_APISERVER_VERSION} present at ${KCM}"
else
	k8s_cmds+=(k8s.io/kubernetes/cmd/kube-controller-manager "${KCM}")
fi
if [[ -x "${SCHEDULER}" && ${force} == 0 ]]; then
	log "kube-scheduler ${KUBE_APISERVER_VERSION} present at ${SCHEDULER}"
else
	k8s_cmds+=(k8s.io/kubernetes/cmd/kube-scheduler "${SCHEDULER}")
fi
if (( ${#k8s_cmds[@]} > 0 )); then
	start=$(date +%s)
	log "building ${k8s_cmds[0]##*/}${k8s_cmds[2]:+ and ${k8s_cmds[2]##*/}} ${KUBE_APISERVER_VERSION}"
	k8s_build "${KUBE_APISERVER_VERSION}" "${k8s_cmds[@]}"
	log "built in $(( $(date +%s) - start ))s"
	timing_record kube-controller-manager+kube-scheduler $(( $(date +%s) - start ))
	"${KCM}" --version >&2
	"${SCHEDULER}" --version >&2
fi
