package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
	"github.com/inplaced/inplaced/test/bench/report"
	"github.com/inplaced/inplaced/test/harness"
)

// The three ways BenchmarkKubePatch changes a pod's image.
const (
	// kubeCfgInplaced: the pod spec's image patched through the API, kubelet
	// on inplaced in Kubernetes mode (the pull before kubelet's stop).
	kubeCfgInplaced = "patch, kubelet → inplaced"
	// kubeCfgDirect: the same patch, a second kubelet directly on containerd
	// (kubelet's own path: stop, then pull, create, start).
	kubeCfgDirect = "patch, kubelet → containerd"
	// kubeCfgSwap: a node-local `inplacectl swap` of the same pod's
	// container (kubelet on inplaced), which also pulls before it stops.
	kubeCfgSwap = "inplacectl swap (node-local)"
)

// kubeTargets bound, per registry link, the patch with inplaced against
// kubelet on containerd (ratios of medians: stopped → running, and the
// client's gap); kubeTargetVsSwap bounds its client gap against a
// node-local swap.
var kubeTargets = map[string]float64{"100 Mbit/s": 0.05, "1 Gbit/s": 0.3}

const (
	kubeTargetVsSwap = 1.5
	// kubePollEvery is how often the client asks the pod for /version.
	kubePollEvery = 5 * time.Millisecond
	// The pod starts on App2 and is changed to Large (App1 + 100 MiB), so
	// an answer says which container gave it.
	kubeOldBody = "v2"
	kubeNewBody = "v1"
	// kubeResultKey is the results file's key of this benchmark's records:
	// the report package does not know it, and benchdoc skips such lines.
	kubeResultKey = "kube_patch"
	// kubeEnvDoc names the markdown file the benchmark writes
	// (hack/bench.sh sets it to docs/benchmarks-kubernetes.md).
	kubeEnvDoc = "INPLACED_BENCH_KUBE_DOC"
)

// kubeReps is the number of repetitions per configuration and link
// ($INPLACED_BENCH_KUBE_REPS, default 3: a repetition over 100 Mbit/s pulls
// for ~9 s).
func kubeReps() int {
	if n, err := strconv.Atoi(os.Getenv("INPLACED_BENCH_KUBE_REPS")); err == nil && n > 0 {
		return n
	}
	return 3
}

// kubeTrial is one image change of one fresh pod. Durations in ns.
type kubeTrial struct {
	Pod string `json:"pod"`
	// StoppedToRunning: the old container's FinishedAt → the new one's
	// StartedAt, both from containerd.
	StoppedToRunning int64 `json:"stopped_to_running_ns"`
	// ClientGap: the client's first failed request (after the last answer
	// from the old container) → its first answer from the new one; with no
	// failed request, the last old answer → the first new one.
	ClientGap int64 `json:"client_gap_ns"`
	// Failed counts failed requests in the gap, Requests all requests;
	// FailedBefore counts failed requests before the last old answer, and
	// OldAfterNew old answers after the first new one (both should be 0).
	Failed       int `json:"failed"`
	Requests     int `json:"requests"`
	FailedBefore int `json:"failed_before,omitempty"`
	OldAfterNew  int `json:"old_after_new,omitempty"`
	// Errors counts the failed requests by kind (harness.HTTPErrKind's
	// "connection refused", "timeout", ..., or "HTTP 503"), those in the
	// gap and those before.
	Errors       map[string]int `json:"errors,omitempty"`
	ErrorsBefore map[string]int `json:"errors_before,omitempty"`
	// ChangeToNew: the patch (or swap command) issued → the first answer
	// from the new container.
	ChangeToNew int64 `json:"change_to_new_ns"`
	// Pull is the pull's duration: the swap record's pull step (inplaced),
	// or from kubelet's Pulled event (kubelet on containerd).
	Pull int64 `json:"pull_ns"`
	// PullEndedBeforeStop: the old container's FinishedAt − the end of
	// inplaced's pull (> 0: the pull was done while the old one ran).
	PullEndedBeforeStop int64 `json:"pull_ended_before_stop_ns,omitempty"`
	// RecordDowntime is the swap record's downtime_ns (inplaced only).
	RecordDowntime int64  `json:"record_downtime_ns,omitempty"`
	Handoff        string `json:"handoff,omitempty"`
	// Steps are the swap record's step durations (inplaced only).
	Steps map[string]int64 `json:"steps_ns,omitempty"`
}

// kubeCell is one configuration over one link on one backend.
type kubeCell struct {
	Backend string      `json:"backend"`
	Config  string      `json:"config"`
	Link    string      `json:"link"`
	Trials  []kubeTrial `json:"trials"`
	// Load holds the 1-minute load averages sampled (every second) while
	// the cell's repetitions ran, pod setup and teardown included.
	Load []float64 `json:"load"`
	// Foreign is, per repetition, the CPU (in CPUs) that processes outside
	// the benchmark used (report.Conditions.ForeignCPU): the hygiene rule.
	// The load average above includes the benchmark's own kubelet, API
	// server and pulls, which keep a 2-CPU machine above a load of 2.
	Foreign []float64 `json:"foreign_cpu"`
}

// maxForeign is the most CPU other work used during one repetition (-1:
// unknown).
func (c *kubeCell) maxForeign() float64 {
	if c == nil || len(c.Foreign) == 0 {
		return -1
	}
	return slices.Max(c.Foreign)
}

// loadedBy says why a cell's figures cannot be judged ("" when they can).
func (c *kubeCell) loadedBy(ncpu int) string {
	if f := c.maxForeign(); f > report.MaxForeignLoadPerCPU*float64(ncpu) {
		return fmt.Sprintf("other work used %.1f of %d CPUs", f, ncpu)
	}
	return ""
}

