#!/usr/bin/env bash
# Runs critest v1.37 and h2spec (HTTP/2 conformance, `-o 3`, over a TCP-to-unix
# relay in front of each socket) against private containerd instances (1.6 and
# 2.4), directly and through the inplaced proxy (_output/bin/inplaced, when it is
# built) with each --relay setting (router, grpc), and compares the sets of
# passed specs and cases: everything that passes directly must pass through
# inplaced. Prints the pass counts and the specs that differ, exits non-zero
# when some pass only directly, and writes docs/conformance-<backend>.md.
#
# Usage: hack/conformance.sh [direct|proxy|both]
#   default: both when _output/bin/inplaced exists, else direct.
# Environment: INPLACED_BACKENDS (e.g. containerd-2.4), INPLACED_PROXY_BIN,
#   INPLACED_CONFORMANCE_FOCUS / INPLACED_CONFORMANCE_SKIP (ginkgo regexps),
#   INPLACED_ARTIFACTS (keep critest logs and reports), INPLACED_TOOLS.
# Needs root and the tools of hack/install-deps.sh (installed if missing).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${ROOT}"

export INPLACED_PROXY_BIN="${INPLACED_PROXY_BIN:-${ROOT}/_output/bin/inplaced}"
case "${1:-}" in
"") ;;
direct) export INPLACED_CONFORMANCE_MODES=direct ;;
proxy) export INPLACED_CONFORMANCE_MODES=direct,proxy,proxy-grpc ;; # the comparison needs direct
both) export INPLACED_CONFORMANCE_MODES=direct,proxy,proxy-grpc ;;
*) echo "usage: $0 [direct|proxy|both]" >&2; exit 2 ;;
esac
if [[ "${INPLACED_CONFORMANCE_MODES:-}" == *proxy* && ! -x "${INPLACED_PROXY_BIN}" ]]; then
	echo "conformance: ${INPLACED_PROXY_BIN} not built (make build)" >&2
	exit 1
fi

INPLACED_WITH_H2SPEC=1 "${ROOT}/hack/install-deps.sh"

mkdir -p "${ROOT}/_output"
export INPLACED_CONFORMANCE=1
export INPLACED_ARTIFACTS="${INPLACED_ARTIFACTS:-${ROOT}/_output/conformance}"
log="${ROOT}/_output/conformance.log"
set +e
go test -count=1 -timeout 90m -v -run 'TestConformance|TestH2spec' ./test/conformance 2>&1 | tee "${log}"
rc=${PIPESTATUS[0]}
set -e
echo
echo "== summary (full log: ${log}, critest logs: ${INPLACED_ARTIFACTS})"
grep -E '(critest|h2spec) .*(passed|differ)|passes only|wrote ' "${log}" | sed 's/^ *conformance_test.go:[0-9]*: /  /' || true
exit "${rc}"
