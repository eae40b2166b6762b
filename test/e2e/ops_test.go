package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"

	"github.com/inplaced/inplaced/test/harness"
)

// TestOperatorView proves what an operator sees: ps and watch
// during a swap made by this test binary, the caller's uid and exe in the
// audit log and the history, the Prometheus metrics after a swap, a resize
// and a failed swap (promlint, as promtool check metrics), and prepull's progress over a
// paced 100 Mbit/s link on a pseudo-terminal and as JSON lines.
func TestOperatorView(t *testing.T) {
	harness.RequireRoot(t)
	backends := harness.BackendsFromEnv()
	harness.Require(t, "a containerd backend", len(backends) > 0, "no containerd found; run hack/install-deps.sh")
	// What an operator sees is inplaced's own output: one containerd proves it.
	backends = firstBackendOnly(t, backends)
	reg := harness.StartRegistry(t)
	link := reg.StartLink(t, 100_000_000)
	for _, b := range backends {
		t.Run(string(b), func(t *testing.T) {
			c := harness.StartContainerd(t, b, reg)
			e := newEnv(t, c)
			metricsAddr := freeAddr(t)
			if err := e.px.Stop(); err != nil {
				t.Fatal(err)
			}
			e.px.ExtraArgs = []string{"--metrics-listen", metricsAddr, "--log-format", "json"}
			if err := e.px.Start(); err != nil {
				t.Fatalf("inplaced with metrics: %v\n%s", err, e.px.LogTail(30))
			}
			p := runPod(t, e.cri, "ops-main", e.imgs.App1, podOpts{})
			swapID := testPsWatchAudit(t, e, p)
			metrics := testMetrics(t, e, p, metricsAddr, swapID)
			large := link + strings.TrimPrefix(c.Images.Large, reg.Addr)
			testPrepull(t, e, large)
			testSwapPullProgress(t, e, p, large)
			promtoolCheck(t, metrics)
		})
	}
}

func freeAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

type psEntry struct {
	ID             string `json:"id"`
	Pod            string `json:"pod"`
	Container      string `json:"container"`
	State          string `json:"state"`
	OverrideSwapID string `json:"override_swap_id"`
	RunningSwapID  string `json:"running_swap_id"`
	RunningStep    string `json:"running_step"`
	KubeletHash    string `json:"kubelet_hash"`
}

