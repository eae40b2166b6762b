package e2e

import (
	"encoding/json"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/inplaced/inplaced/test/harness"
)

// holdRecord is the hold part of a swap record (inplacectl -o json).
type holdRecord struct {
	Mode          string   `json:"mode"`
	Why           string   `json:"why"`
	Ports         []uint32 `json:"ports"`
	Started       string   `json:"started_unix_nano"`
	DurationNs    string   `json:"duration_ns"`
	Parked        string   `json:"parked"`
	Reason        string   `json:"reason"`
	LongestWaitNs string   `json:"longest_wait_ns"`
	NeverListened []uint32 `json:"never_listened"`
}

type holdSwap struct {
	State              string `json:"state"`
	Error              string `json:"error"`
	Hold               *holdRecord
	RunningContainerID string `json:"running_container_id"`
}

func parseHoldSwap(t *testing.T, out string) holdSwap {
	t.Helper()
	i := strings.Index(out, "{")
	if i < 0 {
		t.Fatalf("no JSON record in output:\n%s", out)
	}
	var r holdSwap
	if err := json.Unmarshal([]byte(out[i:]), &r); err != nil {
		t.Fatalf("decode record: %v\n%s", err, out)
	}
	return r
}

// released is when the hold let go: the hold step's start (the install)
// plus the hold's duration. The release follows the new listener by the
// 1 ms poll and the 7 ms of the verdicts, so this is a little late.
func (r holdSwap) released() time.Time {
	start, _ := strconv.ParseInt(r.Hold.Started, 10, 64)
	d, _ := strconv.ParseInt(r.Hold.DurationNs, 10, 64)
	return time.Unix(0, start+d)
}

// nftTables lists the tables in the network namespace of pid with nft.
func nftTables(t *testing.T, pid int) string {
	t.Helper()
	out, err := exec.Command("nsenter", "-t", strconv.Itoa(pid), "-n", "nft", "list", "tables").CombinedOutput()
	if err != nil {
		t.Fatalf("nft list tables in the pod netns: %v\n%s", err, out)
	}
	return string(out)
}

func requireNft(t *testing.T) {
	_, err := exec.LookPath("nft")
	harness.Require(t, "nft", err == nil, "install Debian's nftables (hack/install-deps.sh)")
}

// checkNoHoldTable fails t when the pod netns has a table of inplaced's.
func checkNoHoldTable(t *testing.T, pid int, when string) {
	t.Helper()
	if tables := nftTables(t, pid); strings.Contains(tables, "inplaced") {
		t.Errorf("pod netns %s: %s", when, tables)
	}
}

