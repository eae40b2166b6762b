package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/test/bench/report"
	"github.com/inplaced/inplaced/test/harness"
)

// replaceReps is the least number of repetitions of each method per image
// ($INPLACED_BENCH_REPS overrides it; more run when -benchtime asks).
func replaceReps() int {
	if n, err := strconv.Atoi(os.Getenv("INPLACED_BENCH_REPS")); err == nil && n > 0 {
		return n
	}
	return 5
}

// replaceLinks are the network links the large image is also pulled over
// (harness.Registry.StartLink paces the registry's answers): the loopback
// registry pulls 100 MiB in about half a second, faster than any node's
// network, and the kubelet-style replacement's downtime is mostly that pull.
// The targets are judged on loopback; the links say what a node sees.
var replaceLinks = []struct {
	name       string
	bitsPerSec int64
}{
	{"1 Gbit/s", 1_000_000_000},
	{"100 Mbit/s", 100_000_000},
}

// replaceMinRuntime is the swaps' health gate. It runs after the new
// container is started, outside the downtime, so it only needs to be short.
const replaceMinRuntime = 200 * time.Millisecond

// replaceEnv is one backend with inplaced in front of it.
type replaceEnv struct {
	ctrd   *harness.Containerd
	px     *harness.Inplaced
	direct *harness.CRIClient
	proxy  *harness.CRIClient
	seq    int
	// oneBatch: inplaced runs with the one-batch release (restartProxy).
	oneBatch bool
	// largeRefs name the large image in the registry and over each link:
	// one image, one 100 MiB blob.
	largeRefs []string
}

// BenchmarkReplace measures how long a container name has nothing running
// while its container is replaced by a new image, three ways, each from the
// old container stopped (its StopContainer returned) until StartContainer of
// the new one returned:
//
//   - swap: `inplacectl swap --id ... --image ...`, its record's downtime_ns
//     (inplaced pulls and creates the new container before it stops the old);
//   - kubelet: what kubelet does when a pod's image changes: StopContainer,
//     then PullImage, CreateContainer (attempt 1), StartContainer;
//   - recreate: a new pod: StopContainer, then StopPodSandbox,
//     RemovePodSandbox, RunPodSandbox (new netns, CNI ADD), CreateContainer,
//     StartContainer, with the image already on the node.
//
// Before each swap and kubelet repetition the new image is removed from the
// node (CRI RemoveImage), so both really pull it. Each repetition uses a fresh
// pod running App1; the methods take turns in a rotating order. The small
// image is App2, the large one App1 plus a 100 MiB random layer.
func BenchmarkReplace(b *testing.B) {
	benchBackends(b, func(b *testing.B, ctrd *harness.Containerd) {
		e := &replaceEnv{ctrd: ctrd, px: startBenchProxy(b, ctrd.Endpoint, replaceMinRuntime), direct: ctrd.CRI(b)}
		e.proxy = harness.DialCRI(b, e.px.Endpoint)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		for _, img := range []string{ctrd.Images.Pause, ctrd.Images.App1} {
			if _, err := e.direct.Image.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: img}}); err != nil {
				b.Fatalf("PullImage %s: %v", img, err)
			}
		}
		images := []struct{ name, ref string }{{"App2", ctrd.Images.App2}, {"Large", ctrd.Images.Large}}
		e.largeRefs = []string{ctrd.Images.Large}
		for _, l := range benchLinks {
			ref := l.addr + strings.TrimPrefix(ctrd.Images.Large, ctrd.Registry.Addr)
			images = append(images, struct{ name, ref string }{"Large over " + l.name, ref})
			e.largeRefs = append(e.largeRefs, ref)
		}
		for _, img := range images {
			b.Run(img.name, func(b *testing.B) {
				methods := []string{report.MethodSwap, report.MethodKubelet, report.MethodRecreate}
				res := map[string]*report.Downtime{}
				for _, m := range methods {
					res[m] = &report.Downtime{Backend: string(ctrd.Backend), Image: img.name, Method: m, Pulled: m != report.MethodRecreate}
				}
				rep := 0
				one := func() {
					for k := range methods {
						m := methods[(rep+k)%len(methods)]
						d, steps := e.trial(b, m, img.ref)
						res[m].Samples = append(res[m].Samples, int64(d))
						res[m].Steps = append(res[m].Steps, steps)
					}
					rep++
				}
				for b.Loop() {
					one()
				}
				for rep < replaceReps() {
					one()
				}
				for _, m := range methods {
					mustAppend(b, report.Record{Downtime: res[m]})
				}
				med := func(m string) float64 { return float64(report.Median(res[m].Samples)) }
				b.ReportMetric(med(report.MethodSwap), "ns/op")
				b.ReportMetric(med(report.MethodSwap)/1e6, "swap-ms")
				b.ReportMetric(med(report.MethodKubelet)/1e6, "kubelet-ms")
				b.ReportMetric(med(report.MethodRecreate)/1e6, "recreate-ms")
				b.ReportMetric(med(report.MethodSwap)/med(report.MethodKubelet), "swap/kubelet")
				b.ReportMetric(med(report.MethodSwap)/med(report.MethodRecreate), "swap/recreate")
			})
		}
	})
}

