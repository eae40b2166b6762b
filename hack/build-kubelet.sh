#!/usr/bin/env bash
# Builds a standalone kubelet from the Go module proxy into
#   ${INPLACED_TOOLS:-/var/cache/inplaced/tools}/kubelet-${KUBELET_VERSION}/kubelet
# and skips the build when that binary is already there.
#
# k8s.io/kubernetes cannot be `go install`ed: its go.mod requires every staging
# module (k8s.io/api, k8s.io/client-go, ...) at v0.0.0 and replaces it with
# ./staging/src/... . A scratch module requires k8s.io/kubernetes and replaces each
# of those v0.0.0 requirements with the published v0.<minor>.<patch> tag.
set -euo pipefail

KUBELET_VERSION="${KUBELET_VERSION:-v1.37.2}"
TOOLS="${INPLACED_TOOLS:-/var/cache/inplaced/tools}"
DEST_DIR="${TOOLS}/kubelet-${KUBELET_VERSION}"
DEST="${DEST_DIR}/kubelet"

log() { printf '[build-kubelet] %s\n' "$*" >&2; }

if [[ -x "${DEST}" && "${1:-}" != "--force" ]]; then
	log "kubelet ${KUBELET_VERSION} present at ${DEST}"
	exit 0
fi

staging_version="v0.${KUBELET_VERSION#v1.}"   # v1.37.2 -> v0.37.2
work="$(mktemp -d /tmp/inplaced-kubelet.XXXXXX)"
trap 'rm -rf "${work}"' EXIT

start=$(date +%s)
log "building kubelet ${KUBELET_VERSION} (staging modules at ${staging_version}) in ${work}"
cd "${work}"
export GOFLAGS="${GOFLAGS:-} -mod=mod"
go mod init inplaced.local/kubelet-build >/dev/null 2>&1

# The upstream go.mod tells which modules are staging ones: required at v0.0.0.
modjson="$(go mod download -json "k8s.io/kubernetes@${KUBELET_VERSION}")"
gomod="$(printf '%s' "${modjson}" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')"
[[ -f "${gomod}" ]] || { log "cannot find go.mod of k8s.io/kubernetes@${KUBELET_VERSION}"; exit 1; }
mapfile -t staging < <(go mod edit -json "${gomod}" | jq -r '.Require[] | select(.Version == "v0.0.0") | .Path')
(( ${#staging[@]} > 0 )) || { log "no staging modules found in ${gomod}"; exit 1; }
log "${#staging[@]} staging modules"

args=(-require="k8s.io/kubernetes@${KUBELET_VERSION}")
for m in "${staging[@]}"; do
	args+=(-replace="${m}=${m}@${staging_version}")
done
go mod edit "${args[@]}"
go get "k8s.io/kubernetes/cmd/kubelet@${KUBELET_VERSION}" >/dev/null

# What k8s' hack/lib/version.sh stamps, so that `kubelet --version` and the
# node's kubeletVersion say v1.x.y instead of v0.0.0-master.
major="${KUBELET_VERSION#v}"; major="${major%%.*}"
minor="${KUBELET_VERSION#v*.}"; minor="${minor%%.*}"
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	ldflags+=" -X ${pkg}.gitVersion=${KUBELET_VERSION} -X ${pkg}.gitMajor=${major} -X ${pkg}.gitMinor=${minor} -X ${pkg}.gitTreeState=clean"
done

mkdir -p "${DEST_DIR}"
CGO_ENABLED=0 go build -trimpath -ldflags "${ldflags}" -o "${DEST}.tmp" k8s.io/kubernetes/cmd/kubelet
mv "${DEST}.tmp" "${DEST}"
log "built ${DEST} in $(( $(date +%s) - start ))s"
"${DEST}" --version >&2
