#!/usr/bin/env bash
# fail-excerpt.sh LOG: after a failed `go test -v` run, prints the
# unfiltered output of the failing tests that failed themselves (no failing
# subtest below them): from their "=== RUN" to the next "=== RUN" or
# verdict, its last 80 lines each, without the daemons' log lines the
# harness dumps after a failure (those are in the log and in INPLACED_ARTIFACTS). make's filtered view drops helpers'
# multi-line output; this keeps the cause next to the verdict.
set -uo pipefail
log="$1"
[[ -f "${log}" ]] || exit 0
mapfile -t failed < <(grep -E '^\s*--- FAIL: ' "${log}" | sed -E 's/^\s*--- FAIL: (\S+).*/\1/' | sort -u)
((${#failed[@]})) || exit 0
echo "==== the output of the failing tests (unfiltered, from ${log}) ===="
shown=0
for name in "${failed[@]}"; do
	leaf=1
	for other in "${failed[@]}"; do
		[[ "${other}" == "${name}/"* ]] && leaf=0
	done
	((leaf)) || continue
	((shown++ < 5)) || break
	echo "---- ${name}"
	awk -v want="=== RUN   ${name}" '
		$0 == want { on = 1; n = 0; next }
		on && (/^=== RUN/ || /^[ \t]*--- (PASS|FAIL|SKIP)/) { on = 0 }
		on && !/^[ \t]+time="/ && !/^[ \t]+[IWE][0-9][0-9][0-9][0-9] / && !/^[ \t]+20[0-9][0-9]-[0-9][0-9]-[0-9][0-9]T/ && !/^[ \t]+{"level"/ { buf[n++ % 80] = substr($0, 1, 400) }
		END { for (i = (n > 80 ? n - 80 : 0); i < n; i++) print buf[i % 80] }' "${log}"
done
