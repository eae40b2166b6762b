#!/usr/bin/env bash
# Builds OpenKruise and the scheduler its workloads need, from the Go module
# proxy, for the e2e harness (test/harness/kruise.go):
#   ${INPLACED_TOOLS:-/var/cache/inplaced/tools}/kruise-${KRUISE_VERSION}/
#       kruise-manager, kruise-daemon    the two commands (./ and ./cmd/daemon)
#       crd/*.yaml                       config/crd/bases of the same module
#       webhook/*.yaml                   config/webhook (manifests + patch)
#       .version                         the stamp: ${KRUISE_VERSION}
#   ${INPLACED_TOOLS:-/var/cache/inplaced/tools}/kube-scheduler-${KUBE_SCHEDULER_VERSION}/kube-scheduler
# and skips each one that is already there with its stamp (--force rebuilds).
#
# kruise cannot be `go install`ed (its go.mod has replace directives): the
# module is downloaded, copied into a writable directory and built inside it,
# with its own go.mod (kruise pins k8s.io/* v0.32; hack/lib/module-src.sh). The scheduler is built like
# kube-apiserver (hack/lib/k8s-build.sh): with kube-apiserver and kubelet
# already in the Go build cache it is a short build.
set -euo pipefail

KRUISE_VERSION="${KRUISE_VERSION:-v1.9.1}"
KUBE_SCHEDULER_VERSION="${KUBE_SCHEDULER_VERSION:-${KUBE_APISERVER_VERSION:-v1.37.2}}"
TOOLS="${INPLACED_TOOLS:-/var/cache/inplaced/tools}"
HACK="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
KRUISE_DIR="${TOOLS}/kruise-${KRUISE_VERSION}"
SCHEDULER="${TOOLS}/kube-scheduler-${KUBE_SCHEDULER_VERSION}/kube-scheduler"

log() { printf '[build-openkruise] %s\n' "$*" >&2; }
# shellcheck source=lib/k8s-build.sh
source "${HACK}/lib/k8s-build.sh"
# shellcheck source=lib/module-src.sh
source "${HACK}/lib/module-src.sh"
# shellcheck source=lib/timing.sh
source "${HACK}/lib/timing.sh"

force=0
[[ "${1:-}" == "--force" ]] && force=1

build_kruise() {
	local work
	work="$(mktemp -d "${TMPDIR:-/tmp}/inplaced-kruise.XXXXXX")"
	(
		trap 'chmod -R u+w "${work}"; rm -rf "${work}"' EXIT
		module_src github.com/openkruise/kruise "${KRUISE_VERSION}" "${work}/src"
		cd "${work}/src"
		export GOFLAGS="${GOFLAGS:-} -mod=mod" CGO_ENABLED=0
		local out="${KRUISE_DIR}.tmp"
		rm -rf "${out}"
		mkdir -p "${out}/crd" "${out}/webhook"
		# One build for both: one module resolution, and the daemon's
		# packages compile while the manager links.
		mkdir "${work}/bin"
		go build -trimpath -ldflags "-s -w" -o "${work}/bin/" . ./cmd/daemon
		mv "${work}/bin/kruise" "${out}/kruise-manager"
		mv "${work}/bin/daemon" "${out}/kruise-daemon"
		cp config/crd/bases/*.yaml "${out}/crd/"
		cp config/webhook/*.yaml "${out}/webhook/"
		echo "${KRUISE_VERSION}" >"${out}/.version"
	)
	rm -rf "${KRUISE_DIR}"
	mv "${KRUISE_DIR}.tmp" "${KRUISE_DIR}"
}

if [[ ${force} == 0 ]] && stamped "${KRUISE_DIR}" "${KRUISE_VERSION}" kruise-manager kruise-daemon; then
	log "kruise ${KRUISE_VERSION} present in ${KRUISE_DIR}"
else
	start=$(date +%s)
	log "building kruise-manager and kruise-daemon ${KRUISE_VERSION}"
	build_kruise
	log "built kruise ${KRUISE_VERSION} in $(( $(date +%s) - start ))s"
	timing_record kruise $(( $(date +%s) - start ))
fi

if [[ ${force} == 0 && -x "${SCHEDULER}" ]]; then
	log "kube-scheduler ${KUBE_SCHEDULER_VERSION} present at ${SCHEDULER}"
else
	start=$(date +%s)
	log "building kube-scheduler ${KUBE_SCHEDULER_VERSION}"
	k8s_build "${KUBE_SCHEDULER_VERSION}" k8s.io/kubernetes/cmd/kube-scheduler "${SCHEDULER}"
	log "built kube-scheduler in $(( $(date +%s) - start ))s"
	timing_record kube-scheduler $(( $(date +%s) - start ))
	"${SCHEDULER}" --version >&2
fi
