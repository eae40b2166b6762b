# Sourced by hack/install-deps.sh and the build scripts it runs.
#
# timing_record <name> <seconds>: notes how long a fresh build of <name> took,
# for install-deps.sh's summary line. A no-op when the script runs on its own
# (INPLACED_DEPS_TIMES unset).
timing_record() {
	if [[ -n "${INPLACED_DEPS_TIMES:-}" ]]; then
		printf '%s %s\n' "$1" "$2" >>"${INPLACED_DEPS_TIMES}"
	fi
	return 0
}

# timing_summary <file>: "kubelet 404s, crictl 35s, total 439s", or empty.
timing_summary() {
	[[ -s "$1" ]] || return 0
	awk '{ s = s (NR > 1 ? ", " : "") $1 " " $2 "s"; t += $2 } END { printf "%s, total %ds (%dm%02ds)", s, t, t / 60, t % 60 }' "$1"
}