// trial runs one repetition of method with a fresh pod and removes the pod
// afterwards. It returns the downtime and per-step durations.
func (e *replaceEnv) trial(b *testing.B, method, image string) (time.Duration, map[string]int64) {
	b.Helper()
	e.seq++
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if method != report.MethodRecreate {
		e.removeImage(b, ctx, image)
	} else if _, err := e.direct.Image.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: image}}); err != nil {
		b.Fatalf("PullImage %s: %v", image, err)
	}
	// A swap needs the pod made through inplaced, which records its configs.
	cri := e.direct
	if method == report.MethodSwap {
		cri = e.proxy
	}
	p := newKubePodConfig(b, fmt.Sprintf("rp-%s-%d", method, e.seq))
	if err := p.run(ctx, cri); err != nil {
		b.Fatal(err)
	}
	defer func() {
		if err := p.remove(cri); err != nil {
			b.Errorf("remove pod: %v", err)
		}
	}()
	oldID, err := p.start(ctx, cri, p.kubeContainerConfig("app", e.ctrd.Images.App1, 0))
	if err != nil {
		b.Fatal(err)
	}
	var d time.Duration
	var steps map[string]int64
	switch method {
	case report.MethodSwap:
		d, steps = e.swap(b, oldID, image)
	case report.MethodKubelet:
		d, steps = e.kubelet(b, ctx, p, oldID, image)
	case report.MethodRecreate:
		d, steps = e.recreate(b, ctx, p, oldID, image)
	}
	b.Logf("%s %s: %s", method, image, d.Round(time.Microsecond))
	return d, steps
}

// removeImage removes image from the node, so that the next use pulls it.
// The large image goes under all its names: its layer is content of each.
func (e *replaceEnv) removeImage(b *testing.B, ctx context.Context, image string) {
	b.Helper()
	names := []string{image}
	large := slices.Contains(e.largeRefs, image)
	if large {
		names = e.largeRefs
	}
	for _, name := range names {
		_, err := e.direct.Image.RemoveImage(ctx, &runtimeapi.RemoveImageRequest{Image: &runtimeapi.ImageSpec{Image: name}})
		if err != nil && status.Code(err) != codes.NotFound {
			b.Fatalf("RemoveImage %s: %v", name, err)
		}
		st, err := e.direct.Image.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: name}})
		if err != nil {
			b.Fatalf("ImageStatus %s: %v", name, err)
		}
		if st.Image != nil {
			b.Fatalf("%s is still on the node after RemoveImage", name)
		}
	}
	// containerd deletes unreferenced content in the same call (synchronous
	// GC): the 100 MiB layer must be gone, or the next pull would not fetch it.
	if large {
		blobs := filepath.Join(e.ctrd.Dir, "root", "io.containerd.content.v1.content", "blobs", "sha256")
		entries, err := os.ReadDir(blobs)
		if err != nil {
			b.Fatal(err)
		}
		for _, de := range entries {
			if fi, err := de.Info(); err == nil && fi.Size() >= harness.LargeFileSize {
				b.Fatalf("the large layer %s is still in containerd's content store after RemoveImage", de.Name())
			}
		}
	}
}

// swapRecord is the part of `inplacectl swap -o json` the benchmark reads.
type swapRecord struct {
	State      string `json:"state"`
	Error      string `json:"error"`
	DowntimeNs string `json:"downtime_ns"`
	Steps      []struct {
		Name       string `json:"name"`
		DurationNs string `json:"duration_ns"`
	} `json:"steps"`
}

