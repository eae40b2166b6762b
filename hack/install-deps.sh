#!/usr/bin/env bash
# Installs what inplaced's tests need, and skips whatever is already there:
#   - Debian packages: containerd (1.6), runc, CNI plugins, busybox-static,
#     skopeo, protoc, iproute2, iptables, socat (a floor in make bench),
#     qemu-user-static (make test-arm64 runs the arm64 unit tests under
#     qemu-aarch64-static, called by go test -exec: no binfmt_misc needed);
#   - pinned Go tools under ${INPLACED_TOOLS:-/var/cache/inplaced/tools}:
#       containerd-v2.4.2/bin/{containerd,containerd-shim-runc-v2}
#       bin/{crictl,critest,protoc-gen-go,protoc-gen-go-grpc}
#       bin/helm                           (Helm v4: the chart's render tests in
#                                          cmd/inplaced-installer)
#       kubelet-v1.37.2/kubelet            (only with INPLACED_WITH_KUBELET=1)
#       kube-apiserver-v1.37.2/kube-apiserver, kubectl-v1.37.2/kubectl, etcd-v3.6.16/etcd,
#       kube-controller-manager-v1.37.2/kube-controller-manager,
#       kube-scheduler-v1.37.2/kube-scheduler
#                                          (only with INPLACED_WITH_KUBELET=1:
#                                          hack/build-control-plane.sh)
#       gvisor-<pseudo-version>/bin/{runsc,containerd-shim-runsc-v1}
#                                          (gVisor, the sandboxed runtime of the
#                                          e2e tests; INPLACED_WITH_GVISOR=0 skips it)
#       bin/h2spec                         (only with INPLACED_WITH_H2SPEC=1:
#                                          make conformance)
#       kruise-v1.9.1/{kruise-manager,kruise-daemon,crd/,webhook/}
#                                          (only with INPLACED_WITH_KUBELET=1:
#                                          hack/build-openkruise.sh)
#       k3s-<pseudo-version>/{k3s,kubectl,crictl}
#                                          (only with INPLACED_WITH_KUBELET=1:
#                                          hack/build-k3s.sh)
#   - with INPLACED_WITH_KUBELET=1 and INPLACED_WITH_VM_IMAGE=1, the node
#     guest's image (hack/vm/build-image.sh, cached in INPLACED_VM_CACHE),
#     built in the background while OpenKruise and k3s compile (make test).
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
HELM_VERSION="${HELM_VERSION:-v4.3.2}"
# gVisor publishes no Go module releases; its Go-only "go" branch is served by
# the module proxy as pseudo-versions. This one is gVisor of 2026-09-05.
GVISOR_VERSION="${GVISOR_VERSION:-v0.0.0-20260905035102-160fafc42237}"
# Built by hack/build-kubelet.sh and hack/build-control-plane.sh (the same
# defaults; exported so that they agree).
export KUBELET_VERSION="${KUBELET_VERSION:-v1.37.2}"
export KUBE_APISERVER_VERSION="${KUBE_APISERVER_VERSION:-v1.37.2}"
# h2spec (make conformance): no go.mod of its own, so its dependencies are
# pinned here, in a scratch module, to the versions it was run with.
H2SPEC_VERSION="${H2SPEC_VERSION:-v2.2.1+incompatible}"
H2SPEC_DEPS=(golang.org/x/net@v0.60.0 github.com/spf13/cobra@v1.10.2 github.com/spf13/pflag@v1.0.9 github.com/fatih/color@v1.19.0)

TOOLS="${INPLACED_TOOLS:-/var/cache/inplaced/tools}"
HACK="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SCRATCH="${TMPDIR:-/tmp}"
APT_PACKAGES=(containerd runc containernetworking-plugins busybox-static skopeo protobuf-compiler iproute2 iptables nftables socat graphviz curl docker-registry qemu-user-static)

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