// TestConnectionHold: a node-local swap v1 → v2 under a client dialling the
// pod IP every 5 ms: nothing refused, reset or timed out; each connection
// waited at most until v2 listened + 50 ms; v2 saw the client's own address;
// no table in the pod netns before or after. Then a new image that never
// listens (the hold ends at --hold-max, the swap rolls back, nobody waits
// past the limit), a crashing image (held connections land on the
// rolled-back process), and SIGKILL of inplaced during a hold (no rule left,
// the swap converges, the next swap holds again).
func TestConnectionHold(t *testing.T) {
	requireNft(t)
	forEachBackend(t, func(t *testing.T, c *harness.Containerd) {
		e := newEnv(t, c)
		p := runPod(t, e.cri, "hold", e.imgs.App1, podOpts{})
		sb, sbInfo := sandboxInfo(t, e.cri, p.sandboxID)
		addr := net.JoinHostPort(sb.GetNetwork().GetIp(), "8080")
		eventually(t, 10*time.Second, "v1 answering", func() error { _, err := httpGet("http://" + addr + "/version"); return err })

		swapUnder := func(t *testing.T, args ...string) (holdSwap, []harness.Dial) {
			t.Helper()
			checkNoHoldTable(t, sbInfo.Pid, "before the swap")
			d := harness.StartDialer(addr)
			time.Sleep(300 * time.Millisecond)
			out, _ := e.px.Ctl(append([]string{"swap", p.name, "-c", "app", "-o", "json"}, args...)...)
			r := parseHoldSwap(t, out)
			time.Sleep(300 * time.Millisecond)
			ds := d.End()
			checkNoHoldTable(t, sbInfo.Pid, "after the swap")
			if r.Hold == nil {
				t.Fatalf("no hold in the record:\n%s", out)
			}
			return r, ds
		}

		t.Run("swap", func(t *testing.T) {
			r, ds := swapUnder(t, "--image", e.imgs.App2)
			s := harness.TallyDials(t, ds)
			t.Logf("state %s, hold %+v; %d connections: %+v", r.State, *r.Hold, len(ds), s)
			if r.State != "SWAP_STATE_COMMITTED" || r.Hold.Mode != "queue" || r.Hold.Reason != "listening" || fmt.Sprint(r.Hold.Ports) != "[8080]" {
				t.Fatalf("record: %s %s, hold %+v", r.State, r.Error, *r.Hold)
			}
			if s.Failed() > 0 || s.ByVersion["v1"] == 0 || s.ByVersion["v2"] == 0 {
				t.Errorf("client: %+v, want no failure, v1 then v2", s)
			}
			harness.CheckWaits(t, ds, r.released())
		})

		// A new version that never listens where the old one did rolls
		// back at --hold-max; the port stays held through the rollback, so
		// no client is refused and the held ones land on the old version.
		t.Run("never listens", func(t *testing.T) {
			e.px.ExtraArgs = []string{"--hold-max", "2s"}
			if err := e.px.Stop(); err != nil {
				t.Fatal(err)
			}
			if err := e.px.Start(); err != nil {
				t.Fatal(err)
			}
			before, err := httpGet("http://" + addr + "/version") // what the rollback must bring back
			if err != nil {
				t.Fatal(err)
			}
			r, ds := swapUnder(t, "--image", e.imgs.App2, "--args", "-listen=")
			s := harness.TallyDials(t, ds)
			t.Logf("state %s %s, hold %+v; client %+v", r.State, r.Error, *r.Hold, s)
			if r.State != "SWAP_STATE_FAILED" || !strings.Contains(r.Error, "did not listen on port 8080") || !strings.Contains(r.Error, "rolled back") {
				t.Fatalf("record: %s %s, hold %+v", r.State, r.Error, *r.Hold)
			}
			if r.Hold.Reason != "listening" || fmt.Sprint(r.Hold.NeverListened) != "[8080]" {
				t.Errorf("hold %+v: want released when the rolled-back container listened, 8080 never listened on", *r.Hold)
			}
			if d, _ := strconv.ParseInt(r.Hold.DurationNs, 10, 64); time.Duration(d) < 2*time.Second {
				t.Errorf("hold lasted %s, --hold-max 2s", time.Duration(d))
			}
			if s.Failed() > 0 || s.ByVersion[before] == 0 || len(s.ByVersion) != 1 {
				t.Errorf("client: %+v, want every connection answered by %s (what ran before), none failed", s, before)
			}
			harness.CheckWaits(t, ds, r.released())
		})

		// With the pod's opt-out the same swap commits as before: the hold
		// ends at the limit and the port refuses.
		t.Run("never listens, opted out", func(t *testing.T) {
			q := runPod(t, e.cri, "hold-optout", e.imgs.App1, podOpts{annotations: map[string]string{"inplaced.io/require-listeners": "false"}})
			qsb, qInfo := sandboxInfo(t, e.cri, q.sandboxID)
			qaddr := net.JoinHostPort(qsb.GetNetwork().GetIp(), "8080")
			eventually(t, 10*time.Second, "v1 answering", func() error { _, err := httpGet("http://" + qaddr + "/version"); return err })
			d := harness.StartDialer(qaddr)
			out, _ := e.px.Ctl("swap", q.name, "-c", "app", "-o", "json", "--image", e.imgs.App2, "--args", "-listen=")
			r := parseHoldSwap(t, out)
			time.Sleep(300 * time.Millisecond)
			s := harness.TallyDials(t, d.End())
			checkNoHoldTable(t, qInfo.Pid, "after the swap")
			t.Logf("state %s %s, hold %+v; client %+v", r.State, r.Error, r.Hold, s)
			if r.State != "SWAP_STATE_COMMITTED" || r.Hold == nil || r.Hold.Reason != "limit" || fmt.Sprint(r.Hold.NeverListened) != "[8080]" {
				t.Fatalf("record: %s %s, hold %+v: want committed, released at the limit, 8080 never listened on", r.State, r.Error, r.Hold)
			}
			if s.Refused == 0 {
				t.Errorf("client %+v: past the limit the port refuses, as without the check", s)
			}
		})

		t.Run("crashing image", func(t *testing.T) {
			before, err := httpGet("http://" + addr + "/version") // what the rollback must bring back
			if err != nil {
				t.Fatal(err)
			}
			r, ds := swapUnder(t, "--image", e.imgs.Crash, "--min-runtime", "2s")
			s := harness.TallyDials(t, ds)
			t.Logf("state %s %s, hold %+v; client %+v", r.State, r.Error, *r.Hold, s)
			if r.State != "SWAP_STATE_FAILED" || !strings.Contains(r.Error, "rolled back") || r.Hold.Reason != "listening" {
				t.Fatalf("record: %s %s, hold %+v", r.State, r.Error, *r.Hold)
			}
			if s.Failed() > 0 || len(s.ByVersion) != 1 || s.ByVersion[before] == 0 {
				t.Errorf("client: %+v, want every connection on %s (what ran before, then rolled back), none failed", s, before)
			}
			if n, _ := strconv.Atoi(r.Hold.Parked); n == 0 {
				t.Error("nothing was parked")
			}
		})

		t.Run("inplaced killed during the hold", func(t *testing.T) {
			e.px.ExtraArgs = nil
			if err := e.px.Stop(); err != nil {
				t.Fatal(err)
			}
			if err := e.px.Start("INPLACED_TEST_CRASH_AFTER=hold"); err != nil {
				t.Fatal(err)
			}
			_, _ = e.px.Ctl("swap", p.name, "-c", "app", "--image", e.imgs.App2)
			select {
			case <-e.px.Exited():
			case <-time.After(30 * time.Second):
				t.Fatal("inplaced did not crash after the hold step")
			}
			checkNoHoldTable(t, sbInfo.Pid, "right after SIGKILL of inplaced during the hold")
			if err := e.px.Start(); err != nil {
				t.Fatal(err)
			}
			running := p.running(t, e.cri)
			if len(running) != 1 {
				t.Fatalf("%d containers run after recovery, want 1", len(running))
			}
			r, ds := swapUnder(t, "--image", e.imgs.App2)
			s := harness.TallyDials(t, ds)
			t.Logf("next swap: state %s, hold %+v; client %+v", r.State, *r.Hold, s)
			if r.State != "SWAP_STATE_COMMITTED" || r.Hold.Mode != "queue" || r.Hold.Reason != "listening" {
				t.Fatalf("record: %s %s, hold %+v", r.State, r.Error, *r.Hold)
			}
			if s.Failed() > 0 {
				t.Errorf("client: %+v", s)
			}
		})
	})
}