func (e *replaceEnv) swap(b *testing.B, oldID, image string) (time.Duration, map[string]int64) {
	b.Helper()
	out, err := e.px.Ctl("swap", "--id", oldID, "--image", image, "--min-runtime", replaceMinRuntime.String(), "-o", "json")
	if err != nil {
		b.Fatalf("swap: %v\n%s\ninplaced log:\n%s", err, out, e.px.LogTail(30))
	}
	var r swapRecord
	if err := json.Unmarshal([]byte(out[strings.Index(out, "{"):]), &r); err != nil {
		b.Fatalf("decode swap record: %v\n%s", err, out)
	}
	if r.State != "SWAP_STATE_COMMITTED" {
		b.Fatalf("swap %s: %s", r.State, r.Error)
	}
	d, err := strconv.ParseInt(r.DowntimeNs, 10, 64)
	if err != nil || d <= 0 {
		b.Fatalf("swap record downtime_ns %q: %v", r.DowntimeNs, err)
	}
	steps := map[string]int64{}
	for _, s := range r.Steps {
		n, _ := strconv.ParseInt(s.DurationNs, 10, 64)
		steps[s.Name] = n
	}
	return time.Duration(d), steps
}

// stepTimer records how long each named step takes, and the downtime: from
// the end of the "stop" step (the old container has stopped) to the end of
// the last step.
type stepTimer struct {
	stopped, last time.Time
	steps         map[string]int64
}

func newStepTimer() *stepTimer {
	return &stepTimer{last: time.Now(), steps: map[string]int64{}}
}

func (t *stepTimer) done(name string) {
	now := time.Now()
	t.steps[name] = int64(now.Sub(t.last))
	t.last = now
	if name == "stop" {
		t.stopped = now
	}
}

func (t *stepTimer) downtime() time.Duration { return t.last.Sub(t.stopped) }

func (e *replaceEnv) kubelet(b *testing.B, ctx context.Context, p *kubePod, oldID, image string) (time.Duration, map[string]int64) {
	b.Helper()
	rt, img := e.direct.Runtime, e.direct.Image
	t := newStepTimer()
	if _, err := rt.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: oldID, Timeout: 5}); err != nil {
		b.Fatalf("StopContainer: %v", err)
	}
	t.done("stop")
	if _, err := img.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: image, UserSpecifiedImage: image}, SandboxConfig: p.sandboxConfig}); err != nil {
		b.Fatalf("PullImage: %v", err)
	}
	t.done("pull")
	cr, err := rt.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: p.sandboxID, Config: p.kubeContainerConfig("app", image, 1), SandboxConfig: p.sandboxConfig})
	if err != nil {
		b.Fatalf("CreateContainer: %v", err)
	}
	t.done("create")
	if _, err := rt.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: cr.ContainerId}); err != nil {
		b.Fatalf("StartContainer: %v", err)
	}
	t.done("start")
	return t.downtime(), t.steps
}

func (e *replaceEnv) recreate(b *testing.B, ctx context.Context, p *kubePod, oldID, image string) (time.Duration, map[string]int64) {
	b.Helper()
	rt := e.direct.Runtime
	t := newStepTimer()
	if _, err := rt.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: oldID, Timeout: 5}); err != nil {
		b.Fatalf("StopContainer: %v", err)
	}
	t.done("stop")
	if _, err := rt.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: p.sandboxID}); err != nil {
		b.Fatalf("StopPodSandbox: %v", err)
	}
	t.done("stop-sandbox")
	if _, err := rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: p.sandboxID}); err != nil {
		b.Fatalf("RemovePodSandbox: %v", err)
	}
	p.sandboxID = ""
	t.done("remove-sandbox")
	if err := p.run(ctx, e.direct); err != nil {
		b.Fatal(err)
	}
	t.done("run-sandbox")
	cr, err := rt.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: p.sandboxID, Config: p.kubeContainerConfig("app", image, 0), SandboxConfig: p.sandboxConfig})
	if err != nil {
		b.Fatalf("CreateContainer: %v", err)
	}
	t.done("create")
	if _, err := rt.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: cr.ContainerId}); err != nil {
		b.Fatalf("StartContainer: %v", err)
	}
	t.done("start")
	return t.downtime(), t.steps
}
