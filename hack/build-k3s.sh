#!/usr/bin/env bash
# Builds k3s from the Go module proxy, for the e2e harness (test/harness/k3s.go):
#   ${INPLACED_TOOLS:-/var/cache/inplaced/tools}/k3s-${K3S_VERSION}/
#       k3s                  ./cmd/server: server, agent and the other k3s commands
#       kubectl, crictl      links to it (the multicall binary picks by argv[0])
#       .version             the stamp: ${K3S_VERSION}
# and skips the build when it is already there with its stamp (--force rebuilds).
#
# k3s's release tags (v1.35.1+k3s1) are not Go module versions; the proxy serves
# the pseudo-version of its main branch that @latest resolves to. Its go.mod has
# replace directives (Kubernetes, containerd and etcd forks), so it is built
# inside a writable copy of the module (hack/lib/module-src.sh). What is left
# out of scripts/build: the embedded containerd (tag ctrd) and runc's seccomp
# and apparmor (cgo libraries), and the data dir that ./cmd/k3s unpacks
# (containerd, runc, CNI plugins): a node that runs k3s with
# --container-runtime-endpoint and --flannel-backend=none uses none of them.
# CGO stays on for sqlite (kine): gcc and libc6-dev are all it needs.
set -euo pipefail

K3S_VERSION="${K3S_VERSION:-v1.35.1-0.20260211145931-c5b158798933}"
TOOLS="${INPLACED_TOOLS:-/var/cache/inplaced/tools}"
HACK="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
K3S_DIR="${TOOLS}/k3s-${K3S_VERSION}"

log() { printf '[build-k3s] %s\n' "$*" >&2; }
# shellcheck source=lib/k8s-build.sh
source "${HACK}/lib/k8s-build.sh"
# shellcheck source=lib/module-src.sh
source "${HACK}/lib/module-src.sh"
# shellcheck source=lib/timing.sh
source "${HACK}/lib/timing.sh"

force=0
[[ "${1:-}" == "--force" ]] && force=1

build_k3s() {
	local work
	work="$(mktemp -d "${TMPDIR:-/tmp}/inplaced-k3s.XXXXXX")"
	(
		trap 'chmod -R u+w "${work}"; rm -rf "${work}"' EXIT
		module_src github.com/k3s-io/k3s "${K3S_VERSION}" "${work}/src"
		cd "${work}/src"
		export GOFLAGS="${GOFLAGS:-} -mod=mod"
		# The packaged manifests, embedded as scripts/build does: without them
		# the cloud-controller-manager has no RBAC and the node keeps its
		# "uninitialized" taint. Addons among them are turned off by --disable.
		cp -r manifests/. pkg/deploy/embed/
		local commit="${K3S_VERSION##*-}" k8s goversion version
		# The Kubernetes fork it is built on: k8s.io/kubernetes => .../kubernetes v1.35.1-k3s1.
		k8s="$(go list -m -f '{{if .Replace}}{{.Replace.Version}}{{else}}{{.Version}}{{end}}' k8s.io/kubernetes)"
		version="${k8s%-k3s*}+k3s-${commit:0:8}"
		# k3s refuses to run unless UpstreamGolang names the Go it was built
		# with (Kubernetes pins one; we build with the local Go and say so).
		goversion="$(go env GOVERSION)"
		goversion="${goversion%% *}"
		local pkg=github.com/k3s-io/k3s/pkg/version
		local ldflags
		ldflags="$(k8s_ldflags "${version}") -X ${pkg}.Version=${version} -X ${pkg}.GitCommit=${commit:0:8} -X ${pkg}.UpstreamGolang=${goversion}"
		log "k3s ${version} (Kubernetes ${k8s}), built with ${goversion}"
		CGO_ENABLED=1 CGO_CFLAGS="-DSQLITE_ENABLE_DBSTAT_VTAB=1 -DSQLITE_USE_ALLOCA=1" \
			go build -trimpath -tags "netcgo osusergo providerless urfave_cli_no_docs sqlite_omit_load_extension" \
			-ldflags "${ldflags}" -o "${work}/k3s" ./cmd/server
		local out="${K3S_DIR}.tmp"
		rm -rf "${out}"
		mkdir -p "${out}"
		mv "${work}/k3s" "${out}/k3s"
		ln -s k3s "${out}/kubectl"
		ln -s k3s "${out}/crictl"
		echo "${K3S_VERSION}" >"${out}/.version"
	)
	rm -rf "${K3S_DIR}"
	mv "${K3S_DIR}.tmp" "${K3S_DIR}"
}

if [[ ${force} == 0 ]] && stamped "${K3S_DIR}" "${K3S_VERSION}" k3s kubectl crictl; then
	log "k3s ${K3S_VERSION} present in ${K3S_DIR}"
else
	start=$(date +%s)
	log "building k3s ${K3S_VERSION}"
	build_k3s
	log "built k3s ${K3S_VERSION} in $(( $(date +%s) - start ))s"
	timing_record k3s $(( $(date +%s) - start ))
	"${K3S_DIR}/k3s" --version >&2
fi