func ps(t *testing.T, e *env) []psEntry {
	t.Helper()
	out, err := e.px.Ctl("ps", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var l struct {
		Containers []psEntry `json:"containers"`
	}
	mustJSON(t, out, &l)
	return l.Containers
}

type watchEvent struct {
	Kind   string `json:"kind"`
	SwapID string `json:"swap_id"`
	Step   string `json:"step"`
	Pod    string `json:"pod"`
	State  string `json:"state"`
}

// testPsWatchAudit: a swap started by this test binary over the control
// socket (gRPC, not inplacectl) is seen running by ps, its events reach a
// watch started before it, in order, and the audit line and the history
// name this binary.
func testPsWatchAudit(t *testing.T, e *env, p *pod) string {
	// watch, filtered to the pod; a second pod's events must not show.
	watch := exec.Command(filepath.Join(harness.BinDir(t), "inplacectl"), "--control-socket", e.px.ControlSocket,
		"watch", "--pod", p.name, "-n", p.ns, "-o", "json")
	var wout bytes.Buffer
	watch.Stdout = &wout
	werr, err := watch.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := watch.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = watch.Process.Kill() })
	if line, err := bufio.NewReader(werr).ReadString('\n'); err != nil || !strings.Contains(line, "watching") {
		t.Fatalf("watch did not start: %q %v", line, err)
	}

	conn, err := grpc.NewClient("unix://"+e.px.ControlSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctl := inplacedv1.NewControlClient(conn)
	img := e.imgs.App2
	stream, err := ctl.Swap(ctx(t), &inplacedv1.SwapRequest{
		Target: &inplacedv1.Target{Namespace: p.ns, Pod: p.name, Container: "app"},
		Change: &inplacedv1.Change{Image: &img, SetEnv: map[string]string{"API_TOKEN": "do-not-log-me"}},
		// The health gate holds the swap for 4 s: ps sees it running.
		Options: &inplacedv1.SwapOptions{MinRuntimeMs: 4000},
	})
	if err != nil {
		t.Fatal(err)
	}
	var final *inplacedv1.SwapRecord
	done := make(chan error, 1)
	go func() {
		for {
			ev, err := stream.Recv()
			if err == io.EOF {
				done <- nil
				return
			}
			if err != nil {
				done <- err
				return
			}
			if ev.Record != nil {
				final = ev.Record
			}
		}
	}()
	var seen psEntry
	eventually(t, 30*time.Second, "ps shows the swap in its health gate", func() error {
		for _, c := range ps(t, e) {
			if c.Pod == p.name && c.RunningSwapID != "" && c.RunningStep == "health-gate" {
				seen = c
				return nil
			}
		}
		return fmt.Errorf("not yet")
	})
	table, err := e.px.Ctl("ps")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("inplacectl ps during the swap:\n%s", table)
	if !strings.Contains(table, "health-gate") || seen.KubeletHash != "1a2b3c4d" {
		t.Fatalf("ps table lacks the running step, or the hash is %q", seen.KubeletHash)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if final == nil || final.State != inplacedv1.SwapState_SWAP_STATE_COMMITTED {
		t.Fatalf("swap: %v", final)
	}
	if seen.RunningSwapID != final.Id {
		t.Fatalf("ps showed swap %s running, the swap was %s", seen.RunningSwapID, final.Id)
	}
	var withOverride *psEntry
	for _, c := range ps(t, e) {
		if c.Pod == p.name && c.State == "CONTAINER_RUNNING" {
			withOverride = &c
		}
	}
	if withOverride == nil || withOverride.OverrideSwapID != final.Id || withOverride.ID != final.RunningContainerId {
		t.Fatalf("ps after the swap: %+v, want the running container %s with the override from %s", withOverride, final.RunningContainerId, final.Id)
	}
	table, _ = e.px.Ctl("ps")
	t.Logf("inplacectl ps after the swap:\n%s", table)

	// watch: the swap's events in order; Ctrl-C ends it with status 0.
	want := []string{"swap-started", "step-started pull", "step-done pull", "step-started create-new", "step-done stop-old",
		"step-done start-new", "step-done health-gate", "override-set", "swap-ended"}
	var got []watchEvent
	eventually(t, 10*time.Second, "watch has the swap's end", func() error {
		got = nil
		for _, l := range strings.Split(strings.TrimSpace(wout.String()), "\n") {
			var ev watchEvent
			if json.Unmarshal([]byte(l), &ev) == nil && ev.Kind != "" {
				got = append(got, ev)
			}
		}
		if len(got) == 0 || got[len(got)-1].Kind != "swap-ended" {
			return fmt.Errorf("%d events", len(got))
		}
		return nil
	})
	i := 0
	for _, ev := range got {
		if ev.Pod != p.name || ev.SwapID != final.Id {
			t.Fatalf("watch --pod %s got %+v", p.name, ev)
		}
		if i < len(want) && strings.TrimSpace(ev.Kind+" "+ev.Step) == want[i] {
			i++
		}
	}
	if i != len(want) {
		t.Fatalf("watch events %+v: want in order %v (matched %d)", got, want, i)
	}
	_ = watch.Process.Signal(syscall.SIGINT)
	if err := watch.Wait(); err != nil {
		t.Fatalf("watch after Ctrl-C: %v", err)
	}
	t.Logf("watch saw %d events of swap %s, in order", len(got), final.Id)

	// Audit: one JSON line for the call, naming this binary; no secret.
	self, _ := os.Executable()
	log, _ := os.ReadFile(e.px.LogPath)
	var audit map[string]any
	for _, l := range strings.Split(string(log), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) == nil && m["logger"] == "audit" && m["method"] == "/inplaced.v1.Control/Swap" {
			audit = m
		}
	}
	if audit == nil {
		t.Fatalf("no audit line for the swap in the log:\n%s", e.px.LogTail(20))
	}
	b, _ := json.Marshal(audit)
	t.Logf("audit line: %s", b)
	if audit["uid"] != float64(0) || audit["exe"] != self || audit["code"] != "OK" || strings.Contains(string(b), "do-not-log-me") {
		t.Fatalf("audit line %s: want uid 0, exe %s, code OK and no env value", b, self)
	}
	out, err := e.px.Ctl("swaps")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("inplacectl swaps:\n%s", out)
	if !strings.Contains(out, "uid=0") || !strings.Contains(out, self) {
		t.Fatalf("inplacectl swaps does not name uid 0 and %s", self)
	}
	return final.Id
}

