#!/usr/bin/env bash
# Installs what inplaced's tests need, and skips whatever is already there:
#   - Debian packages: containerd (1.6), runc, CNI plugins, busybox-static,
#     skopeo, protoc, iproute2, iptables, socat (a floor in make bench);
#   - pinned Go tools under ${INPLACED_TOOLS:-/var/cache/inplaced/tools}:
#       containerd-v2.4.2/bin/{containerd,containerd-shim-runc-v2}
#       bin/{crictl,critest,protoc-gen-go,protoc-gen-go-grpc,promtool}
#       kubelet-v1.37.2/kubelet            (only with INPLACED_WITH_KUBELET=1)
#       kube-apiserver-v1.37.2/kube-apiserver, kubectl-v1.37.2/kubectl, etcd-v3.6.16/etcd
#                                          (only with INPLACED_WITH_KUBELET=1:
#                                          hack/build-control-plane.sh)
# Each Go tool has a stamp file holding its version; a changed pin reinstalls it.
# Every fresh build is timed; the last line sums them up ("fresh builds took: ...").
#
# Caches, each overridable from the environment (defaults in brackets):
#   INPLACED_TOOLS     the tools above           [/var/cache/inplaced/tools]
#   INPLACED_VM_CACHE  the node guest's image    [/var/cache/inplaced/vm] (hack/vm/build-image.sh)
#   GOMODCACHE, GOCACHE  Go's module and build caches [go env's: ~/go/pkg/mod, ~/.cache/go-build]
#   APT_CONFIG         apt's own (Dir::Cache for /var/cache/apt)
#   TMPDIR             scratch modules while building              [/tmp]
#
# Usage: hack/install-deps.sh [--no-apt]
set -euo pipefail

CONTAINERD_VERSION="${CONTAINERD_VERSION:-v2.4.2}"
CRI_TOOLS_VERSION="${CRI_TOOLS_VERSION:-v1.37.0}"
PROTOC_GEN_GO_VERSION="${PROTOC_GEN_GO_VERSION:-v1.36.12}"
PROTOC_GEN_GO_GRPC_VERSION="${PROTOC_GEN_GO_GRPC_VERSION:-v1.5.1}"
# promtool (check metrics on inplaced's /metrics in the e2e test), from the
# Prometheus Go module: v0.316.0 is Prometheus 3.16.
PROMETHEUS_VERSION="${PROMETHEUS_VERSION:-v0.316.0}"
# Built by hack/build-kubelet.sh and hack/build-control-plane.sh (the same
# defaults; exported so that they agree).
export KUBELET_VERSION="${KUBELET_VERSION:-v1.37.2}"
export KUBE_APISERVER_VERSION="${KUBE_APISERVER_VERSION:-v1.37.2}"

TOOLS="${INPLACED_TOOLS:-/var/cache/inplaced/tools}"
HACK="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SCRATCH="${TMPDIR:-/tmp}"
APT_PACKAGES=(containerd runc containernetworking-plugins busybox-static skopeo protobuf-compiler iproute2 iptables socat graphviz curl)

log() { printf '[install-deps] %s\n' "$*" >&2; }
# shellcheck source=lib/timing.sh
source "${HACK}/lib/timing.sh"

# One EXIT trap for everything this script leaves to clean up.
cleanup=()
on_exit() { local c; for c in "${cleanup[@]}"; do eval "${c}"; done; }
trap on_exit EXIT
# The fresh builds' times, written by timing_record (here and in the build
# scripts run below) and summed up at the end.
INPLACED_DEPS_TIMES="$(mktemp "${SCRATCH}/inplaced-deps-times.XXXXXX")"
export INPLACED_DEPS_TIMES
cleanup+=('rm -f "${INPLACED_DEPS_TIMES}"')

with_apt=1
for arg in "$@"; do
	case "${arg}" in
	--no-apt) with_apt=0 ;;
	*) log "unknown argument ${arg}"; exit 2 ;;
	esac
done

