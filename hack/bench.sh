#!/usr/bin/env bash
# make bench: runs the benchmarks in test/bench (each against private
# containerd instances of every backend in $INPLACED_BACKENDS, default both)
# and writes docs/benchmarks.md from what they measured.
#
#   BENCH=regexp       which benchmarks (go test -bench), default "."
#   BENCHTIME=1s       go test -benchtime; the benchmarks also have minimums
#                      of their own (2000 calls per path and cell, 5
#                      repetitions per replacement method: INPLACED_BENCH_REPS)
#   BENCH_OUT=dir      where the log, results and load samples go
#                      (default _output/bench)
#   BENCH_DOC_ONLY=1   write the markdown again from the last run's files in
#                      BENCH_OUT (after a change to benchdoc's wording), no
#                      benchmark run
#   RELAY_AB=commit    also run BenchmarkRelay (in process, no containerd)
#                      built with pkg/relay of that commit and of this tree
#                      (the same benchmark code), alternately RELAY_AB_RUNS
#                      times (default 5): a before/after of a relay change,
#                      in the same document
#
# Expects the binaries in $INPLACED_BIN (make bench builds them first).
# On failure the markdown is written to $BENCH_OUT/benchmarks.md instead of
# docs/, so that a broken run never replaces the measured document.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${ROOT}"
BENCH="${BENCH:-.}"
BENCHTIME="${BENCHTIME:-1s}"
OUT="${BENCH_OUT:-${ROOT}/_output/bench}"
export INPLACED_BIN="${INPLACED_BIN:-${ROOT}/_output/bin}"
export INPLACED_BENCH_RESULTS="${OUT}/results.jsonl"

log() { printf '[bench] %s\n' "$*" >&2; }

# write_doc renders the markdown from the run's files in ${OUT}.
write_doc() {
	local doc="$1"
	# shellcheck disable=SC1091
	source "${OUT}/run.env"
	mkdir -p "$(dirname "${doc}")"
	go run ./test/bench/benchdoc \
		-results "${INPLACED_BENCH_RESULTS}" -bench-output "${OUT}/bench.log" -load "${OUT}/load.txt" \
		-started "${started}" -finished "${finished}" -commit "${commit}" -command "${command}" -out "${doc}"
	log "wrote ${doc}"
}

if [[ -n "${BENCH_DOC_ONLY:-}" ]]; then
	write_doc "${ROOT}/docs/benchmarks.md"
	exit 0
fi

if [[ $(id -u) -ne 0 ]]; then
	log "needs root (containerd, runc, CNI)"
	exit 1
fi
for b in inplaced inplacectl; do
	if [[ ! -x "${INPLACED_BIN}/${b}" ]]; then
		log "${INPLACED_BIN}/${b} missing: run make build (make bench does)"
		exit 1
	fi
done

# relay_ab builds the bench test binary twice — from HEAD with pkg/relay of
# ${RELAY_AB}, and from this tree — and runs their BenchmarkRelay
# alternately, phases "before"/"after" in the results.
relay_ab() {
	local old new dir i
	old="$(git rev-parse --short "${RELAY_AB}")"
	new="$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- pkg 2>/dev/null || echo '+changes')"
	dir="$(mktemp -d)"
	log "relay before/after: ${old} vs ${new}, ${RELAY_AB_RUNS:-5} runs each"
	git archive HEAD | tar -x -C "${dir}"
	rm -rf "${dir}/pkg/relay"
	git archive "${old}" pkg/relay | tar -x -C "${dir}"
	(cd "${dir}" && go test -c -o "${OUT}/relay-before.test" ./test/bench/)
	go test -c -o "${OUT}/relay-after.test" ./test/bench/
	rm -rf "${dir}"
	for ((i = 0; i < ${RELAY_AB_RUNS:-5}; i++)); do
		INPLACED_BENCH_PHASE="before (pkg/relay of ${old})" "${OUT}/relay-before.test" -test.run '^$' -test.bench '^BenchmarkRelay$' -test.benchtime 1s >>"${OUT}/relay-ab.log" 2>&1 || return 1
		INPLACED_BENCH_PHASE="after (${new})" "${OUT}/relay-after.test" -test.run '^$' -test.bench '^BenchmarkRelay$' -test.benchtime 1s >>"${OUT}/relay-ab.log" 2>&1 || return 1
	done
}

mkdir -p "${OUT}"
rm -f "${INPLACED_BENCH_RESULTS}" "${OUT}/load.txt" "${OUT}/relay-ab.log"
started="$(date -u +%Y-%m-%dT%H:%M:%SZ)"

# The machine's load, every 5 s, so the document can say how quiet it was.
(while :; do cat /proc/loadavg; sleep 5; done) >"${OUT}/load.txt" 2>/dev/null &
load_pid=$!
trap 'kill "${load_pid}" 2>/dev/null || true' EXIT

cmd=(go test -run '^$' -bench "${BENCH}" -benchtime "${BENCHTIME}" -timeout 45m ./test/bench/)
log "${cmd[*]} (log: ${OUT}/bench.log)"
set +e
"${cmd[@]}" 2>&1 | tee "${OUT}/bench.log" |
	grep --line-buffered -E '^(Benchmark|--- |PASS|FAIL|ok|panic)|^\s+(cri|replace|resize|relay|env)_(bench_)?test\.go:'
rc=${PIPESTATUS[0]}
set -e
if ((rc == 0)) && [[ -n "${RELAY_AB:-}" ]]; then
	relay_ab || rc=$?
fi
kill "${load_pid}" 2>/dev/null || true
finished="$(date -u +%Y-%m-%dT%H:%M:%SZ)"

commit="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD -- pkg cmd 2>/dev/null || echo '+changes')"
printf 'started=%q\nfinished=%q\ncommit=%q\ncommand=%q\n' "${started}" "${finished}" "${commit}" "${cmd[*]}" >"${OUT}/run.env"

doc="${ROOT}/docs/benchmarks.md"
if ((rc != 0)); then
	doc="${OUT}/benchmarks.md"
	log "go test failed (exit ${rc}): writing ${doc}, docs/benchmarks.md left as it was"
fi
write_doc "${doc}"
exit "${rc}"
