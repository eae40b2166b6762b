package e2e

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/test/harness"
)

// Restarts of inplaced behind a socket that systemd holds (emulated: the
// test binds the CRI socket and passes it to each inplaced as systemd's
// socket activation does, harness.StartInplacedActivated), under a
// kubelet-like client calling Version and ListContainers 50 times a second
// each (harness.StartCRILoad: kubelet's dial settings and call timeout).

// loadRate is the calls per second of each method.
const loadRate = 50

// TestRestartUnnoticed: SIGTERM, then a new inplaced — another copy of
// the binary, as an upgrade — on the same socket: no CRI call fails, with
// either relay. Then kill -9 and a start after systemd's RestartSec (2 s):
// the calls made meanwhile wait, none fails; only a call in flight at the
// instant of the kill can fail. The socket and the relay are inplaced's
// own: the first backend only.
func TestRestartUnnoticed(t *testing.T) {
	forFirstBackend(t, func(t *testing.T, c *harness.Containerd) {
		for _, relay := range []string{"router", "grpc"} {
			t.Run("sigterm/"+relay, func(t *testing.T) { testSigterm(t, c, relay, false) })
			t.Run("sigterm-long-call/"+relay, func(t *testing.T) { testSigterm(t, c, relay, true) })
		}
		t.Run("kill-9", func(t *testing.T) {
			px := harness.StartInplacedActivated(t, c.Endpoint, nil)
			runPod(t, c.CRI(t), "restart-kill", c.Images.App1, podOpts{})
			load := harness.StartCRILoad(t, px.Endpoint, loadRate)
			time.Sleep(2 * time.Second)
			r := restart(t, px, syscall.SIGKILL, 2*time.Second, "")
			time.Sleep(2 * time.Second)
			calls := load.Stop()
			r.report(t, calls)
			// A call the client had put on the connection before the kill
			// broke it fails, as any call in flight at a crash does: made
			// before the process was seen gone, on the old connection
			// (grpc-go's "error reading from server"). Every call made
			// after waits for the next process.
			var onKilled []string
			for _, c := range calls {
				if c.Err == nil {
					continue
				}
				line := fmt.Sprintf("%s made %s after the signal, took %s: %v", c.Method, c.At.Sub(r.signalled).Round(100*time.Microsecond),
					c.Took.Round(100*time.Microsecond), c.Err)
				if c.At.Before(r.exited) && strings.Contains(c.Err.Error(), "error reading from server") {
					onKilled = append(onKilled, line)
					continue
				}
				t.Errorf("failed: %s", line)
			}
			t.Logf("calls on the killed connection that failed: %d %v", len(onKilled), onKilled)
			checkActivatedStarts(t, px, 2)
		})
	})
}

// testSigterm restarts inplaced with SIGTERM under the load, into another
// copy of the binary. With long, an ExecSync that runs longer than the
// grace (longGrace) is in flight: it is cut at the grace (Unavailable), and
// the load's calls meanwhile wait — held by the draining process, then in
// the socket's backlog — instead of failing.
func testSigterm(t *testing.T, c *harness.Containerd, relay string, long bool) {
	args := []string{"--relay", relay}
	if long {
		args = append(args, "--shutdown-grace", longGrace)
	}
	px := harness.StartInplacedActivated(t, c.Endpoint, args)
	name := "restart-" + relay
	if long {
		name += "-long"
	}
	p := runPod(t, c.CRI(t), name, c.Images.App1, podOpts{})
	load := harness.StartCRILoad(t, px.Endpoint, loadRate)
	cut := make(chan error, 1)
	if long {
		cri := harness.DialCRI(t, px.Endpoint)
		go func() {
			_, err := cri.Runtime.ExecSync(ctx(t), &runtimeapi.ExecSyncRequest{ContainerId: p.containerID, Cmd: []string{"sleep", "30"}, Timeout: 60})
			cut <- err
		}()
	}
	time.Sleep(2 * time.Second)
	r := restart(t, px, syscall.SIGTERM, 0, nextBinary(t, px))
	if long {
		err := <-cut
		t.Logf("the ExecSync in flight at SIGTERM: %v", err)
		if status.Code(err) != codes.Unavailable {
			t.Errorf("the ExecSync longer than the grace ended with %v, want Unavailable (cut at the grace)", err)
		}
	}
	time.Sleep(2 * time.Second)
	calls := load.Stop()
	r.report(t, calls)
	if s := harness.Stats(calls, time.Time{}, time.Time{}); s.Failed > 0 {
		t.Errorf("%d of %d CRI calls failed across the restart:\n%s", s.Failed, s.Calls, strings.Join(s.Errors, "\n"))
	}
	checkActivatedStarts(t, px, 2)
}

