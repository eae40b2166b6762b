#!/usr/bin/env bash
# make bench: runs the benchmarks in test/bench (each against private
# containerd instances of every backend in $INPLACED_BACKENDS, default both)
# and writes docs/benchmarks.md from what they measured.
#
#   BENCH=regexp       which benchmarks (go test -bench), default "."; with
#                      any other value docs/benchmarks.md is left as it is
#                      (a partial run would wipe its other sections) and the
#                      markdown goes to $BENCH_OUT/benchmarks.md. Benchmarks
#                      with a document of their own write it in any case:
#                      BenchmarkKubePatch $INPLACED_BENCH_KUBE_DOC
#                      (docs/benchmarks-kubernetes.md), BenchmarkKubeletLoad
#                      $INPLACED_BENCH_LOAD_DOC (docs/benchmarks-kubelet-load.md;
#                      its window: INPLACED_BENCH_LOAD_MINUTES, default 10;
#                      then the Go byte relay's in inplaced's place:
#                      INPLACED_BENCH_LOAD_FLOOR_MINUTES, default 5, 0: none).
#                      Both start a kubelet: on a shared machine run them
#                      under flock /run/inplaced-kubelet-e2e.lock
#   BENCH_SKIP=regexp go test -skip: benchmarks left out of a run that is
#                      otherwise full (docs/benchmarks.md is written; its
#                      Command row shows the -skip), e.g. BENCH_SKIP=KubeletLoad
#                      when that one ran on its own (its document is its own)
#   BENCH_TIMEOUT=120m go test -timeout (BenchmarkKubeletLoad alone takes
#                      ~21 min per backend: ~15 for inplaced's window, ~6 for
#                      the floor's)
#   BENCHTIME=1s       go test -benchtime; the benchmarks also have minimums
#                      of their own (2000 calls per path and cell, 5
#                      repetitions per replacement method: INPLACED_BENCH_REPS)
#   BENCH_OUT=dir      where the log, results and load samples go
#                      (default _output/bench)
#   BENCH_DOC_ONLY=1   write the markdown again from the last run's files in
#                      BENCH_OUT (after a change to benchdoc's wording), no
#                      benchmark run: docs/benchmarks.md (only from a full
#                      run) and $INPLACED_BENCH_LOAD_DOC (from
#                      BenchmarkKubeletLoad's records, with this script's
#                      load samples)
#   BENCH_QUIET_LOAD=1.0  wait before starting until the 1-minute load average
#                      is at most this (the machine is shared: figures taken
#                      under other work's load say little) ...
#   BENCH_QUIET_WAIT=600  ... for at most this many seconds, then run anyway;
#                      the document says whether the machine got quiet, and
#                      each verdict drawn from a cell measured under load is
#                      marked unreliable (test/bench/report/hygiene.go)
#   BASELINE=commit    BenchmarkCRI also runs inplaced built from that commit
#                      (in a temporary git worktree), in the same rounds as
#                      the build under test: the targets then compare p50 and
#                      CPU per call with it (at most 1.10×)
#   INPLACED_BENCH_LOG_LEVEL=debug  the log level of the inplaced daemons
#                      (default info); with INPLACED_ARTIFACTS=dir their logs
#                      are kept there when a benchmark fails
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
# go test runs in the package directory: a relative BENCH_OUT is made absolute
# here, from the repository's root (the script runs there).
mkdir -p "${OUT}"
OUT="$(cd "${OUT}" && pwd)"
export INPLACED_BIN="${INPLACED_BIN:-${ROOT}/_output/bin}"
export INPLACED_BENCH_RESULTS="${OUT}/results.jsonl"
export INPLACED_BENCH_KUBE_DOC="${INPLACED_BENCH_KUBE_DOC:-${ROOT}/docs/benchmarks-kubernetes.md}" # BenchmarkKubePatch writes it
export INPLACED_BENCH_LOAD_DOC="${INPLACED_BENCH_LOAD_DOC:-${ROOT}/docs/benchmarks-kubelet-load.md}" # BenchmarkKubeletLoad writes it

log() { printf '[bench] %s\n' "$*" >&2; }

# write_doc renders the markdown from the run's files in ${OUT}.
write_doc() {
	local doc="$1"
	# shellcheck disable=SC1091
	source "${OUT}/run.env"
	mkdir -p "$(dirname "${doc}")"
	go run ./test/bench/benchdoc \
		-results "${INPLACED_BENCH_RESULTS}" -bench-output "${OUT}/bench.log" -load "${OUT}/load.txt" \
		-started "${started}" -finished "${finished}" -commit "${commit}" -command "${command}" -quiet "${quietnote:-}" -out "${doc}" "${@:2}"
	log "wrote ${doc}"
}

