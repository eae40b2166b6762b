package guest

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/test/harness"
)

// fleetSwapPod is the app pod of the 20 that the suite changes: `kubectl
// set image` after the install, a swap in flight across the upgrade.
const fleetSwapPod = "fleet-01"

// inflightGate is the in-flight swap's health gate (--min-runtime): longer
// than the upgrade takes to restart inplaced (68–116 s in docs/upgrade.md,
// under TCG), so the swap is still running at the restart whatever the
// emulator's pace; the old process's shutdown grace (10 s) cuts it and the
// new process's recovery settles it.
const inflightGate = 5 * time.Minute

// setImage is `kubectl set image` on fleetSwapPod after the install: an
// in-place swap driven by kubelet (Kubernetes mode, the chart's default):
// the same pod, IP and sandbox, kubelet's view of one restart, the swap's
// record committed, no other container touched.
func (f *fleet) setImage(t *testing.T) {
	before := waitAPIPod(t, f.cs, fleetSwapPod, time.Minute, harness.PodRunning(container))
	old := apiContainer(before)
	sb := f.sandboxOf(t, before)
	start := time.Now()
	patch := fmt.Sprintf(`{"spec":{"containers":[{"name":%q,"image":%q}]}}`, container, imgApp2)
	if _, err := f.cs.CoreV1().Pods("default").Patch(ctx(t), fleetSwapPod, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatalf("kubectl set image: %v", err)
	}
	after := waitAPIPod(t, f.cs, fleetSwapPod, 5*time.Minute, func(p *corev1.Pod) error {
		s := apiContainer(p)
		if s == nil || criID(s) == criID(old) || s.RestartCount != old.RestartCount+1 || s.State.Running == nil || !s.Ready || s.Image != imgApp2 {
			return fmt.Errorf("want %s in a new container, restartCount %d, running, ready; status %+v", imgApp2, old.RestartCount+1, s)
		}
		return nil
	})
	took := time.Since(start)
	if after.UID != before.UID || after.Status.PodIP != before.Status.PodIP {
		t.Errorf("pod changed: UID %s→%s, IP %s→%s", before.UID, after.UID, before.Status.PodIP, after.Status.PodIP)
	}
	if now := f.sandboxOf(t, after); now != sb {
		t.Errorf("sandbox changed: %s → %s", short(sb), short(now))
	}
	rec := f.settledSwap(t, "kubelet", time.Minute)
	now := apiContainer(after)
	if rec.State != "SWAP_STATE_COMMITTED" || rec.RunningContainerID != criID(now) || rec.OldContainerID != criID(old) {
		t.Errorf("kubelet-driven swap record: %s %s, old %s running %s; want committed, %s → %s",
			rec.State, rec.Error, short(rec.OldContainerID), short(rec.RunningContainerID), short(criID(old)), short(criID(now)))
	}
	f.before[fleetSwapPod] = podState{id: criID(now), restarts: now.RestartCount}
	t.Logf("fleet: kubectl set image %s → %s after the install: in place in %s (same pod, IP %s, sandbox %s; swap %s %s, steps %s)",
		imgApp1, imgApp2, took.Round(time.Millisecond), after.Status.PodIP, short(sb), rec.ID, rec.State, rec.stepNames())
	f.samePods(t, "set image")
}

// inflight is a node-local swap of fleetSwapPod started before the upgrade
// and still in its health gate (inflightGate) when inplaced restarts.
type inflight struct {
	before  podState
	started time.Time
	out     chan string // inplacectl's output and error, once it returns
}

// startInflight swaps fleetSwapPod back to imgApp1 with a long health gate
// and returns once the swap is in it: the new container runs.
func (f *fleet) startInflight(t *testing.T) *inflight {
	in := &inflight{before: f.before[fleetSwapPod], started: time.Now(), out: make(chan string, 1)}
	go func() {
		c, cancel := context.WithTimeout(context.Background(), inflightGate+5*time.Minute)
		defer cancel()
		out, err := exec.CommandContext(c, "/usr/local/bin/inplacectl", "swap", fleetSwapPod, "-n", "default", "-c", container,
			"--image", imgApp1, "--min-runtime", inflightGate.String(), "-o", "json").CombinedOutput()
		in.out <- fmt.Sprintf("%v: %s", err, tailLines(string(out), 5))
	}()
	eventually(t, 5*time.Minute, "the swap in its health gate", func() error {
		r, err := latestSwap(fleetSwapPod, "swap")
		if err != nil {
			return err
		}
		if r.State != "SWAP_STATE_RUNNING" || !slices.Contains(r.stepNames(), "health-gate") {
			return fmt.Errorf("swap %s %s, steps %v", r.ID, r.State, r.stepNames())
		}
		return nil
	})
	t.Logf("fleet: a swap of %s (%s → %s, health gate %s) in its health gate %s after it began",
		fleetSwapPod, imgApp2, imgApp1, inflightGate, time.Since(in.started).Round(time.Millisecond))
	return in
}