// longGrace is longer than kubelet's connection attempt (5 s): a call
// waiting out the grace must not be waiting as a connection attempt.
const longGrace = "7s"

// restarted is when a restart's steps happened.
type restarted struct {
	signalled, exited, started, served time.Time
	oldPID, newPID                     int
}

// restart signals inplaced, waits for it to exit, waits delay (systemd's
// RestartSec after a crash), and starts bin ("" for the same binary) on
// the same socket.
func restart(t *testing.T, px *harness.Inplaced, sig syscall.Signal, delay time.Duration, bin string) restarted {
	t.Helper()
	r := restarted{oldPID: px.PID()}
	exited := px.Exited()
	r.signalled = time.Now()
	px.Signal(sig)
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		t.Fatalf("inplaced did not exit within 30 s of %v", sig)
	}
	r.exited = time.Now()
	if sig == syscall.SIGTERM {
		if err := px.ExitError(); err != nil {
			t.Fatalf("inplaced after SIGTERM: %v\n%s", err, px.LogTail(30))
		}
	}
	time.Sleep(delay)
	if bin != "" {
		px.Bin = bin
	}
	r.started = time.Now()
	if err := px.Start(); err != nil {
		t.Fatalf("start the next inplaced: %v\n%s", err, px.LogTail(30))
	}
	r.served = time.Now()
	r.newPID = px.PID()
	return r
}

// report logs the figures of a restart under load.
func (r restarted) report(t *testing.T, calls []harness.CRICall) {
	t.Helper()
	before := harness.Stats(calls, time.Time{}, r.signalled)
	during := harness.Stats(calls, r.signalled, r.served)
	after := harness.Stats(calls, r.served, time.Time{})
	t.Logf("pid %d → %d: exited %s after the signal; next started %s later, serving (control socket up) %s after its exec",
		r.oldPID, r.newPID, r.exited.Sub(r.signalled).Round(time.Millisecond), r.started.Sub(r.exited).Round(time.Millisecond),
		r.served.Sub(r.started).Round(time.Millisecond))
	for _, s := range []struct {
		when string
		st   harness.CallStats
	}{{"before the signal", before}, {"signal → next serving", during}, {"after", after}} {
		t.Logf("calls %-22s %5d, failed %d, slowest %s (made %s after the signal)", s.when, s.st.Calls, s.st.Failed,
			s.st.Max.Round(time.Millisecond), s.st.MaxAt.Sub(r.signalled).Round(time.Millisecond))
	}
	if r.newPID == r.oldPID || r.newPID == 0 {
		t.Errorf("pid %d → %d: not a new process", r.oldPID, r.newPID)
	}
}

// nextBinary is a copy of the inplaced binary, under another path: the
// upgrade's new executable.
func nextBinary(t *testing.T, px *harness.Inplaced) string {
	t.Helper()
	src := filepath.Join(harness.BinDir(t), "inplaced")
	dst := filepath.Join(px.Dir, "inplaced-next")
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	return dst
}