# install_gvisor builds runsc and containerd-shim-runsc-v1 in one `go build`
# (they share most packages) from a writable copy of the gVisor module, with
# one change: the shim lowers its own oom_score_adj to -999 and fails hard
# when the kernel denies it, as it does in VMs without CAP_SYS_RESOURCE in the
# bounding set (the reason the test containerd runs with
# restrict_oom_score_adj). The copy asks for 0 instead, i.e. leaves it as is.
# The shim speaks shim bootstrap protocol v2: containerd 2.x only.
install_gvisor() {
	local bindir="${TOOLS}/gvisor-${GVISOR_VERSION}/bin" version="${GVISOR_VERSION}+oom0"
	local stamp="${bindir}/.gvisor.version"
	if stamp_ok "${stamp}" "${version}" && [[ -x "${bindir}/runsc" && -x "${bindir}/containerd-shim-runsc-v1" ]]; then
		log "gvisor ${version} present"
		return
	fi
	mkdir -p "${bindir}"
	log "building gvisor ${version} (runsc, containerd-shim-runsc-v1)"
	local start=${SECONDS} work src
	work="$(mktemp -d "${SCRATCH}/inplaced-gvisor.XXXXXX")"
	(
		trap 'chmod -R u+w "${work}"; rm -rf "${work}"' EXIT
		cd "${work}" # outside any module: go mod download fetches the one asked for
		src="$(go mod download -json "gvisor.dev/gvisor@${GVISOR_VERSION}" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
		[[ -d ${src} ]] || { log "gvisor ${GVISOR_VERSION}: module not downloaded"; exit 1; }
		cp -r "${src}" "${work}/gvisor"
		chmod -R u+w "${work}/gvisor"
		local manager="${work}/gvisor/pkg/shim/v1/manager.go"
		grep -q '^[[:space:]]*oomScoreMax = -999$' "${manager}" || { log "gvisor: oomScoreMax = -999 not found in ${manager}"; exit 1; }
		sed -i 's/^\([[:space:]]*oomScoreMax = \)-999$/\10/' "${manager}"
		cd "${work}/gvisor"
		mkdir out
		CGO_ENABLED=0 GOFLAGS="${GOFLAGS:-} -trimpath -mod=mod" go build -ldflags "-s -w" -o out/ ./shim ./runsc
		mv out/runsc "${bindir}/runsc"
		mv out/shim "${bindir}/containerd-shim-runsc-v1"
	)
	echo "${version}" >"${stamp}"
	log "gvisor ${version} built in $((SECONDS - start))s"
	timing_record gvisor $((SECONDS - start))
}

# h2spec, the HTTP/2 conformance suite run by make conformance against the
# backends directly and through inplaced (test/conformance).
install_h2spec() {
	local bindir="${TOOLS}/bin" version="${H2SPEC_VERSION} ${H2SPEC_DEPS[*]}"
	local stamp="${bindir}/.h2spec.version"
	if stamp_ok "${stamp}" "${version}" && [[ -x "${bindir}/h2spec" ]]; then
		log "h2spec ${H2SPEC_VERSION} present"
		return
	fi
	mkdir -p "${bindir}"
	log "building h2spec ${H2SPEC_VERSION}"
	local start=${SECONDS} work
	work="$(mktemp -d "${SCRATCH}/inplaced-h2spec.XXXXXX")"
	(
		trap 'rm -rf "${work}"' EXIT
		cd "${work}"
		go mod init inplaced.local/h2spec-build >/dev/null 2>&1
		GOFLAGS=-mod=mod go get "github.com/summerwind/h2spec@${H2SPEC_VERSION}" "${H2SPEC_DEPS[@]}" >/dev/null 2>&1
		GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w" -o "${bindir}/h2spec.tmp" github.com/summerwind/h2spec/cmd/h2spec
	)
	mv "${bindir}/h2spec.tmp" "${bindir}/h2spec"
	echo "${version}" >"${stamp}"
	log "h2spec ${H2SPEC_VERSION} built in $((SECONDS - start))s"
	timing_record h2spec $((SECONDS - start))
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
	# The node guest's image needs kubelet, crictl and containerd 2.4 only,
	# and its build is mostly the Debian mirror and the disk: on a fresh
	# machine it runs while OpenKruise and k3s compile.
	local image_pid="" image_log="${SCRATCH}/inplaced-vm-image.log"
	if [[ "${INPLACED_WITH_VM_IMAGE:-0}" == "1" ]]; then
		log "building the node guest's image in the background (hack/vm/build-image.sh; log ${image_log})"
		"${HACK}/vm/build-image.sh" >/dev/null 2>"${image_log}" &
		image_pid=$!
	fi
	# After kube-apiserver: kube-scheduler's packages are then in the build cache.
	"${HACK}/build-openkruise.sh"
	"${HACK}/build-k3s.sh"
	if [[ -n ${image_pid} ]]; then
		if ! wait "${image_pid}"; then
			cat "${image_log}" >&2
			log "the node guest's image failed to build (above); make test-node builds it again"
			exit 1
		fi
		log "node guest's image: $(tail -1 "${image_log}")"
	fi
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
	go_install "${TOOLS}/bin" helm "${HELM_VERSION}" "" "helm.sh/helm/v4/cmd/helm@${HELM_VERSION}"

	if [[ "${INPLACED_WITH_GVISOR:-1}" == "1" ]]; then
		install_gvisor
	fi
	if [[ "${INPLACED_WITH_KUBELET:-0}" == "1" ]]; then
		install_kubernetes
	fi
	if [[ "${INPLACED_WITH_H2SPEC:-0}" == "1" ]]; then
		install_h2spec
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