if [[ -n "${BENCH_DOC_ONLY:-}" ]]; then
	# shellcheck disable=SC1091
	source "${OUT}/run.env"
	doc="${ROOT}/docs/benchmarks.md"
	if [[ "${command}" != *"-bench . "* ]]; then
		doc="${OUT}/benchmarks.md" # a partial run: docs/benchmarks.md stays
	fi
	# BenchmarkKubeletLoad's document too, if the run has its records.
	write_doc "${doc}" -kubelet-load-out "${INPLACED_BENCH_LOAD_DOC}"
	log "${INPLACED_BENCH_LOAD_DOC} rendered again if the run measured BenchmarkKubeletLoad"
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

# The baseline build, before the quiet wait: building is no measurement.
if [[ -n "${BASELINE:-}" ]]; then
	base="$(git rev-parse --short "${BASELINE}")"
	basedir="$(mktemp -d)"
	trap 'git worktree remove --force "${basedir}" 2>/dev/null || rm -rf "${basedir}"' EXIT
	git worktree add --detach "${basedir}" "${base}" >/dev/null
	log "building inplaced at ${base} (the baseline)"
	(cd "${basedir}" && CGO_ENABLED=0 go build -o "${OUT}/inplaced-${base}" ./cmd/inplaced)
	git worktree remove --force "${basedir}"
	trap - EXIT
	export INPLACED_BENCH_BASELINE="${base}=${OUT}/inplaced-${base}"
fi

# Wait (bounded) for a quiet machine: the 1-minute load average at most
# BENCH_QUIET_LOAD.
quiet_load="${BENCH_QUIET_LOAD:-1.0}"
quiet_wait="${BENCH_QUIET_WAIT:-600}"
wait_start=$(date +%s)
load_before="$(cut -d' ' -f1 /proc/loadavg)"
quiet=0
while :; do
	load_now="$(cut -d' ' -f1 /proc/loadavg)"
	if awk -v l="${load_now}" -v q="${quiet_load}" 'BEGIN { exit !(l <= q) }'; then
		quiet=1
		break
	fi
	if (($(date +%s) - wait_start >= quiet_wait)); then
		break
	fi
	log "waiting for a quiet machine: 1-min load ${load_now} > ${quiet_load} ($(($(date +%s) - wait_start)) s of at most ${quiet_wait} s)"
	sleep 10
done
waited=$(($(date +%s) - wait_start))
if ((quiet)); then
	log "machine quiet (1-min load ${load_now}) after ${waited} s"
else
	log "machine still busy after ${waited} s (1-min load ${load_now}): running anyway; verdicts taken under load are marked unreliable"
fi
started="$(date -u +%Y-%m-%dT%H:%M:%SZ)"

# The machine's load and run queue, every 5 s, so the document can say how
# quiet it was (each cell also records its own: report.Conditions).
(while :; do printf '%s %s\n' "$(cat /proc/loadavg)" "$(grep procs_running /proc/stat)"; sleep 5; done) >"${OUT}/load.txt" 2>/dev/null &
load_pid=$!
trap 'kill "${load_pid}" 2>/dev/null || true' EXIT

cmd=(go test -run '^$' -bench "${BENCH}" -benchtime "${BENCHTIME}" -timeout "${BENCH_TIMEOUT:-120m}")
if [[ -n "${BENCH_SKIP:-}" ]]; then
	cmd+=(-skip "${BENCH_SKIP}")
fi
cmd+=(./test/bench/)
log "${cmd[*]} (log: ${OUT}/bench.log)"
set +e
"${cmd[@]}" 2>&1 | tee "${OUT}/bench.log" |
	grep --line-buffered -E '^(Benchmark|--- |PASS|FAIL|ok|panic)|^\s+(cri|replace|resize|relay|env|kube|kubeletload)_(bench_)?test\.go:'
rc=${PIPESTATUS[0]}
set -e
if ((rc == 0)) && [[ -n "${RELAY_AB:-}" ]]; then
	relay_ab || rc=$?
fi
kill "${load_pid}" 2>/dev/null || true
finished="$(date -u +%Y-%m-%dT%H:%M:%SZ)"

commit="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD -- pkg cmd 2>/dev/null || echo '+changes')"
printf 'started=%q\nfinished=%q\ncommit=%q\ncommand=%q\nquietnote=%q\n' "${started}" "${finished}" "${commit}" "${cmd[*]}" \
	"waited ${waited} s of at most ${quiet_wait} s for a 1-min load ≤ ${quiet_load}: $( ((quiet)) && echo "reached (${load_now})" || echo "not reached (${load_now}; ${load_before} when make bench began)")" >"${OUT}/run.env"

doc="${ROOT}/docs/benchmarks.md"
if ((rc != 0)); then
	doc="${OUT}/benchmarks.md"
	log "go test failed (exit ${rc}): writing ${doc}, docs/benchmarks.md left as it was"
elif [[ "${BENCH}" != "." ]]; then
	doc="${OUT}/benchmarks.md"
	log "BENCH=${BENCH} is a partial run: writing ${doc}, docs/benchmarks.md left as it was"
fi
write_doc "${doc}"
exit "${rc}"