// checkActivatedStarts: each of the starts served the socket it was passed.
func checkActivatedStarts(t *testing.T, px *harness.Inplaced, starts int) {
	t.Helper()
	log, err := os.ReadFile(px.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	n := strings.Count(string(log), `"socket_from_systemd": true`)
	if n != starts {
		t.Errorf("%d starts served the passed socket, want %d:\n%s", n, starts, px.LogTail(40))
	}
}

// TestSwapAcrossRestart: a swap in flight when inplaced gets SIGTERM
// either completes within the grace, recorded by the process that ran it,
// or is cut at the grace and settled by the next process's recovery
// before it serves; either way the container name has one running
// container, the one the record names, and no CRI call of the client
// fails.
func TestSwapAcrossRestart(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c *harness.Containerd) {
		for _, tc := range []struct {
			name, grace, minRuntime string
			cut                     bool
		}{
			{name: "completes within the grace", grace: "20s", minRuntime: "3s"},
			{name: "cut at the grace, settled by recovery", grace: "1s", minRuntime: "30s", cut: true},
		} {
			t.Run(strings.ReplaceAll(tc.name, " ", "-"), func(t *testing.T) {
				px := harness.StartInplacedActivated(t, c.Endpoint, []string{"--shutdown-grace", tc.grace})
				cri := harness.DialCRI(t, px.Endpoint)
				p := runPod(t, cri, "swaprestart-"+strconv.FormatBool(tc.cut), c.Images.App1, podOpts{})
				load := harness.StartCRILoad(t, px.Endpoint, loadRate)
				swapDone := make(chan string, 1)
				go func() {
					out, err := px.Ctl("swap", p.name, "-c", "app", "--image", c.Images.App2, "--min-runtime", tc.minRuntime)
					swapDone <- fmt.Sprintf("%s %v", out, err)
				}()
				e := &env{px: px}
				eventually(t, time.Minute, "the swap in its health gate", func() error {
					for _, c := range ps(t, e) {
						if c.Pod == p.name && c.RunningStep == "health-gate" {
							return nil
						}
					}
					return fmt.Errorf("not yet")
				})
				r := restart(t, px, syscall.SIGTERM, 0, "")
				t.Logf("inplacectl swap, whose control connection ended with the process: %s", <-swapDone)
				time.Sleep(2 * time.Second)
				calls := load.Stop()
				r.report(t, calls)
				if s := harness.Stats(calls, time.Time{}, time.Time{}); s.Failed > 0 {
					t.Errorf("%d of %d CRI calls failed across the restart:\n%s", s.Failed, s.Calls, strings.Join(s.Errors, "\n"))
				}
				checkSwapSettled(t, px, cri, p, tc.cut)
			})
		}
	})
}

// checkSwapSettled: one running app container, the one the swap's record
// names, in the state the case expects; the log says who settled it.
func checkSwapSettled(t *testing.T, px *harness.Inplaced, cri *harness.CRIClient, p *pod, cut bool) {
	t.Helper()
	running := p.running(t, cri)
	if len(running) != 1 {
		t.Fatalf("%d running app containers, want 1", len(running))
	}
	hist := swaps(t, &env{px: px})
	if len(hist) != 1 {
		t.Fatalf("swap history has %d records, want 1: %+v", len(hist), hist)
	}
	rec := hist[0]
	_, in := containerInfo(t, cri, running[0].Id)
	v, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(in.Pid), "root", "VERSION"))
	if err != nil {
		t.Fatal(err)
	}
	version := strings.TrimSpace(string(v))
	want := map[string]string{"SWAP_STATE_COMMITTED": "v2", "SWAP_STATE_FAILED": "v1"}[rec.State]
	if want == "" || want != version || rec.RunningContainerID != running[0].Id {
		t.Fatalf("record %s says running %s; node runs %s (%s)", rec.State, rec.RunningContainerID, running[0].Id, version)
	}
	log, err := os.ReadFile(px.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	leftToRecovery := strings.Contains(string(log), "swaps still running at the shutdown grace")
	if leftToRecovery != cut {
		t.Errorf("swap left to recovery: %v, want %v", leftToRecovery, cut)
	}
	if !cut && rec.State != "SWAP_STATE_COMMITTED" {
		t.Errorf("a swap with the grace to finish ended %s", rec.State)
	}
	t.Logf("swap %s: %s, running %s (%s); left to recovery: %v", rec.ID, rec.State, version, running[0].Id[:13], leftToRecovery)
}