# --- Debian packages ----------------------------------------------------------
install_apt() {
	local missing=()
	for p in "${APT_PACKAGES[@]}"; do
		if ! dpkg-query -W -f='${Status}' "${p}" 2>/dev/null | grep -q "install ok installed"; then
			missing+=("${p}")
		fi
	done
	if ((${#missing[@]} == 0)); then
		log "apt packages present"
		return
	fi
	if [[ $(id -u) -ne 0 ]]; then
		log "need root to install: ${missing[*]}"
		exit 1
	fi
	log "apt-get install ${missing[*]}"
	local start=${SECONDS}
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	# The containerd package must not start a system containerd: the tests run
	# their own instances (policy-rc.d is honoured by invoke-rc.d).
	local policy=/usr/sbin/policy-rc.d
	if [[ ! -e ${policy} ]]; then
		printf '#!/bin/sh\nexit 101\n' >"${policy}"
		chmod +x "${policy}"
		cleanup+=('rm -f /usr/sbin/policy-rc.d')
	fi
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
	log "apt packages installed in $((SECONDS - start))s"
	timing_record apt $((SECONDS - start))
}

# --- Go tools -----------------------------------------------------------------
stamp_ok() { [[ -f "$1" && "$(cat "$1")" == "$2" ]]; }

# go_install <dest bin dir> <stamp name> <version> <build tags> <package@version>...
go_install() {
	local bindir="$1" name="$2" version="$3" tags="$4"
	shift 4
	local stamp="${bindir}/.${name}.version" pkg present=1
	for pkg in "$@"; do
		pkg="${pkg%@*}"
		[[ -x "${bindir}/${pkg##*/}" ]] || present=0
	done
	if ((present)) && stamp_ok "${stamp}" "${version}"; then
		log "${name} ${version} present"
		return
	fi
	mkdir -p "${bindir}"
	log "go install ${name} ${version}"
	local start=${SECONDS}
	GOBIN="${bindir}" GOFLAGS="${GOFLAGS:-} -trimpath" go install -tags "${tags}" -ldflags "-s -w" "$@"
	echo "${version}" >"${stamp}"
	log "${name} ${version} installed in $((SECONDS - start))s"
	timing_record "${name}" $((SECONDS - start))
}

install_critest() {
	local bindir="${TOOLS}/bin" version="${CRI_TOOLS_VERSION}"
	local stamp="${bindir}/.critest.version"
	if stamp_ok "${stamp}" "${version}" && [[ -x "${bindir}/critest" ]]; then
		log "critest ${version} present"
		return
	fi
	mkdir -p "${bindir}"
	log "building critest ${version}"
	local start=${SECONDS} work
	work="$(mktemp -d "${SCRATCH}/inplaced-critest.XXXXXX")"
	(
		trap 'rm -rf "${work}"' EXIT
		cd "${work}"
		go mod init inplaced.local/critest-build >/dev/null 2>&1
		GOFLAGS=-mod=mod go get "sigs.k8s.io/cri-tools@${version}" >/dev/null 2>&1
		# critest is a test binary: its go.sum entries come with the test deps.
		GOFLAGS=-mod=mod go test -c -trimpath -ldflags "-s -w" -o "${bindir}/critest.tmp" sigs.k8s.io/cri-tools/cmd/critest
	)
	mv "${bindir}/critest.tmp" "${bindir}/critest"
	echo "${version}" >"${stamp}"
	log "critest ${version} built in $((SECONDS - start))s"
	timing_record critest $((SECONDS - start))
}

# kubelet, kube-apiserver and kubectl come from the same k8s.io/kubernetes
# module: when all are missing, one scratch module and one `go build` make
# them; the build scripts then find them present (and build etcd, or
# whichever one is missing).
install_kubernetes() {
	local kubelet="${TOOLS}/kubelet-${KUBELET_VERSION}/kubelet"
	local apiserver="${TOOLS}/kube-apiserver-${KUBE_APISERVER_VERSION}/kube-apiserver"
	local kubectl="${TOOLS}/kubectl-${KUBE_APISERVER_VERSION}/kubectl"
	if [[ ! -x ${kubelet} && ! -x ${apiserver} && ${KUBELET_VERSION} == "${KUBE_APISERVER_VERSION}" ]]; then
		# shellcheck source=lib/k8s-build.sh
		source "${HACK}/lib/k8s-build.sh"
		log "building kubelet, kube-apiserver and kubectl ${KUBELET_VERSION} (one go build)"
		local start=${SECONDS}
		k8s_build "${KUBELET_VERSION}" k8s.io/kubernetes/cmd/kubelet "${kubelet}" \
			k8s.io/kubernetes/cmd/kube-apiserver "${apiserver}" \
			k8s.io/kubernetes/cmd/kubectl "${kubectl}"
		log "kubelet, kube-apiserver and kubectl ${KUBELET_VERSION} built in $((SECONDS - start))s"
		timing_record kubelet+kube-apiserver+kubectl $((SECONDS - start))
		"${kubelet}" --version >&2
		"${apiserver}" --version >&2
	fi
	"${HACK}/build-kubelet.sh"
	"${HACK}/build-control-plane.sh"
}

main() {
	local start=${SECONDS}
	if ((with_apt)); then install_apt; fi
	command -v go >/dev/null || { log "go not in PATH"; exit 1; }
	mkdir -p "${TOOLS}/bin"

	go_install "${TOOLS}/containerd-${CONTAINERD_VERSION}/bin" containerd "${CONTAINERD_VERSION}" no_btrfs \
		"github.com/containerd/containerd/v2/cmd/containerd@${CONTAINERD_VERSION}" \
		"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@${CONTAINERD_VERSION}"
	go_install "${TOOLS}/bin" crictl "${CRI_TOOLS_VERSION}" "" "sigs.k8s.io/cri-tools/cmd/crictl@${CRI_TOOLS_VERSION}"
	install_critest
	go_install "${TOOLS}/bin" protoc-gen-go "${PROTOC_GEN_GO_VERSION}" "" \
		"google.golang.org/protobuf/cmd/protoc-gen-go@${PROTOC_GEN_GO_VERSION}"
	go_install "${TOOLS}/bin" protoc-gen-go-grpc "${PROTOC_GEN_GO_GRPC_VERSION}" "" \
		"google.golang.org/grpc/cmd/protoc-gen-go-grpc@${PROTOC_GEN_GO_GRPC_VERSION}"
	# remove_all_sd (plugins/plugin_*.go in the Prometheus module) drops the
	# service discoveries promtool does not need for `check metrics` (AWS, Azure,
	# GCE, ... SDKs); file, http and kubernetes SD stay.
	go_install "${TOOLS}/bin" promtool "${PROMETHEUS_VERSION}" remove_all_sd \
		"github.com/prometheus/prometheus/cmd/promtool@${PROMETHEUS_VERSION}"

	if [[ "${INPLACED_WITH_KUBELET:-0}" == "1" ]]; then
		install_kubernetes
	fi
	log "done in $((SECONDS - start))s; tools in ${TOOLS}"
	local summary
	summary="$(timing_summary "${INPLACED_DEPS_TIMES}")"
	if [[ -n ${summary} ]]; then
		log "fresh builds took: ${summary}"
	else
		log "fresh builds took: nothing (all present)"
	fi
}

main