// judge fails t unless the swap was cut by the restart and settled by the
// new process's recovery, with the pod running the container the record
// names and kubelet knows.
func (in *inflight) judge(t *testing.T, f *fleet, restarted time.Time) {
	rec := f.settledSwap(t, "swap", 3*time.Minute)
	select {
	case out := <-in.out:
		t.Logf("fleet: upgrade: inplacectl swap, watching the swap, returned: %s", out)
	case <-time.After(30 * time.Second):
		t.Errorf("inplacectl swap still watching the swap 30 s after its record settled")
	}
	if !slices.Contains(rec.stepNames(), "recover") {
		t.Fatalf("swap %s ended %s without a recovery (steps %v): it was not in flight when inplaced restarted at %s",
			rec.ID, rec.State, rec.stepNames(), restarted.Format("15:04:05.000"))
	}
	if rec.State != "SWAP_STATE_COMMITTED" && rec.State != "SWAP_STATE_FAILED" {
		t.Errorf("swap %s recovered to %s (%s): want committed, or rolled back to the old container", rec.ID, rec.State, rec.Error)
	}
	p := waitAPIPod(t, f.cs, fleetSwapPod, 3*time.Minute, func(p *corev1.Pod) error {
		s := apiContainer(p)
		if s == nil || criID(s) != rec.RunningContainerID || s.State.Running == nil || !s.Ready {
			return fmt.Errorf("want the record's container %s running and ready; status %+v", short(rec.RunningContainerID), s)
		}
		return nil
	})
	now := apiContainer(p)
	f.before[fleetSwapPod] = podState{id: criID(now), restarts: now.RestartCount}
	t.Logf("fleet: upgrade: the swap in flight at inplaced's restart (%s) was recovered by the new process: %s, running %s (%s), steps %v",
		restarted.Format("15:04:05.000"), rec.State, short(rec.RunningContainerID), now.Image, rec.stepNames())
}

// settledSwap waits until the newest swap of kind for fleetSwapPod has
// ended.
func (f *fleet) settledSwap(t *testing.T, kind string, timeout time.Duration) holdSwapRecord {
	t.Helper()
	var rec holdSwapRecord
	eventually(t, timeout, "the "+kind+" swap's record settled", func() error {
		r, err := latestSwap(fleetSwapPod, kind)
		if err != nil {
			return err
		}
		if r.State == "SWAP_STATE_RUNNING" {
			return fmt.Errorf("swap %s running, steps %v", r.ID, r.stepNames())
		}
		rec = r
		return nil
	})
	return rec
}

// sandboxOf is the ID of p's ready sandbox, from containerd.
func (f *fleet) sandboxOf(t *testing.T, p *corev1.Pod) string {
	t.Helper()
	cri := harness.DialCRI(t, containerdSocket)
	resp, err := cri.Runtime.ListPodSandbox(ctx(t), &runtimeapi.ListPodSandboxRequest{Filter: &runtimeapi.PodSandboxFilter{
		LabelSelector: map[string]string{"io.kubernetes.pod.uid": string(p.UID)},
		State:         &runtimeapi.PodSandboxStateValue{State: runtimeapi.PodSandboxState_SANDBOX_READY}}})
	if err != nil || len(resp.Items) != 1 {
		t.Fatalf("the ready sandbox of pod %s: %v, %d found", p.Name, err, len(resp.GetItems()))
	}
	return resp.Items[0].Id
}

func (r holdSwapRecord) stepNames() []string {
	var names []string
	for _, s := range r.Steps {
		names = append(names, s.Name)
	}
	return names
}

// logRestart logs what inplaced's journal says of its restart since
// since: the drain, the swaps waited for, the handover, the recovery.
func logRestart(t *testing.T, since time.Time) {
	out, err := exec.Command("journalctl", "-b", "-u", "inplaced", "--no-pager", "-o", "short-precise",
		"--since", since.Format("2006-01-02 15:04:05")).CombinedOutput()
	if err != nil {
		t.Logf("journalctl: %v", err)
		return
	}
	var lines []string
	for _, l := range strings.Split(string(out), "\n") {
		for _, k := range []string{"shutting down", "shut down", "still running", "socket left", "recovered", "Started", "Stopping"} {
			if strings.Contains(l, k) {
				lines = append(lines, l)
				break
			}
		}
	}
	t.Logf("fleet: upgrade: inplaced's journal of the restart:\n%s", strings.Join(lines, "\n"))
}

// restartedAt is when systemd last started unit's main process.
func restartedAt(t *testing.T, unit string) time.Time {
	t.Helper()
	v := unitProps(t, unit, "ExecMainStartTimestamp")["ExecMainStartTimestamp"]
	at, err := time.Parse("Mon 2006-01-02 15:04:05 MST", strings.TrimSpace(v))
	if err != nil {
		t.Logf("ExecMainStartTimestamp of %s: %q: %v", unit, v, err)
	}
	return at
}