func (c *kubeCell) median(f func(kubeTrial) int64) int64 {
	if c == nil {
		return 0
	}
	var v []int64
	for _, t := range c.Trials {
		v = append(v, f(t))
	}
	return report.Median(v)
}

func (c *kubeCell) maxLoad() float64 {
	if c == nil || len(c.Load) == 0 {
		return 0
	}
	return slices.Max(c.Load)
}

// kubeRun is everything the document says.
type kubeRun struct {
	started, finished time.Time
	backends          []kubeBackend
	cells             []*kubeCell

	mu   sync.Mutex
	cur  *kubeCell
	load []float64 // the whole run
}

type kubeBackend struct{ name, version string }

// sample adds the 1-minute load average to the run and the running cell
// every second until stop is closed.
func (r *kubeRun) sample(stop <-chan struct{}) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		if l, err := kubeLoad1(); err == nil {
			r.mu.Lock()
			r.load = append(r.load, l)
			if r.cur != nil {
				r.cur.Load = append(r.cur.Load, l)
			}
			r.mu.Unlock()
		}
		select {
		case <-stop:
			return
		case <-t.C:
		}
	}
}

func (r *kubeRun) setCell(c *kubeCell) {
	r.mu.Lock()
	r.cur = c
	r.mu.Unlock()
}

func kubeLoad1() (float64, error) {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, errors.New("empty /proc/loadavg")
	}
	return strconv.ParseFloat(f[0], 64)
}

// BenchmarkKubePatch measures what a Kubernetes image change costs: a
// pod's image changed through the API (a strategic merge patch, as `kubectl set image` sends)
// from App2 to the ≥ 100 MiB image Large, pulled over the paced 1 Gbit/s and
// 100 Mbit/s registry links, with kubelet on inplaced in Kubernetes mode
// and then with a second kubelet directly on containerd (one kubelet at a
// time: the phases run one after the other), and a node-local `inplacectl
// swap` of the same kind of pod in the inplaced phase. The image is removed
// from the node before every repetition, so every change really pulls.
//
// Downtime is measured two ways: from containerd (old container's
// FinishedAt → new container's StartedAt) and from a client on the node
// asking the pod IP for GET /version every 5 ms with a fresh connection
// (first failed request → first answer "v1" from the new container).
//
// It starts a kubelet: run it under `flock /run/inplaced-kubelet-e2e.lock`
// on a shared machine. With $INPLACED_BENCH_KUBE_DOC set it writes that
// markdown file (docs/benchmarks-kubernetes.md from hack/bench.sh); its
// cells also go to $INPLACED_BENCH_RESULTS under the key "kube_patch".
func BenchmarkKubePatch(b *testing.B) {
	harness.KubeletPrerequisites(b)
	harness.ControlPlanePrerequisites(b)
	run := &kubeRun{started: time.Now()}
	stop, sampled := make(chan struct{}), make(chan struct{})
	go func() { run.sample(stop); close(sampled) }()
	var stopOnce sync.Once
	stopSampling := func() { stopOnce.Do(func() { close(stop); <-sampled }) }
	defer stopSampling()
	cp := harness.StartControlPlane(b)
	benchBackends(b, func(b *testing.B, ctrd *harness.Containerd) {
		e := newKubeBenchEnv(b, run, cp, ctrd)
		e.phaseInplaced(b)
		e.phaseDirect(b)
		for _, c := range run.cells {
			if c.Backend == string(ctrd.Backend) {
				e.appendResult(b, c)
			}
		}
		for _, l := range benchLinks {
			short := strings.ReplaceAll(strings.ReplaceAll(l.name, " ", ""), "bit/s", "bps")
			px, dir, sw := e.cell(kubeCfgInplaced, l.name), e.cell(kubeCfgDirect, l.name), e.cell(kubeCfgSwap, l.name)
			stopped := func(t kubeTrial) int64 { return t.StoppedToRunning }
			gap := func(t kubeTrial) int64 { return t.ClientGap }
			b.ReportMetric(kubeRatio(px.median(stopped), dir.median(stopped)), "patch/kubelet-stopped-"+short)
			b.ReportMetric(kubeRatio(px.median(gap), dir.median(gap)), "patch/kubelet-client-"+short)
			b.ReportMetric(kubeRatio(px.median(gap), sw.median(gap)), "patch/swap-client-"+short)
		}
	})
	run.finished = time.Now()
	stopSampling()
	path := os.Getenv(kubeEnvDoc)
	if path == "" {
		return
	}
	if b.Failed() {
		// A broken run never replaces the measured document.
		path = strings.TrimSuffix(path, ".md") + ".failed.md"
	}
	var buf strings.Builder
	renderKubeDoc(&buf, run)
	if err := os.WriteFile(path, []byte(buf.String()), 0o644); err != nil {
		b.Errorf("write %s: %v", path, err)
		return
	}
	b.Logf("wrote %s", path)
}

func kubeRatio(a, b int64) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// kubeBenchEnv is one backend: its containerd, the control plane, and
// whichever kubelet (and inplaced) the running phase uses.
type kubeBenchEnv struct {
	run    *kubeRun
	cp     *harness.ControlPlane
	ctrd   *harness.Containerd
	direct *harness.CRIClient
	// large removes the large image under all its names (replaceEnv's).
	large *replaceEnv
	ns    string
	seq   int

	// The running phase.
	node string
	px   *harness.Inplaced // nil in the direct phase
	cri  *harness.CRIClient
}