// testMetrics: after the swap, a resize and a failed swap the counters and
// histograms carry the right labels and counts, and promtool accepts them.
func testMetrics(t *testing.T, e *env, p *pod, addr, swapID string) []byte {
	if out, err := e.px.Ctl("resize", p.name, "-n", p.ns, "-c", "app", "--memory", "96Mi"); err != nil {
		t.Fatalf("resize: %v\n%s", err, out)
	}
	if out, err := e.px.Ctl("swap", p.name, "-n", p.ns, "-c", "app", "--image", e.ctrd.Images.App1+"-missing"); err == nil {
		t.Fatalf("swap to a missing image committed:\n%s", out)
	}
	// The resize names its caller, as the swaps do (the CLI, run as root).
	if out, err := e.px.Ctl("resizes"); err != nil || !strings.Contains(out, "caller: uid=0") || !strings.Contains(out, "inplacectl") {
		t.Errorf("inplacectl resizes does not name the caller (uid 0, inplacectl): %v\n%s", err, out)
	}
	text, err := exec.Command("curl", "-fsS", "http://"+addr+"/metrics").Output()
	if err != nil {
		t.Fatalf("curl metrics: %v", err)
	}
	metrics := string(text)
	for _, w := range []struct{ series, value string }{
		{`inplaced_swaps_total{kind="swap",result="committed"}`, "1"},
		{`inplaced_swaps_total{kind="swap",result="failed"}`, "1"},
		{`inplaced_resizes_total{method="cgroup",result="applied",runtime_class="container-cgroups"}`, "1"},
		{`inplaced_swap_downtime_seconds_count{kind="swap"}`, "1"},
		{`inplaced_swap_step_duration_seconds_count{failed="false",step="stop-old"}`, "1"},
		{`inplaced_swap_step_duration_seconds_count{failed="true",step="pull"}`, "1"},
		{`inplaced_cri_requests_total{code="OK",method="RunPodSandbox"}`, "1"},
		{`inplaced_cri_requests_total{code="OK",method="CreateContainer"}`, "1"},
		{`inplaced_cri_request_duration_seconds_count{method="StartContainer"}`, "1"},
		{`inplaced_active_overrides`, "1"},
		{`inplaced_swaps_running`, "0"},
	} {
		re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(w.series) + ` (\S+)$`)
		m := re.FindStringSubmatch(metrics)
		if m == nil || m[1] != w.value {
			t.Errorf("metric %s = %v, want %s", w.series, m, w.value)
		}
	}
	if !strings.Contains(metrics, `inplaced_cri_request_duration_seconds_bucket{method="StartContainer",le="+Inf"}`) {
		t.Error("no latency histogram buckets for StartContainer")
	}
	t.Logf("metrics: %d inplaced_ series with the expected labels and counts", strings.Count(metrics, "\ninplaced_"))
	return text
}

