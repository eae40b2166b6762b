package node

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestJudgeSuites checks how the host judges the guest's output, without a
// guest: an exit code of 0 is not enough, every expected top-level test must
// report PASS, and under CI=true a skip anywhere is a failure.
func TestJudgeSuites(t *testing.T) {
	expect := []expectedSuite{
		{name: "resources-v2", tests: []string{"TestRealCgroupV2", "TestRealSystemdDriver"}},
		{name: "guest-containerd-2.4", tests: []string{"TestBackend", "TestResize"}},
	}
	resources := []string{
		"[node] suite resources-v2 start (guest uptime 64.49s)",
		"=== RUN   TestRealCgroupV2",
		"--- PASS: TestRealCgroupV2 (8.67s)",
		"    --- PASS: TestRealCgroupV2/lower (0.03s)",
		"=== RUN   TestRealSystemdDriver",
		"--- PASS: TestRealSystemdDriver (4.90s)",
		"PASS",
		"[node] suite resources-v2 exit 0 in 15s (guest uptime 79.94s)",
	}
	guest := func(resize ...string) []string {
		l := []string{"[node] suite guest-containerd-2.4 start (guest uptime 80.07s)", "--- PASS: TestBackend (1.55s)"}
		l = append(l, resize...)
		return append(l, "PASS", "[node] suite guest-containerd-2.4 exit 0 in 178s (guest uptime 258.25s)")
	}
	for _, tc := range []struct {
		name  string
		lines []string
		ci    bool
		errs  []string // substrings, one per error
	}{
		{name: "all pass", ci: true, lines: append(resources, guest("    --- PASS: TestResize/cpu (23.84s)", "--- PASS: TestResize (102.18s)")...)},
		{name: "a subtest skipped, CI", ci: true,
			lines: append(resources, guest("    --- SKIP: TestResize/kubelet-resize (0.00s)", "--- PASS: TestResize (102.18s)")...),
			errs:  []string{"TestResize/kubelet-resize skipped (CI=true"}},
		{name: "a subtest skipped, not CI",
			lines: append(resources, guest("    --- SKIP: TestResize/kubelet-resize (0.00s)", "--- PASS: TestResize (102.18s)")...)},
		{name: "a test skipped, CI", ci: true,
			lines: append(resources, guest("--- SKIP: TestResize (0.00s)")...),
			errs:  []string{"TestResize skipped (CI=true"}},
		{name: "a test skipped, not CI", lines: append(resources, guest("--- SKIP: TestResize (0.00s)")...)},
		{name: "exit 0 but a test missing", ci: true, lines: append(resources, guest()...),
			errs: []string{"TestResize did not report PASS"}},
		{name: "a PASS outside its suite does not count", ci: true,
			lines: append(append(resources, "--- PASS: TestResize (1s)"), guest()...),
			errs:  []string{"TestResize did not report PASS"}},
		{name: "suite failed", ci: true,
			lines: append(resources, "[node] suite guest-containerd-2.4 start", "--- PASS: TestBackend (1s)", "--- FAIL: TestResize (2s)",
				"[node] suite guest-containerd-2.4 exit 1 in 3s"),
			errs: []string{`exited "1" (failed: TestResize)`, "TestResize did not report PASS"}},
		{name: "setup failed", ci: true, lines: []string{"[node] setup failed: no network interface", "[node] suite setup exit 1"},
			errs: []string{`guest step setup exited "1"`, "resources-v2 did not report", "guest-containerd-2.4 did not report"}},
		{name: "suite never ended", ci: true, lines: append(resources, "[node] suite guest-containerd-2.4 start", "--- PASS: TestBackend (1s)", "--- PASS: TestResize (1s)"),
			errs: []string{`guest-containerd-2.4 exited ""`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var p suiteParser
			for _, l := range tc.lines {
				p.line(l)
			}
			errs, logs := judgeSuites(p.suites, expect, tc.ci)
			if len(errs) != len(tc.errs) {
				t.Fatalf("errors %q, want %d matching %q (logs %q)", errs, len(tc.errs), tc.errs, logs)
			}
			for i, want := range tc.errs {
				if !strings.Contains(errs[i], want) {
					t.Errorf("error %d %q, want it to contain %q", i, errs[i], want)
				}
			}
		})
	}
}

// TestHeartbeatWatch checks the stall detector on a real file: the boot's
// grace, a growing file, and a file that stopped growing.
func TestHeartbeatWatch(t *testing.T) {
	path := filepath.Join(t.TempDir(), "heartbeat")
	start := time.Now()
	w := newHeartbeatWatch(path, start)
	if w.stalled(start.Add(2*stallAfter - time.Second)) {
		t.Fatal("stalled during the boot's grace with no file yet")
	}
	if !w.stalled(start.Add(2*stallAfter + time.Second)) {
		t.Fatal("no heartbeat within the boot's grace: not called stalled")
	}
	w = newHeartbeatWatch(path, start)
	now := start
	for i := range 30 {
		now = now.Add(heartbeatEvery)
		f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(f, "alive %d\n", i)
		f.Close()
		if w.stalled(now) {
			t.Fatalf("stalled at beat %d while the file grows", i)
		}
	}
	if w.stalled(now.Add(stallAfter)) {
		t.Fatal("stalled exactly stallAfter after the last beat")
	}
	if !w.stalled(now.Add(stallAfter + time.Second)) {
		t.Fatal("not stalled after the file stopped growing for longer than stallAfter")
	}
}

// TestSplitFleet: the fleet suites come out of the listed guest tests, each
// reported apart; the others stay in their order.
func TestSplitFleet(t *testing.T) {
	for _, c := range []struct {
		in         []string
		rest       []string
		fleet, k3s bool
	}{
		{[]string{"TestBackend", "TestFleet", "TestFleetK3s", "TestSwap"}, []string{"TestBackend", "TestSwap"}, true, true},
		{[]string{"TestFleetK3s"}, []string{}, false, true},
		{[]string{"TestFleet", "TestUnit"}, []string{"TestUnit"}, true, false},
		{[]string{"TestUnit"}, []string{"TestUnit"}, false, false},
	} {
		rest, fleet, k3s := splitFleet(c.in)
		if fmt.Sprint(rest) != fmt.Sprint(c.rest) || fleet != c.fleet || k3s != c.k3s {
			t.Errorf("splitFleet(%v) = %v %v %v, want %v %v %v", c.in, rest, fleet, k3s, c.rest, c.fleet, c.k3s)
		}
	}
}