func newKubeBenchEnv(b *testing.B, run *kubeRun, cp *harness.ControlPlane, ctrd *harness.Containerd) *kubeBenchEnv {
	b.Helper()
	e := &kubeBenchEnv{run: run, cp: cp, ctrd: ctrd, direct: ctrd.CRI(b), ns: "default"}
	e.large = &replaceEnv{ctrd: ctrd, direct: e.direct, largeRefs: []string{ctrd.Images.Large}}
	for _, l := range benchLinks {
		e.large.largeRefs = append(e.large.largeRefs, e.largeRef(l))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	v, err := e.direct.Runtime.Version(ctx, &runtimeapi.VersionRequest{})
	if err != nil {
		b.Fatalf("Version: %v", err)
	}
	run.backends = append(run.backends, kubeBackend{string(ctrd.Backend), v.RuntimeName + " " + v.RuntimeVersion})
	for _, img := range []string{ctrd.Images.Pause, ctrd.Images.App2} {
		if _, err := e.direct.Image.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: img}}); err != nil {
			b.Fatalf("PullImage %s: %v", img, err)
		}
	}
	return e
}

func (e *kubeBenchEnv) largeRef(l benchLink) string {
	return l.addr + strings.TrimPrefix(e.ctrd.Images.Large, e.ctrd.Registry.Addr)
}

func (e *kubeBenchEnv) cell(cfg, link string) *kubeCell {
	for _, c := range e.run.cells {
		if c.Backend == string(e.ctrd.Backend) && c.Config == cfg && c.Link == link {
			return c
		}
	}
	c := &kubeCell{Backend: string(e.ctrd.Backend), Config: cfg, Link: link}
	e.run.cells = append(e.run.cells, c)
	return c
}

// phaseInplaced: kubelet on inplaced in Kubernetes mode with the node's own
// credentials; per link, the patch and the node-local swap take turns.
func (e *kubeBenchEnv) phaseInplaced(b *testing.B) {
	b.Helper()
	e.node = "kbpi-" + strconv.FormatInt(time.Now().UnixNano()&0xffffff, 16)
	kubeconfig := e.cp.NodeKubeconfig(b, e.node)
	e.px = harness.StartInplaced(b, e.ctrd.Endpoint)
	if err := e.px.Stop(); err != nil {
		b.Fatal(err)
	}
	// As a node runs it (info level), in Kubernetes mode.
	e.px.ExtraArgs = []string{"--log-level", "info", "--health-min-runtime", replaceMinRuntime.String(),
		"--kubeconfig", kubeconfig, "--node-name", e.node}
	if err := e.px.Start(); err != nil {
		b.Fatalf("inplaced in Kubernetes mode: %v\n%s", err, e.px.LogTail(30))
	}
	e.cri = harness.DialCRI(b, e.px.Endpoint)
	k := e.cp.StartKubelet(b, harness.KubeletOptions{RuntimeEndpoint: e.px.Endpoint, BackendEndpoint: e.ctrd.Endpoint, NodeName: e.node})
	e.cp.WaitNodeReady(b, e.node, 2*time.Minute)
	for _, l := range benchLinks {
		for rep := 0; rep < kubeReps(); rep++ {
			order := []string{kubeCfgInplaced, kubeCfgSwap}
			if rep%2 == 1 {
				order = []string{kubeCfgSwap, kubeCfgInplaced}
			}
			for _, cfg := range order {
				e.trial(b, cfg, l)
			}
		}
	}
	if l := k.LogGrep("name is reserved", "failed to reserve container name"); len(l) > 0 {
		b.Errorf("kubelet raced a swap for a container name: %s", l[0])
	}
	if strings.Contains(e.px.LogTail(1<<30), "panic:") {
		b.Errorf("inplaced panicked:\n%s", e.px.LogTail(40))
	}
	// One kubelet at a time on the machine, and none on inplaced next.
	if err := k.Close(); err != nil {
		b.Fatalf("stop the kubelet on inplaced: %v", err)
	}
	if err := e.px.Stop(); err != nil {
		b.Fatalf("stop inplaced: %v", err)
	}
	e.px = nil
}

// phaseDirect: a second kubelet (another Node) directly on containerd.
func (e *kubeBenchEnv) phaseDirect(b *testing.B) {
	b.Helper()
	e.node = "kbpd-" + strconv.FormatInt(time.Now().UnixNano()&0xffffff, 16)
	e.cri = e.direct
	k := e.cp.StartKubelet(b, harness.KubeletOptions{RuntimeEndpoint: e.ctrd.Endpoint, NodeName: e.node})
	e.cp.WaitNodeReady(b, e.node, 2*time.Minute)
	for _, l := range benchLinks {
		for rep := 0; rep < kubeReps(); rep++ {
			e.trial(b, kubeCfgDirect, l)
		}
	}
	if err := k.Close(); err != nil {
		b.Fatalf("stop the kubelet on containerd: %v", err)
	}
}

