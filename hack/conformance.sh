#!/usr/bin/env bash
# Runs critest v1.37 against private containerd instances (1.6 and 2.4), directly
# and through the inplaced proxy (_output/bin/inplaced, when it is built), and
# compares the sets of passed specs. Prints both pass counts and the specs that
# differ, exits non-zero when they differ, and writes docs/conformance-<backend>.md.
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
proxy) export INPLACED_CONFORMANCE_MODES=direct,proxy ;; # the comparison needs both
both) export INPLACED_CONFORMANCE_MODES=direct,proxy ;;
*) echo "usage: $0 [direct|proxy|both]" >&2; exit 2 ;;
esac
if [[ "${INPLACED_CONFORMANCE_MODES:-}" == *proxy* && ! -x "${INPLACED_PROXY_BIN}" ]]; then
	echo "conformance: ${INPLACED_PROXY_BIN} not built (make build)" >&2
	exit 1
fi

"${ROOT}/hack/install-deps.sh"

mkdir -p "${ROOT}/_output"
export INPLACED_CONFORMANCE=1
export INPLACED_ARTIFACTS="${INPLACED_ARTIFACTS:-${ROOT}/_output/conformance}"
log="${ROOT}/_output/conformance.log"
set +e
go test -count=1 -timeout 90m -v -run 'TestConformance' ./test/conformance 2>&1 | tee "${log}"
rc=${PIPESTATUS[0]}
set -e
echo
echo "== summary (full log: ${log}, critest logs: ${INPLACED_ARTIFACTS})"
grep -E 'critest .*(passed|differ)|passes only|wrote ' "${log}" | sed 's/^ *conformance_test.go:[0-9]*: /  /' || true
exit "${rc}"
