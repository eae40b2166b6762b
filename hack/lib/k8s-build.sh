# Shared by hack/build-kubelet.sh and hack/build-control-plane.sh (sourced).
#
# k8s.io/kubernetes cannot be `go install`ed: its go.mod requires every staging
# module (k8s.io/api, k8s.io/client-go, ...) at v0.0.0 and replaces it with
# ./staging/src/... . A scratch module requires k8s.io/kubernetes and replaces each
# of those v0.0.0 requirements with the published v0.<minor>.<patch> tag.
# (k8s.io/utils and k8s.io/kube-openapi are not staging modules: they stay.)

# k8s_scratch_module <kubernetes version> <module name>: in the current (empty)
# directory, a go.mod that requires k8s.io/kubernetes at that version with every
# staging module replaced. Logs through the caller's log().
k8s_scratch_module() {
	local version="$1" name="$2"
	local staging_version="v0.${version#v1.}" # v1.37.2 -> v0.37.2
	go mod init "${name}" >/dev/null 2>&1

	# The upstream go.mod tells which modules are staging ones: required at v0.0.0.
	local modjson gomod
	modjson="$(go mod download -json "k8s.io/kubernetes@${version}")"
	gomod="$(printf '%s' "${modjson}" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')"
	[[ -f "${gomod}" ]] || { log "cannot find go.mod of k8s.io/kubernetes@${version}"; return 1; }
	local staging
	mapfile -t staging < <(go mod edit -json "${gomod}" | jq -r '.Require[] | select(.Version == "v0.0.0") | .Path')
	(( ${#staging[@]} > 0 )) || { log "no staging modules found in ${gomod}"; return 1; }
	log "${#staging[@]} staging modules at ${staging_version}"

	local args=(-require="k8s.io/kubernetes@${version}") m
	for m in "${staging[@]}"; do
		args+=(-replace="${m}=${m}@${staging_version}")
	done
	go mod edit "${args[@]}"
}

# k8s_ldflags <kubernetes version>: what k8s' hack/lib/version.sh stamps, so that
# `--version`, /version and a Node's kubeletVersion say v1.x.y instead of
# v0.0.0-master; plus -s -w.
k8s_ldflags() {
	local version="$1" major minor pkg ldflags="-s -w"
	major="${version#v}"; major="${major%%.*}"
	minor="${version#v*.}"; minor="${minor%%.*}"
	for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		ldflags+=" -X ${pkg}.gitVersion=${version} -X ${pkg}.gitMajor=${major} -X ${pkg}.gitMinor=${minor} -X ${pkg}.gitTreeState=clean"
	done
	printf '%s' "${ldflags}"
}

# k8s_build <kubernetes version> <command package> <destination file> [<package> <destination>]...:
# builds Kubernetes commands (k8s.io/kubernetes/cmd/...) statically, each into
# its destination via dest.tmp. Several commands share one scratch module and
# one `go build`: one module resolution, and one build graph that keeps both
# cores busy while the other command's link runs.
k8s_build() {
	local version="$1" work
	shift
	local pkgs=() dests=()
	while (($# >= 2)); do
		pkgs+=("$1")
		dests+=("$2")
		shift 2
	done
	work="$(mktemp -d "${TMPDIR:-/tmp}/inplaced-$(basename "${pkgs[0]}").XXXXXX")"
	(
		trap 'rm -rf "${work}"' EXIT
		cd "${work}"
		export GOFLAGS="${GOFLAGS:-} -mod=mod"
		k8s_scratch_module "${version}" "inplaced.local/$(basename "${pkgs[0]}")-build"
		go get "${pkgs[@]/%/@${version}}" >/dev/null
		mkdir out
		CGO_ENABLED=0 go build -trimpath -ldflags "$(k8s_ldflags "${version}")" -o out/ "${pkgs[@]}"
		local i
		for i in "${!pkgs[@]}"; do
			mkdir -p "$(dirname "${dests[i]}")"
			mv "out/$(basename "${pkgs[i]}")" "${dests[i]}.tmp"
		done
	)
	local dest
	for dest in "${dests[@]}"; do
		mv "${dest}.tmp" "${dest}"
	done
}