// trial changes the image of a fresh pod on App2 to Large over link, one
// of three ways, and records what it measured in the cell.
func (e *kubeBenchEnv) trial(b *testing.B, cfg string, link benchLink) {
	b.Helper()
	cell := e.cell(cfg, link.name)
	e.run.setCell(cell)
	defer e.run.setCell(nil)
	sampler := startLoadSampler()
	defer func() { cell.Foreign = append(cell.Foreign, sampler.finish().ForeignCPU) }()
	e.seq++
	// Unique in the run: events outlive their pod, and pulled reads them.
	name := fmt.Sprintf("%s-%d", e.node, e.seq)
	ref := e.largeRef(link)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	e.large.removeImage(b, ctx, e.ctrd.Images.Large)

	pod := e.createPod(b, ctx, name)
	defer e.deletePod(b, pod)
	oldID := kubeAppID(pod)
	poll := harness.StartHTTPPoll(fmt.Sprintf("http://%s:%d/version", pod.Status.PodIP, harness.AppPort), kubePollEvery, kubeOldBody, kubeNewBody)
	defer poll.Stop()
	if err := poll.Wait(kubeOldBody, 30*time.Second); err != nil {
		b.Fatalf("%s: the client never got %q from the pod at %s: %v", name, kubeOldBody, pod.Status.PodIP, err)
	}
	began := time.Now()
	var rec *inplacedv1.SwapRecord
	var newID string
	if cfg == kubeCfgSwap {
		rec = e.localSwap(b, oldID, ref)
		newID = rec.NewContainerId
	} else {
		e.setImage(b, ctx, name, ref)
	}
	if err := poll.Wait(kubeNewBody, 4*time.Minute); err != nil {
		b.Fatalf("%s: no answer %q from the new container: %v\n%s", name, kubeNewBody, err, e.diag())
	}
	// A little more, to see the old container does not answer again.
	time.Sleep(100 * time.Millisecond)
	samples := poll.Stop()
	tr := kubeTrial{Pod: name}
	if err := kubeGap(samples, began, &tr); err != nil {
		b.Fatalf("%s: %v", name, err)
	}
	if cfg != kubeCfgSwap {
		after := e.cp.WaitPod(b, e.ns, name, 2*time.Minute, func(p *corev1.Pod) error {
			s := kubeAppStatus(p)
			if s == nil || kubeCRIID(s) == oldID || s.State.Running == nil || !s.Ready || s.RestartCount != 1 || s.Image != ref {
				return fmt.Errorf("want %s running and ready at restartCount 1 instead of %s; status %+v", ref, oldID, s)
			}
			return nil
		})
		newID = kubeAppID(after)
	}
	oldSt, newSt := e.status(b, ctx, oldID), e.status(b, ctx, newID)
	if oldSt.FinishedAt == 0 || newSt.StartedAt == 0 {
		b.Fatalf("%s: old finished at %d, new started at %d", name, oldSt.FinishedAt, newSt.StartedAt)
	}
	tr.StoppedToRunning = newSt.StartedAt - oldSt.FinishedAt
	if cfg == kubeCfgInplaced {
		rec = e.kubeletSwap(b, name, oldID, newID)
	}
	if rec != nil {
		tr.RecordDowntime, tr.Handoff, tr.Steps = rec.DowntimeNs, rec.Handoff, map[string]int64{}
		for _, s := range rec.Steps {
			tr.Steps[s.Name] = s.DurationNs
			if s.Name == "pull" {
				tr.Pull = s.DurationNs
				tr.PullEndedBeforeStop = oldSt.FinishedAt - (s.StartedUnixNano + s.DurationNs)
			}
		}
		if tr.PullEndedBeforeStop <= 0 {
			b.Errorf("%s (%s): the pull ended %s after the old container stopped", name, cfg, time.Duration(-tr.PullEndedBeforeStop))
		}
	} else {
		tr.Pull = e.pulled(b, pod, ref)
	}
	// The image was removed before: a pull that took less than half the
	// link's time for the big layer did not fetch it.
	if least := kubeLinkTime(link.name) / 2; time.Duration(tr.Pull) < least {
		b.Fatalf("%s (%s): the pull took %s, less than half of the %s the large layer needs over %s: not really pulled",
			name, cfg, time.Duration(tr.Pull), 2*least, link.name)
	}
	cell.Trials = append(cell.Trials, tr)
	b.Logf("%s over %s (%s): stopped→running %s, client gap %s (%d failed of %d requests), pull %s, change→new %s",
		cfg, link.name, name, time.Duration(tr.StoppedToRunning).Round(time.Microsecond), time.Duration(tr.ClientGap).Round(time.Microsecond),
		tr.Failed, tr.Requests, time.Duration(tr.Pull).Round(time.Millisecond), time.Duration(tr.ChangeToNew).Round(time.Millisecond))
}

// kubeLinkTime is how long the large layer takes over the named link.
func kubeLinkTime(name string) time.Duration {
	for _, l := range replaceLinks {
		if l.name == name {
			return time.Duration(float64(harness.LargeFileSize) * 8 / float64(l.bitsPerSec) * float64(time.Second))
		}
	}
	return 0
}

func (e *kubeBenchEnv) diag() string {
	s := "pod events: " + strings.Join(e.events(e.ns), "; ")
	if e.px != nil {
		s += "\ninplaced log:\n" + e.px.LogTail(30)
	}
	return s
}

func (e *kubeBenchEnv) events(ns string) []string {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := e.cp.Admin.CoreV1().Events(ns).List(c, metav1.ListOptions{})
	if err != nil {
		return []string{err.Error()}
	}
	var out []string
	for _, ev := range l.Items {
		out = append(out, fmt.Sprintf("%s %s: %s", ev.InvolvedObject.Name, ev.Reason, ev.Message))
	}
	return out
}

// createPod creates a bare pod on App2 bound to the phase's node and
// waits until it is Ready with an IP.
func (e *kubeBenchEnv) createPod(b *testing.B, ctx context.Context, name string) *corev1.Pod {
	b.Helper()
	no := false
	grace := int64(5)
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns, Labels: map[string]string{"app": name}},
		Spec: corev1.PodSpec{
			NodeName: e.node, AutomountServiceAccountToken: &no, TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{Name: "app", Image: e.ctrd.Images.App2, ImagePullPolicy: corev1.PullIfNotPresent}},
		},
	}
	if _, err := e.cp.Admin.CoreV1().Pods(e.ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
		b.Fatalf("create pod %s: %v", name, err)
	}
	return e.cp.WaitPod(b, e.ns, name, 2*time.Minute, func(p *corev1.Pod) error {
		if p == nil || p.Status.PodIP == "" {
			return errors.New("no pod IP yet")
		}
		if s := kubeAppStatus(p); s == nil || !s.Ready || s.State.Running == nil {
			return fmt.Errorf("app not running and ready: %+v", s)
		}
		return nil
	})
}

