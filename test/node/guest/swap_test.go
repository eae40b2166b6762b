package guest

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/inplaced/inplaced/test/harness"
)

// TestSwap swaps the image and env of a kubelet-managed pod's container with
// the systemd driver: kubelet adopts the new container (image v2, ready,
// restartCount 1), the sandbox and its IP are the same, and the new container
// is its own cri-containerd-<id>.scope under the same pod slice.
func TestSwap(t *testing.T) {
	writePods(t, pod{name: "sw", image: imgApp1, env: [][2]string{{"A", "1"}}, readinessHTTP: 8080,
		cpuReq: "100m", cpuLim: "500m", memReq: "32Mi", memLim: "128Mi"})
	proxy := harness.DialCRI(t, proxySocket)
	before := waitPod(t, "sw", 5*time.Minute, harness.Running(container))
	old := inspect(t, proxy, before.Container(container).ID())
	oldCg := procCgroup(t, old.pid)
	t.Logf("before: container %s in %s, pod IP %s", old.status.Id[:12], oldCg, before.Status.PodIP)

	// A device dialling the pod IP every 5 ms through the swap: with the
	// connection hold (this kernel has the native nft queue expression) no
	// connection is refused.
	checkNoHoldTable(t, old.pid, "before the swap")
	dialer := harness.StartDialer(before.Status.PodIP + ":8080")

	out, err := inplacectl("swap", podName("sw"), "-n", "default", "-c", container, "--image", imgApp2, "--env", "X=Y", "--min-runtime", "2s", "-o", "json")
	dials := dialer.End()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var rec struct {
		State              string `json:"state"`
		Error              string `json:"error"`
		OldContainerID     string `json:"old_container_id"`
		RunningContainerID string `json:"running_container_id"`
		DowntimeNs         string `json:"downtime_ns"`
		Hold               struct {
			Mode       string `json:"mode"`
			Why        string `json:"why"`
			Reason     string `json:"reason"`
			Parked     string `json:"parked"` // uint64: a string in protobuf JSON
			Started    string `json:"started_unix_nano"`
			DurationNs string `json:"duration_ns"`
		} `json:"hold"`
	}
	if i := strings.LastIndex(out, "\n{"); i >= 0 {
		out = out[i+1:]
	}
	if err := json.Unmarshal([]byte(out[strings.Index(out, "{"):]), &rec); err != nil {
		t.Fatalf("decode swap record: %v\n%s", err, out)
	}
	if rec.State != "SWAP_STATE_COMMITTED" || rec.OldContainerID != old.status.Id {
		t.Fatalf("swap: %+v", rec)
	}
	dt, _ := strconv.ParseInt(rec.DowntimeNs, 10, 64)
	t.Logf("swap committed: %s → %s, downtime %s", rec.OldContainerID[:12], rec.RunningContainerID[:12], time.Duration(dt).Round(time.Millisecond))
	tally := harness.TallyDials(t, dials)
	t.Logf("hold %+v; %d connections: %+v", rec.Hold, len(dials), tally)
	if rec.Hold.Mode != "queue" || rec.Hold.Reason != "listening" || strings.Contains(rec.Hold.Why, "nft_compat") {
		t.Errorf("hold %+v: want the native queue, released when v2 listened", rec.Hold)
	}
	if tally.Failed() != 0 || tally.ByVersion["v2"] == 0 {
		t.Errorf("connections during the swap: %+v, want none failed and v2 answering", tally)
	}
	// The hold lets go when v2 listens (a 1 ms poll, then the verdicts). On
	// real hardware no handshake waits more than 50 ms past that (asserted
	// on the host, test/e2e); this guest is emulated (QEMU TCG), where the
	// kernel needs hundreds of ms to answer the thousands of SYNs released
	// at once, so the excess is reported, not judged.
	started, _ := strconv.ParseInt(rec.Hold.Started, 10, 64)
	held, _ := strconv.ParseInt(rec.Hold.DurationNs, 10, 64)
	logWaitsPastRelease(t, dials, time.Unix(0, started+held))

	p := waitPod(t, "sw", 2*time.Minute, func(p *harness.KubePod) error {
		c := p.Container(container)
		if c.ID() != rec.RunningContainerID || c.Image != imgApp2 || !c.Ready || c.State.Running == nil || c.RestartCount != 1 {
			b, _ := json.Marshal(c)
			return fmt.Errorf("kubelet shows %s", b)
		}
		return nil
	})
	t.Logf("kubelet adopted it: image %s, ready, restartCount %d", p.Container(container).Image, p.Container(container).RestartCount)
	if p.Status.PodIP != before.Status.PodIP || p.Status.PodIP == "" {
		t.Errorf("pod IP %q, was %q", p.Status.PodIP, before.Status.PodIP)
	}

	nu := inspect(t, proxy, rec.RunningContainerID)
	checkNoHoldTable(t, nu.pid, "after the swap")
	if nu.sandboxID != old.sandboxID {
		t.Errorf("new container in sandbox %s, old in %s", nu.sandboxID, old.sandboxID)
	}
	cg := procCgroup(t, nu.pid)
	want := path.Join(path.Dir(oldCg), "cri-containerd-"+rec.RunningContainerID+".scope")
	if cg != want {
		t.Errorf("new container's process is in %s, want %s (same pod slice)", cg, want)
	}
	t.Logf("new container in %s", cg)
	if v := readFile(t, "/proc/"+strconv.Itoa(nu.pid)+"/root/VERSION"); v != "v2" {
		t.Errorf("new container runs VERSION %q, want v2", v)
	}
	env, err := os.ReadFile("/proc/" + strconv.Itoa(nu.pid) + "/environ")
	if err != nil {
		t.Fatal(err)
	}
	vars := strings.Split(string(env), "\x00")
	for _, kv := range []string{"X=Y", "A=1"} {
		found := false
		for _, v := range vars {
			found = found || v == kv
		}
		if !found {
			t.Errorf("new container's environment lacks %s: %v", kv, vars)
		}
	}
}

// checkNoHoldTable fails t when the network namespace of pid (the pod's)
// holds a table of inplaced's, listed with nft as an operator would.
func checkNoHoldTable(t *testing.T, pid int, when string) {
	t.Helper()
	out, err := exec.Command("nsenter", "-t", strconv.Itoa(pid), "-n", "nft", "list", "tables").CombinedOutput()
	if err != nil {
		t.Fatalf("nft list tables in the pod netns %s: %v\n%s", when, err, out)
	}
	if strings.Contains(string(out), "inplaced") {
		t.Errorf("pod netns %s: %s", when, out)
	}
	t.Logf("pod netns %s: %d nft tables, none of inplaced's", when, strings.Count(string(out), "table "))
}

// logWaitsPastRelease reports how long past the hold's release the
// slowest handshakes completed, and how many completed more than 50 ms
// after it.
func logWaitsPastRelease(t *testing.T, ds []harness.Dial, released time.Time) {
	var worst time.Duration
	over := 0
	for _, d := range ds {
		if d.Err != nil {
			continue
		}
		from := released // the later of the release and the dial
		if d.At.After(released) {
			from = d.At
		}
		past := d.At.Add(d.Connect).Sub(from)
		worst = max(worst, past)
		if past > 50*time.Millisecond {
			over++
		}
	}
	t.Logf("handshakes past the release: slowest %s after it, %d of %d more than 50 ms (emulated guest)", worst.Round(time.Millisecond), over, len(ds))
}
