#!/usr/bin/env bash
# Builds a standalone kubelet from the Go module proxy into
#   ${INPLACED_TOOLS:-/var/cache/inplaced/tools}/kubelet-${KUBELET_VERSION}/kubelet
# and skips the build when that binary is already there (--force rebuilds).
# The scratch-module recipe is in hack/lib/k8s-build.sh.
set -euo pipefail

KUBELET_VERSION="${KUBELET_VERSION:-v1.37.2}"
TOOLS="${INPLACED_TOOLS:-/var/cache/inplaced/tools}"
HACK="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DEST="${TOOLS}/kubelet-${KUBELET_VERSION}/kubelet"

log() { printf '[build-kubelet] %s\n' "$*" >&2; }
# shellcheck source=lib/k8s-build.sh
source "${HACK}/lib/k8s-build.sh"
# shellcheck source=lib/timing.sh
source "${HACK}/lib/timing.sh"

if [[ -x "${DEST}" && "${1:-}" != "--force" ]]; then
	log "kubelet ${KUBELET_VERSION} present at ${DEST}"
	exit 0
fi

start=$(date +%s)
log "building kubelet ${KUBELET_VERSION}"
k8s_build "${KUBELET_VERSION}" k8s.io/kubernetes/cmd/kubelet "${DEST}"
log "built ${DEST} in $(( $(date +%s) - start ))s"
timing_record kubelet $(( $(date +%s) - start ))
"${DEST}" --version >&2
