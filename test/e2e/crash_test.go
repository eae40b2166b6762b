package e2e

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/inplaced/inplaced/pkg/swap"
	"github.com/inplaced/inplaced/test/harness"
)

// TestSwapCrashRecovery kills inplaced with SIGKILL right after each swap
// step in turn (the test-only switch INPLACED_TEST_CRASH_AFTER) and proves
// that after a restart the container name has exactly one running
// container, v1 or v2, and that `inplacectl swaps` says which.
func TestSwapCrashRecovery(t *testing.T) {
	steps := []string{swap.StepPull, swap.StepPreStop, swap.StepStopOld, swap.StepCreateNew,
		swap.StepStartNew, swap.StepPostStart, swap.StepHealthGate, swap.StepCommit}
	forEachBackend(t, func(t *testing.T, c *harness.Containerd) {
		for _, step := range steps {
			t.Run(step, func(t *testing.T) {
				px := harness.StartInplaced(t, c.Endpoint, swap.CrashAfterEnv+"="+step)
				cri := harness.DialCRI(t, px.Endpoint)
				p := runPod(t, cri, "crash-"+step, c.Images.App1, podOpts{})
				out, err := px.Ctl("swap", p.name, "-c", "app", "--image", c.Images.App2, "--env", "CRASHED_AT="+step,
					"--post-start-exec", "true", "--min-runtime", "500ms")
				if err == nil {
					t.Fatalf("swap returned success although inplaced was to crash after %s:\n%s", step, out)
				}
				select {
				case <-px.Exited():
				case <-time.After(30 * time.Second):
					t.Fatalf("inplaced did not crash after %s", step)
				}
				if err := px.Start(); err != nil {
					t.Fatalf("restart inplaced: %v\n%s", err, px.LogTail(30))
				}
				// Recovery runs before the sockets are served, so it is done.
				running := p.running(t, cri)
				if len(running) != 1 {
					t.Fatalf("after crash at %s and restart: %d running app containers, want exactly 1\n%s", step, len(running), px.LogTail(30))
				}
				_, in := containerInfo(t, cri, running[0].Id)
				v, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(in.Pid), "root", "VERSION"))
				if err != nil {
					t.Fatal(err)
				}
				version := strings.TrimSpace(string(v))
				hist := swaps(t, &env{px: px})
				if len(hist) != 1 {
					t.Fatalf("swap history has %d records, want 1: %+v", len(hist), hist)
				}
				r := hist[0]
				want := map[string]string{"SWAP_STATE_COMMITTED": "v2", "SWAP_STATE_FAILED": "v1"}[r.State]
				if want == "" || want != version || r.RunningContainerID != running[0].Id {
					t.Fatalf("crash after %s: record %s says running %s; node runs %s (%s)", step, r.State, r.RunningContainerID, running[0].Id, version)
				}
				t.Logf("crash after %-11s → %s, running %s (%s)", step, r.State, version, running[0].Id[:13])
			})
		}
	})
}

// TestSwapAdopted swaps a container created directly at containerd, before
// inplaced saw it: its config comes from containerd's verbose status.
func TestSwapAdopted(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c *harness.Containerd) {
		direct := c.CRI(t)
		p := runPod(t, direct, "adopted", c.Images.App1, podOpts{env: map[string]string{"ORIGINAL": "yes"}})
		px := harness.StartInplaced(t, c.Endpoint)
		out, err := px.Ctl("swap", "--id", p.containerID[:12], "--image", c.Images.App2, "--env", "ADDED=1", "--min-runtime", "500ms")
		if err != nil {
			t.Fatalf("swap of an adopted container: %v\n%s", err, out)
		}
		running := p.running(t, direct)
		if len(running) != 1 || running[0].Id == p.containerID {
			t.Fatalf("running after swap: %+v", running)
		}
		_, in := containerInfo(t, direct, running[0].Id)
		environ, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(in.Pid), "environ"))
		if err != nil {
			t.Fatal(err)
		}
		vars := strings.Split(string(environ), "\x00")
		if !contains(vars, "ORIGINAL=yes") || !contains(vars, "ADDED=1") {
			t.Fatalf("adopted env not carried over: %q", vars)
		}
	})
}