// promtoolCheck lints the exposition the way `promtool check metrics` does:
// promtool's check is client_golang's promlint, used here directly so that
// make test need not build Prometheus for it.
func promtoolCheck(t *testing.T, text []byte) {
	problems, err := promlint.New(bytes.NewReader(text)).Lint()
	if err != nil {
		t.Fatalf("promlint: %v", err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
	t.Logf("promlint (promtool check metrics) passed (%d bytes)", len(text))
}

var progressRe = regexp.MustCompile(`([0-9.]+)/([0-9.]+) MiB`)

// testPrepull: the large image over the paced link, on a pseudo-terminal
// (script) and as JSON lines; then a client killed mid-pull leaves the pull
// running, and Ctrl-C cancels it.
func testPrepull(t *testing.T, e *env, image string) {
	ctl := filepath.Join(harness.BinDir(t), "inplacectl")
	size := func() int64 {
		st, err := e.direct.Image.ImageStatus(ctx(t), &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: image}})
		if err != nil || st.Image == nil {
			return -1
		}
		return int64(st.Image.Size)
	}
	remove := func() {
		_, _ = e.direct.Image.RemoveImage(ctx(t), &runtimeapi.RemoveImageRequest{Image: &runtimeapi.ImageSpec{Image: image}})
	}
	remove()

	// A terminal: script gives inplacectl a pty; the bar is redrawn with \r.
	start := time.Now()
	cmdline := fmt.Sprintf("%s --control-socket %s prepull %s", ctl, e.px.ControlSocket, image)
	out, err := exec.Command("script", "-qefc", cmdline, "/dev/null").CombinedOutput()
	if err != nil {
		t.Fatalf("prepull under script: %v\n%q", err, out)
	}
	took := time.Since(start)
	var done []float64
	var last string
	for _, frame := range regexp.MustCompile(`[\r\n]+`).Split(string(out), -1) {
		if m := progressRe.FindStringSubmatch(frame); m != nil {
			v, _ := strconv.ParseFloat(m[1], 64)
			if len(done) == 0 || v > done[len(done)-1] {
				done = append(done, v)
			}
			last = strings.TrimSpace(strings.TrimPrefix(frame, "\x1b[K"))
		}
	}
	want := size()
	if want < 100<<20 {
		t.Fatalf("image size %d after prepull", want)
	}
	wantMiB := fmt.Sprintf("%.1f/%.1f MiB", float64(want)/(1<<20), float64(want)/(1<<20))
	t.Logf("prepull on a pty: %d growing byte counts in %s; last frame: %s", len(done), took.Round(100*time.Millisecond), last)
	if len(done) < 6 || !strings.Contains(last, wantMiB) || !strings.Contains(last, "done in") {
		t.Fatalf("pty progress: %d growing counts %v, last %q, want ≥ 6 and %s\n%q", len(done), done, last, wantMiB, out)
	}

	// -o json: one parseable line per update, monotonic bytes.
	remove()
	jout, err := exec.Command(ctl, "--control-socket", e.px.ControlSocket, "prepull", image, "-o", "json").Output()
	if err != nil {
		t.Fatalf("prepull -o json: %v\n%s", err, jout)
	}
	var prev int64 = -1
	lines := strings.Split(strings.TrimSpace(string(jout)), "\n")
	var lastP map[string]any
	for _, l := range lines {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("prepull -o json line %q: %v", l, err)
		}
		n, _ := strconv.ParseInt(fmt.Sprint(m["bytes_done"]), 10, 64)
		if n < prev {
			t.Fatalf("bytes_done went back: %d after %d", n, prev)
		}
		prev, lastP = n, m
	}
	if lastP["done"] != true || prev != want || len(lines) < 6 {
		t.Fatalf("prepull -o json: %d lines, last %v, want done with %d bytes", len(lines), lastP, want)
	}
	t.Logf("prepull -o json: %d lines, bytes monotonic, last %d bytes = image size", len(lines), prev)

	// A client that goes away (killed) leaves the pull running.
	remove()
	k := exec.Command(ctl, "--control-socket", e.px.ControlSocket, "prepull", image, "-o", "json")
	kout, _ := k.StdoutPipe()
	if err := k.Start(); err != nil {
		t.Fatal(err)
	}
	_, _ = bufio.NewReader(kout).ReadString('\n')
	_ = k.Process.Kill()
	_ = k.Wait()
	eventually(t, 60*time.Second, "the pull of a killed client finishes", func() error {
		if size() != want {
			return fmt.Errorf("image not there yet")
		}
		return nil
	})

	// Ctrl-C cancels the pull: the image never arrives. The killed
	// client's pull names the image before its last steps (the digest
	// reference) are done; removing it in between let that pull put it
	// back, and the next pull then had nothing to fetch (seen in CI).
	time.Sleep(time.Second)
	remove()
	eventually(t, 10*time.Second, "the image is gone before the pull to cancel", func() error {
		if size() >= 0 {
			remove()
			return fmt.Errorf("image still there")
		}
		return nil
	})
	ci := exec.Command(ctl, "--control-socket", e.px.ControlSocket, "prepull", image, "-o", "json")
	var cerr bytes.Buffer
	ci.Stderr = &cerr
	cout, _ := ci.StdoutPipe()
	if err := ci.Start(); err != nil {
		t.Fatal(err)
	}
	_, _ = bufio.NewReader(cout).ReadString('\n')
	_ = ci.Process.Signal(syscall.SIGINT)
	if err := ci.Wait(); err == nil || !strings.Contains(cerr.String(), "cancelled") {
		t.Fatalf("prepull after Ctrl-C: %v %q", err, cerr.String())
	}
	// Longer than the whole pull took above: a pull that was not
	// cancelled would have brought the image by then.
	time.Sleep(took + 3*time.Second)
	if size() >= 0 {
		t.Fatal("the image arrived after the prepull was cancelled")
	}
	_ = context.Background
}

