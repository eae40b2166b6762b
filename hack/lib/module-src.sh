# Shared by hack/build-openkruise.sh and hack/build-k3s.sh (sourced).
#
# Projects whose go.mod has replace directives cannot be `go install`ed: their
# module is downloaded, copied into a writable directory and built inside it,
# with its own go.mod and go.sum.

# module_src <module> <version> <destination>: the module's source, downloaded
# through the Go module proxy, copied into <destination> (which must not exist)
# and made writable. Logs through the caller's log().
module_src() {
	local module="$1" version="$2" dest="$3" dir
	dir="$(cd / && go mod download -json "${module}@${version}" | jq -r .Dir)"
	[[ -n ${dir} && -d ${dir} ]] || { log "cannot download ${module}@${version}"; return 1; }
	cp -r "${dir}/." "${dest}"
	chmod -R u+w "${dest}"
}

# stamped <directory> <stamp> <file>...: true when the directory's .version
# holds the stamp and every file in it is executable.
stamped() {
	local dir="$1" stamp="$2" f
	shift 2
	[[ "$(cat "${dir}/.version" 2>/dev/null)" == "${stamp}" ]] || return 1
	for f in "$@"; do
		[[ -x "${dir}/${f}" ]] || return 1
	done
}