// deletePod deletes the pod as a user would (its grace period), waits until
// kubelet has finished it, and removes its sandbox through kubelet's CRI
// endpoint, so that no container holds the large image's layers.
func (e *kubeBenchEnv) deletePod(b *testing.B, p *corev1.Pod) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := e.cp.Admin.CoreV1().Pods(e.ns).Delete(ctx, p.Name, metav1.DeleteOptions{}); err != nil {
		b.Errorf("delete pod %s: %v", p.Name, err)
		return
	}
	e.cp.WaitPod(b, e.ns, p.Name, 2*time.Minute, harness.PodGone)
	resp, err := e.cri.Runtime.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{Filter: &runtimeapi.PodSandboxFilter{
		LabelSelector: map[string]string{"io.kubernetes.pod.uid": string(p.UID)}}})
	if err != nil {
		b.Fatalf("ListPodSandbox: %v", err)
	}
	for _, sb := range resp.Items {
		if _, err := e.cri.Runtime.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: sb.Id}); err != nil {
			b.Fatalf("StopPodSandbox %s: %v", sb.Id, err)
		}
		if _, err := e.cri.Runtime.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sb.Id}); err != nil {
			b.Fatalf("RemovePodSandbox %s: %v", sb.Id, err)
		}
	}
}

// setImage patches the container's image as `kubectl set image` does.
func (e *kubeBenchEnv) setImage(b *testing.B, ctx context.Context, pod, image string) {
	b.Helper()
	patch := fmt.Sprintf(`{"spec":{"containers":[{"name":"app","image":%q}]}}`, image)
	if _, err := e.cp.Admin.CoreV1().Pods(e.ns).Patch(ctx, pod, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		b.Fatalf("patch %s image %s: %v", pod, image, err)
	}
}

func (e *kubeBenchEnv) localSwap(b *testing.B, oldID, image string) *inplacedv1.SwapRecord {
	b.Helper()
	out, err := e.px.Ctl("swap", "--id", oldID, "--image", image, "--min-runtime", replaceMinRuntime.String(), "-o", "json")
	if err != nil {
		b.Fatalf("swap: %v\n%s\ninplaced log:\n%s", err, out, e.px.LogTail(30))
	}
	var r inplacedv1.SwapRecord
	i := strings.Index(out, "{")
	if i < 0 {
		b.Fatalf("swap: no record in the output:\n%s", out)
	}
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal([]byte(out[i:]), &r); err != nil {
		b.Fatalf("decode swap record: %v\n%s", err, out)
	}
	if r.State != inplacedv1.SwapState_SWAP_STATE_COMMITTED || r.NewContainerId == "" {
		b.Fatalf("swap %s: %s", r.State, r.Error)
	}
	return &r
}