// testSwapPullProgress: the pull step of `inplacectl swap` shows the same
// progress as prepull (off a terminal, one line per update): byte counts
// that grow to the image's size, then the swap commits. The image is not
// on the node (testPrepull's cancelled pull left it absent).
func testSwapPullProgress(t *testing.T, e *env, p *pod, image string) {
	out, err := e.px.Ctl("swap", p.name, "-n", p.ns, "-c", "app", "--image", image)
	if err != nil {
		t.Fatalf("swap to %s: %v\n%s", image, err, out)
	}
	var counts []float64
	var last string
	for _, line := range strings.Split(out, "\n") {
		if !strings.HasPrefix(line, "  pull ") {
			continue
		}
		if m := progressRe.FindStringSubmatch(line); m != nil {
			v, _ := strconv.ParseFloat(m[1], 64)
			if len(counts) > 0 && v < counts[len(counts)-1] {
				t.Errorf("swap's pull progress went back: %v then %v", counts[len(counts)-1], v)
			}
			counts = append(counts, v)
			last = line
		}
	}
	st, err := e.direct.Image.ImageStatus(ctx(t), &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: image}})
	if err != nil || st.Image == nil {
		t.Fatalf("image %s not on the node after the swap: %v", image, err)
	}
	want := fmt.Sprintf("%.1f/%.1f MiB", float64(st.Image.Size)/(1<<20), float64(st.Image.Size)/(1<<20))
	t.Logf("inplacectl swap: %d pull progress lines; last: %s", len(counts), strings.TrimSpace(last))
	if len(counts) < 5 || counts[0] >= counts[len(counts)-1] || !strings.Contains(last, want) || !strings.Contains(out, "COMMITTED") {
		t.Fatalf("swap's pull progress: %d lines %v, last %q, want ≥ 5 growing to %s and COMMITTED\n%s", len(counts), counts, last, want, out)
	}
}