// kubeletSwap waits for the kubelet-driven swap record of the pod's change
// from oldID to newID to commit.
func (e *kubeBenchEnv) kubeletSwap(b *testing.B, pod, oldID, newID string) *inplacedv1.SwapRecord {
	b.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var last string
	for {
		out, err := e.px.Ctl("swaps", "-o", "json")
		if err != nil {
			b.Fatalf("inplacectl swaps: %v\n%s", err, out)
		}
		var l inplacedv1.ListSwapsResponse
		if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal([]byte(out), &l); err != nil {
			b.Fatalf("decode swaps: %v\n%s", err, out)
		}
		var recs []string
		for _, r := range l.Swaps {
			if r.Pod != pod || r.Kind != "kubelet" {
				continue
			}
			recs = append(recs, fmt.Sprintf("%s %s old %s new %s running %s handoff %q: %s", r.Id, r.State, r.OldContainerId, r.NewContainerId, r.RunningContainerId, r.Handoff, r.Error))
			if r.State == inplacedv1.SwapState_SWAP_STATE_COMMITTED && r.OldContainerId == oldID && r.RunningContainerId == newID {
				return r
			}
		}
		last = strings.Join(recs, "\n")
		if time.Now().After(deadline) {
			b.Fatalf("no committed kubelet-driven swap of %s from %s to %s (the patch did not go in place); records:\n%s\ninplaced log:\n%s",
				pod, oldID, newID, last, e.px.LogTail(40))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// pulled reads kubelet's Pulled event for image on the pod: its pull time
// (`Successfully pulled image "…" in 9.1s (…)`). An image that was already
// present ("already present on machine") fails the benchmark.
func (e *kubeBenchEnv) pulled(b *testing.B, p *corev1.Pod, image string) int64 {
	b.Helper()
	pod := p.Name
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		l, err := e.cp.Admin.CoreV1().Events(e.ns).List(c, metav1.ListOptions{FieldSelector: "involvedObject.uid=" + string(p.UID) + ",reason=Pulled"})
		cancel()
		if err == nil {
			for _, ev := range l.Items {
				if !strings.Contains(ev.Message, image) {
					continue
				}
				_, rest, ok := strings.Cut(ev.Message, `" in `)
				if !ok {
					b.Fatalf("%s: kubelet did not pull %s: %s", pod, image, ev.Message)
				}
				if d, err := time.ParseDuration(strings.Fields(rest)[0]); err == nil {
					return int64(d)
				}
				b.Fatalf("%s: cannot read the pull time in %q", pod, ev.Message)
			}
		}
		if time.Now().After(deadline) {
			b.Fatalf("%s: no Pulled event for %s (%v): %s", pod, image, err, strings.Join(e.events(e.ns), "; "))
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func (e *kubeBenchEnv) status(b *testing.B, ctx context.Context, id string) *runtimeapi.ContainerStatus {
	b.Helper()
	st, err := e.direct.Runtime.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id})
	if err != nil {
		b.Fatalf("ContainerStatus %s: %v", id, err)
	}
	return st.Status
}

// appendResult writes a cell to the results file the other benchmarks use,
// as a line of its own key (report.Record has no field for it).
func (e *kubeBenchEnv) appendResult(b *testing.B, c *kubeCell) {
	b.Helper()
	path := os.Getenv(report.EnvResults)
	if path == "" {
		return
	}
	line, err := json.Marshal(map[string]any{"time": time.Now().UTC(), kubeResultKey: c})
	if err != nil {
		b.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		b.Fatalf("write results: %v", err)
	}
	if _, err := f.Write(append(line, '\n')); err != nil {
		b.Errorf("write results: %v", err)
	}
	if err := f.Close(); err != nil {
		b.Errorf("write results: %v", err)
	}
}

func kubeAppStatus(p *corev1.Pod) *corev1.ContainerStatus {
	if p == nil {
		return nil
	}
	for i := range p.Status.ContainerStatuses {
		if p.Status.ContainerStatuses[i].Name == "app" {
			return &p.Status.ContainerStatuses[i]
		}
	}
	return nil
}

func kubeCRIID(s *corev1.ContainerStatus) string {
	_, id, _ := strings.Cut(s.ContainerID, "://")
	return id
}

func kubeAppID(p *corev1.Pod) string {
	if s := kubeAppStatus(p); s != nil {
		return kubeCRIID(s)
	}
	return ""
}

// kubeGap fills tr's client-side figures from the samples of a change that
// began at began.
func kubeGap(samples []harness.HTTPSample, began time.Time, tr *kubeTrial) error {
	iNew := slices.IndexFunc(samples, func(s harness.HTTPSample) bool { return s.Body == kubeNewBody })
	if iNew < 0 {
		return errors.New("no answer from the new container")
	}
	iOld := -1
	for i := iNew - 1; i >= 0; i-- {
		if samples[i].Body == kubeOldBody {
			iOld = i
			break
		}
	}
	if iOld < 0 {
		return errors.New("no answer from the old container before the new one's")
	}
	tr.Requests = len(samples)
	for i, s := range samples {
		switch {
		case s.Body == "" && i < iOld:
			tr.FailedBefore++
			kubeCount(&tr.ErrorsBefore, s.Err)
		case s.Body == "" && i > iOld && i < iNew:
			tr.Failed++
			kubeCount(&tr.Errors, s.Err)
		case s.Body == kubeOldBody && i > iNew:
			tr.OldAfterNew++
		}
	}
	from := samples[iOld].End
	if tr.Failed > 0 {
		from = samples[iOld+1].Start
	}
	tr.ClientGap = int64(samples[iNew].End.Sub(from))
	tr.ChangeToNew = int64(samples[iNew].End.Sub(began))
	return nil
}

func kubeCount(m *map[string]int, k string) {
	if *m == nil {
		*m = map[string]int{}
	}
	(*m)[k]++
}

// kubeFmtCounts is "connection refused 80, timeout 3".
func kubeFmtCounts(m map[string]int) string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(out, ", ")
}

// renderKubeDoc writes docs/benchmarks-kubernetes.md.
func renderKubeDoc(w *strings.Builder, r *kubeRun) {
	ncpu := runtime.NumCPU()
	host, _ := os.Hostname()
	fmt.Fprintf(w, "# Benchmarks: Kubernetes mode (image patch)\n\n")
	fmt.Fprintf(w, "Written by `BenchmarkKubePatch` (`test/bench/kube_bench_test.go`) when `$%s` names this file "+
		"(`hack/bench.sh` sets it: `BENCH=KubePatch hack/bench.sh`); do not edit by hand. "+
		"The rest of `make bench` is in [benchmarks.md](benchmarks.md).\n\n", kubeEnvDoc)
	fmt.Fprintf(w, "## Machine and run\n\n| | |\n|---|---|\n")
	fmt.Fprintf(w, "| Host | `%s`: %s, %d CPUs, kernel %s |\n", host, kubeProcField("/proc/cpuinfo", "model name"), ncpu, kubeKernel())
	fmt.Fprintf(w, "| Go | %s |\n", runtime.Version())
	for _, be := range r.backends {
		fmt.Fprintf(w, "| Backend `%s` | %s, runc, CNI bridge |\n", be.name, be.version)
	}
	fmt.Fprintf(w, "| Kubernetes | kube-apiserver %s + etcd %s on loopback (Node,RBAC, NodeRestriction), kubelet %s registered as a Node |\n",
		harness.KubeAPIServerVersion, harness.EtcdVersion, harness.KubeletVersion)
	fmt.Fprintf(w, "| inplaced | commit `%s`, `--log-level info --health-min-runtime %s --kubeconfig <node's own> --node-name <node>` |\n", kubeCommit(), replaceMinRuntime)
	fmt.Fprintf(w, "| Run | %s → %s UTC (%s) |\n", r.started.UTC().Format("2006-01-02 15:04:05"), r.finished.UTC().Format("15:04:05"),
		r.finished.Sub(r.started).Round(time.Second))
	if len(r.load) > 0 {
		fmt.Fprintf(w, "| 1-min load average during the run | %s (every second; %d CPUs) |\n", kubeLoadRange(r.load), ncpu)
	}
	fmt.Fprintf(w, "| Repetitions | %d per configuration, link and backend |\n", kubeReps())
	fmt.Fprintf(w, "| Command | `go test ./test/bench/ %s` |\n\n", strings.Join(kubeTestFlags(), " "))
	loaded := false
	for _, c := range r.cells {
		loaded = loaded || c.loadedBy(ncpu) != ""
	}
	if loaded {
		fmt.Fprintf(w, "**The machine was loaded**: other work used more than %.0f%% of its %d CPUs during some repetitions (other engineers' "+
			"builds and tests shared it). Ratios from such cells are shown but marked *unreliable* instead of judged.\n\n", report.MaxForeignLoadPerCPU*100, ncpu)
	}
	fmt.Fprintf(w, "## What was measured\n\n")
	fmt.Fprintf(w, "A bare pod (`spec.nodeName` set, `terminationGracePeriodSeconds: 5`) runs App2, whose `GET :8080/version` answers `%s`. "+
		"Its image is changed to Large (App1, answering `%s`, plus a %d MiB layer of random data) pulled from a paced registry link "+
		"(`harness.Registry.StartLink`: %s). Before every repetition the large image is removed from the node under all its names "+
		"(CRI RemoveImage, after the previous pod and its sandbox are gone; the run checks the 100 MiB blob left containerd's content store), "+
		"so every change pulls it. Every repetition is a fresh pod. Three configurations, the kubelets one after the other (never two at once):\n\n",
		kubeOldBody, kubeNewBody, harness.LargeFileSize>>20, kubeLinkNames())
	fmt.Fprintf(w, "- **%s**: the pod spec's image patched through the API (strategic merge patch, as `kubectl set image`), "+
		"kubelet on inplaced in Kubernetes mode with the node's own credentials: inplaced pulls first and holds kubelet's StopContainer until the pull is done.\n", kubeCfgInplaced)
	fmt.Fprintf(w, "- **%s**: the same patch with a second kubelet (another Node) whose `containerRuntimeEndpoint` is containerd, no inplaced: "+
		"kubelet's own path, StopContainer, then PullImage, CreateContainer, StartContainer.\n", kubeCfgDirect)
	fmt.Fprintf(w, "- **%s**: `inplacectl swap --id <old> --image <Large over the link> --min-runtime %s` on the same kind of pod, "+
		"in the inplaced phase (also pulls before it stops); it takes turns with the patch.\n\n", kubeCfgSwap, replaceMinRuntime)
	fmt.Fprintf(w, "Downtime, two ways:\n\n")
	fmt.Fprintf(w, "- **(a) stopped → running**: the old container's `FinishedAt` to the new container's `StartedAt`, both from containerd.\n")
	fmt.Fprintf(w, "- **(b) client gap**: a client on the node asks the pod IP for `/version` every %s, each on a fresh connection (1 s timeout): "+
		"from its first failed request after the last `%s` to its first `%s`. Its resolution is the poll period plus a request's time.\n\n",
		kubePollEvery, kubeOldBody, kubeNewBody)
	fmt.Fprintf(w, "inplaced's swap record has a `downtime_ns` of its own (the swap's definition): from its StopContainer of the old container *returning* "+
		"to StartContainer of the new one returning. It leaves out the tail of the stop — from the old process's exit (`FinishedAt`) until containerd "+
		"answers the StopContainer — which the client does see; (a) and (b) include it for every configuration alike.\n\n")
	fmt.Fprintf(w, "Figures are medians; the load column is the 1-minute load average sampled every second while the cell's repetitions ran "+
		"(min–median–max), the benchmark's own kubelet, API server, containerd and pulls included; *other work* is the CPU time, in CPUs, "+
		"that processes outside the benchmark used during a repetition (machine busy time from `/proc/stat` minus the test binary's process tree). "+
		"A ratio is judged only when other work stayed at or below %.0f%% of the CPUs in every repetition of both its cells.\n\n", report.MaxForeignLoadPerCPU*100)

	for _, be := range r.backends {
		fmt.Fprintf(w, "## %s\n\n", be.name)
		fmt.Fprintf(w, "| Ratio | Link | Measured | Target | Result |\n|---|---|--:|--:|---|\n")
		for _, link := range kubeLinkOrder() {
			px, dir, sw := r.find(be.name, kubeCfgInplaced, link), r.find(be.name, kubeCfgDirect, link), r.find(be.name, kubeCfgSwap, link)
			t := kubeTargets[link]
			rows := []struct {
				what   string
				a, b   *kubeCell
				f      func(kubeTrial) int64
				target float64
			}{
				{"(a) stopped → running: patch with inplaced ÷ kubelet on containerd", px, dir, func(t kubeTrial) int64 { return t.StoppedToRunning }, t},
				{"(b) client gap: patch with inplaced ÷ kubelet on containerd", px, dir, func(t kubeTrial) int64 { return t.ClientGap }, t},
				{"(b) client gap: patch with inplaced ÷ node-local swap", px, sw, func(t kubeTrial) int64 { return t.ClientGap }, kubeTargetVsSwap},
			}
			for _, row := range rows {
				if row.a == nil || row.b == nil || len(row.a.Trials) == 0 || len(row.b.Trials) == 0 {
					fmt.Fprintf(w, "| %s | %s | – | ≤ %g× | not measured |\n", row.what, link, row.target)
					continue
				}
				q := kubeRatio(row.a.median(row.f), row.b.median(row.f))
				var verdict string
				switch {
				case row.a.loadedBy(ncpu) != "" || row.b.loadedBy(ncpu) != "":
					verdict = fmt.Sprintf("unreliable (%s)", strings.TrimPrefix(row.a.loadedBy(ncpu)+"; "+row.b.loadedBy(ncpu), "; "))
				case row.a.maxForeign() < 0 || row.b.maxForeign() < 0:
					verdict = "unreliable (other work's CPU not measured)"
				case q <= row.target:
					verdict = "pass"
				default:
					verdict = "**FAIL**"
				}
				fmt.Fprintf(w, "| %s | %s | %s | ≤ %g× | %s |\n", row.what, link, kubeFmtRatio(q), row.target, verdict)
			}
		}
		fmt.Fprintf(w, "\n| Link | Configuration | (a) stopped → running | (b) client gap | Failed requests in the gap | Pull | Pull done before the old stopped by | Change → first new answer | Load during the cell | Other work (max) |\n")
		fmt.Fprintf(w, "|---|---|--:|--:|--:|--:|--:|--:|---|--:|\n")
		for _, link := range kubeLinkOrder() {
			for _, cfg := range []string{kubeCfgInplaced, kubeCfgDirect, kubeCfgSwap} {
				c := r.find(be.name, cfg, link)
				if c == nil || len(c.Trials) == 0 {
					continue
				}
				before := "–"
				if cfg != kubeCfgDirect {
					before = kubeFmtDur(c.median(func(t kubeTrial) int64 { return t.PullEndedBeforeStop }))
				}
				fmt.Fprintf(w, "| %s | %s | %s | %s | %d | %s | %s | %s | %s | %.2f CPU |\n", link, cfg,
					kubeFmtDur(c.median(func(t kubeTrial) int64 { return t.StoppedToRunning })),
					kubeFmtDur(c.median(func(t kubeTrial) int64 { return t.ClientGap })),
					c.median(func(t kubeTrial) int64 { return int64(t.Failed) }),
					kubeFmtDur(c.median(func(t kubeTrial) int64 { return t.Pull })), before,
					kubeFmtDur(c.median(func(t kubeTrial) int64 { return t.ChangeToNew })), kubeLoadRange(c.Load), c.maxForeign())
			}
		}
		fmt.Fprintf(w, "\nEvery repetition (a / b, in the order they ran; in brackets inplaced's swap record: its `downtime_ns` and its `stop-old` step):\n\n")
		fmt.Fprintf(w, "| Link | Configuration | Repetitions |\n|---|---|---|\n")
		for _, link := range kubeLinkOrder() {
			for _, cfg := range []string{kubeCfgInplaced, kubeCfgDirect, kubeCfgSwap} {
				c := r.find(be.name, cfg, link)
				if c == nil {
					continue
				}
				var reps []string
				for _, t := range c.Trials {
					s := kubeFmtDur(t.StoppedToRunning) + " / " + kubeFmtDur(t.ClientGap)
					if t.RecordDowntime > 0 {
						s += " [" + kubeFmtDur(t.RecordDowntime) + "; stop-old " + kubeFmtDur(t.Steps["stop-old"]) + "]"
					}
					if len(t.Errors) > 0 {
						s += " (gap: " + kubeFmtCounts(t.Errors) + ")"
					}
					if t.FailedBefore > 0 || t.OldAfterNew > 0 {
						s += fmt.Sprintf(" (%d failed requests while the old container should still have answered: %s; %d old answers after the new)",
							t.FailedBefore, kubeFmtCounts(t.ErrorsBefore), t.OldAfterNew)
					}
					reps = append(reps, s)
				}
				fmt.Fprintf(w, "| %s | %s | %s |\n", link, cfg, strings.Join(reps, ", "))
			}
		}
		w.WriteString("\n")
	}
}

// kubeTestFlags are the test binary's -test.run/bench/benchtime/timeout
// flags, as the go command passed them.
func kubeTestFlags() []string {
	var out []string
	for _, a := range os.Args[1:] {
		for _, f := range []string{"-test.run=", "-test.bench=", "-test.benchtime=", "-test.timeout="} {
			if strings.HasPrefix(a, f) {
				out = append(out, a)
			}
		}
	}
	return out
}

func (r *kubeRun) find(be, cfg, link string) *kubeCell {
	for _, c := range r.cells {
		if c.Backend == be && c.Config == cfg && c.Link == link {
			return c
		}
	}
	return nil
}

// kubeLinkOrder: the slow link first, the one the issue is about.
func kubeLinkOrder() []string {
	var out []string
	for _, l := range replaceLinks {
		out = append([]string{l.name}, out...)
	}
	return out
}

func kubeLinkNames() string {
	var out []string
	for _, l := range kubeLinkOrder() {
		out = append(out, fmt.Sprintf("%s, %s for the large layer", l, kubeLinkTime(l).Round(100*time.Millisecond)))
	}
	return strings.Join(out, "; ")
}

func kubeFmtDur(ns int64) string {
	d := time.Duration(ns)
	switch {
	case d == 0:
		return "0"
	case d.Abs() >= 10*time.Second:
		return fmt.Sprintf("%.1f s", d.Seconds())
	case d.Abs() >= time.Second:
		return fmt.Sprintf("%.2f s", d.Seconds())
	case d.Abs() >= time.Millisecond:
		return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
	default:
		return fmt.Sprintf("%.0f µs", float64(d)/float64(time.Microsecond))
	}
}

func kubeFmtRatio(q float64) string {
	if q < 0.1 {
		return fmt.Sprintf("%.3f×", q)
	}
	return fmt.Sprintf("%.2f×", q)
}

func kubeLoadRange(l []float64) string {
	if len(l) == 0 {
		return "–"
	}
	s := slices.Clone(l)
	slices.Sort(s)
	return fmt.Sprintf("%.1f–%.1f–%.1f", s[0], s[len(s)/2], s[len(s)-1])
}

func kubeProcField(path, key string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "?"
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v)
		}
	}
	return "?"
}

func kubeKernel() string {
	b, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(string(b))
}

// kubeCommit is the commit measured, "+changes" when pkg/ or cmd/ differ
// from it (as hack/bench.sh says it).
func kubeCommit() string {
	out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	c := strings.TrimSpace(string(out))
	if exec.Command("git", "diff", "--quiet", "HEAD", "--", "../../pkg", "../../cmd").Run() != nil {
		c += "+changes"
	}
	return c
}
