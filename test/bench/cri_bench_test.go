package bench

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/test/bench/report"
	"github.com/inplaced/inplaced/test/harness"
)

// The node BenchmarkCRI measures on: criPods sandboxes with criPerPod
// containers each, every one labelled and annotated as kubelet does, so
// ListContainers answers with a kubelet-sized message.
const (
	criPods   = 10
	criPerPod = 10
	// criMinSamples is the least number of calls per path and cell, whatever
	// -benchtime says: p99 needs about a thousand.
	criMinSamples = 2000
	// criMinRounds is the least number of rounds per cell. At 16 callers a
	// round is one batch of 128 calls per path, a few milliseconds: 2000
	// samples were 16 rounds, 4 per drift window, and a floor's p50 moved
	// 30-100% between windows on this VM (steal comes in bursts of that
	// length). 64 rounds make each window 16 batches long.
	criMinRounds = 64
	// criProfileTime is how long each call is made through the proxy while
	// perf samples inplaced.
	criProfileTime = 1500 * time.Millisecond
)

// criCall is one CRI read call as kubelet makes it.
type criCall struct {
	name string
	note string
	do   func(ctx context.Context, c *harness.CRIClient, i int) error
}

// baselineBinary is the inplaced build BenchmarkCRI compares with, from
// $INPLACED_BENCH_BASELINE ("<label>=<path>", set by hack/bench.sh
// BASELINE=commit): its path and label, or "".
func baselineBinary() (bin, label string) {
	v := os.Getenv("INPLACED_BENCH_BASELINE")
	label, bin, ok := strings.Cut(v, "=")
	if !ok {
		return "", ""
	}
	return bin, label
}

// criOneProc is the variant of inplaced that BenchmarkCRI measures beside
// the default one: the Go runtime limited to one OS thread running Go code,
// so that handing a call from goroutine to goroutine never wakes another
// CPU.
const criOneProc = "GOMAXPROCS=1"

// BenchmarkCRI measures the per-call latency of kubelet's read calls
// directly on containerd's socket and through inplaced, in alternating
// batches so that noise on the machine hits all paths alike, at 1 and 16
// concurrent callers sharing one connection (as kubelet does). Two inplaced
// daemons run in front of the same containerd: as installed, and with
// GOMAXPROCS=1. Each cell reports p50/p99 of the paths and their ratios;
// the results file gets the full summaries and inplaced's CPU per relayed
// call, then inplaced's RSS after all cells of a backend and a perf profile.
func BenchmarkCRI(b *testing.B) {
	benchBackends(b, func(b *testing.B, ctrd *harness.Containerd) {
		px := startBenchProxy(b, ctrd.Endpoint, 3*time.Second)
		px1 := startBenchProxy(b, ctrd.Endpoint, 3*time.Second, criOneProc)
		direct := ctrd.CRI(b)
		proxy := harness.DialCRI(b, px.Endpoint)
		proxies := []criProxy{{pid: px.PID(), cri: proxy}, {variant: criOneProc, pid: px1.PID(), cri: harness.DialCRI(b, px1.Endpoint)}}
		if bin, label := baselineBinary(); bin != "" {
			// Another build of inplaced (hack/bench.sh BASELINE=commit), in
			// the same rounds: the same cells before and after a change.
			pb := startBenchProxyBinary(b, bin, ctrd.Endpoint, 3*time.Second)
			proxies = append(proxies, criProxy{variant: report.BaselinePrefix + label, pid: pb.PID(), cri: harness.DialCRI(b, pb.Endpoint)})
		}
		proxies = append(proxies, startFloors(b, ctrd.Socket)...)
		ids := criPopulate(b, direct, ctrd.Images)
		image := ctrd.Images.Pause // what the containers run
		calls := []criCall{
			{name: "Version", do: func(ctx context.Context, c *harness.CRIClient, _ int) error {
				_, err := c.Runtime.Version(ctx, &runtimeapi.VersionRequest{})
				return err
			}},
			{name: "ListPodSandbox", note: fmt.Sprintf("%d sandboxes", criPods), do: func(ctx context.Context, c *harness.CRIClient, _ int) error {
				_, err := c.Runtime.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
				return err
			}},
			{name: "ListContainers", note: fmt.Sprintf("%d containers", len(ids)), do: func(ctx context.Context, c *harness.CRIClient, _ int) error {
				resp, err := c.Runtime.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
				if err == nil && len(resp.Containers) != len(ids) {
					err = fmt.Errorf("ListContainers: %d containers, want %d", len(resp.Containers), len(ids))
				}
				return err
			}},
			{name: "ContainerStatus", do: func(ctx context.Context, c *harness.CRIClient, i int) error {
				_, err := c.Runtime.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: ids[i%len(ids)]})
				return err
			}},
			{name: "ImageStatus", do: func(ctx context.Context, c *harness.CRIClient, _ int) error {
				resp, err := c.Image.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: image}})
				if err == nil && resp.Image == nil {
					err = fmt.Errorf("ImageStatus: image not found")
				}
				return err
			}},
		}
		var relayed int64
		cpuStart, err := procCPU(px.PID())
		if err != nil {
			b.Fatal(err)
		}
		for _, call := range calls {
			for _, conc := range []int{1, 16} {
				b.Run(fmt.Sprintf("%s/c%d", call.name, conc), func(b *testing.B) {
					cpu0 := make([]time.Duration, len(proxies))
					for i, p := range proxies {
						if p.pid > 0 {
							cpu0[i], _ = procCPU(p.pid)
						}
					}
					ls, proxyCalls := criMeasure(b, direct, proxies, call, conc)
					for i, l := range ls {
						if proxies[i].pid <= 0 {
							// socat forks a process per connection: no CPU figure.
						} else if cpu1, err := procCPU(proxies[i].pid); err == nil && proxyCalls > 0 {
							l.ProxyCPUPerCall = int64(cpu1-cpu0[i]) / int64(proxyCalls)
						}
						l.Backend = string(ctrd.Backend)
						mustAppend(b, report.Record{Latency: l})
					}
					relayed += int64(proxyCalls)
				})
			}
		}
		cpuEnd, _ := procCPU(px.PID())
		rss, hwm, err := vmStatus(px.PID())
		if err != nil {
			b.Fatal(err)
		}
		b.Logf("inplaced after %d relayed calls: VmRSS %d KiB, VmHWM %d KiB, CPU %s", relayed, rss, hwm, cpuEnd-cpuStart)
		mustAppend(b, report.Record{Memory: &report.Memory{Backend: string(ctrd.Backend), VmRSSKiB: rss, VmHWMKiB: hwm,
			Calls: relayed, CPUNs: int64(cpuEnd - cpuStart)}})

		// Where inplaced's CPU goes, sampled by perf in a phase of its own
		// (so the sampling does not touch the figures above): every call
		// through the proxy, one caller, criProfileTime each.
		if rec := startPerf(b, px.PID()); rec != nil {
			var costs []report.CallCost
			for _, call := range calls {
				cnt := startPerfStat(b, px.PID())
				cpu0, _ := procCPU(px.PID())
				deadline := time.Now().Add(criProfileTime)
				n := 0
				for ; time.Now().Before(deadline); n++ {
					if err := call.do(context.Background(), proxy, n); err != nil {
						b.Fatalf("%s: %v", call.name, err)
					}
				}
				cpu1, _ := procCPU(px.PID())
				if sc, sw, ok := cnt.stop(b); ok && n > 0 {
					costs = append(costs, report.CallCost{Method: call.name, Calls: n, Syscalls: float64(sc) / float64(n),
						ContextSwitches: float64(sw) / float64(n), CPUNs: int64(cpu1-cpu0) / int64(n)})
				}
			}
			if prof := rec.stop(b, string(ctrd.Backend)); prof != nil {
				prof.PerCall = costs
				mustAppend(b, report.Record{Profile: prof})
			}
		}
	})
}

// criPopulate creates criPods pods of criPerPod containers (the test pause
// image) directly on the backend and returns the container IDs.
func criPopulate(b *testing.B, direct *harness.CRIClient, imgs harness.Images) []string {
	b.Helper()
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if _, err := direct.Image.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: imgs.Pause}}); err != nil {
		b.Fatalf("PullImage: %v", err)
	}
	pods := make([]*kubePod, criPods)
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(2)
	for i := range pods {
		p := newKubePodConfig(b, fmt.Sprintf("cri-%02d", i))
		pods[i] = p
		g.Go(func() error {
			if err := p.run(gctx, direct); err != nil {
				return err
			}
			for j := range criPerPod {
				if _, err := p.start(gctx, direct, p.kubeContainerConfig(fmt.Sprintf("c%02d", j), imgs.Pause, 0)); err != nil {
					return err
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		b.Fatal(err)
	}
	var ids []string
	for _, p := range pods {
		ids = append(ids, p.containerIDs...)
	}
	b.Logf("%d pods with %d containers in %s", len(pods), len(ids), time.Since(start).Round(time.Millisecond))
	return ids
}

// criProxy is one process in front of the backend: inplaced, or a floor.
type criProxy struct {
	variant string // "" for inplaced as installed
	pid     int    // whose CPU time is counted; 0 if none
	cri     *harness.CRIClient
}

// criMeasure runs call in rounds of one batch per path (direct, then each
// proxy; the order rotates every round), each batch conc goroutines making
// perG calls, until b.Loop is done, each path has criMinSamples samples and
// criMinRounds rounds were made.
// It returns a summary per proxy (each with the same direct summary) and how
// many calls went through each proxy in all.
func criMeasure(b *testing.B, direct *harness.CRIClient, proxies []criProxy, call criCall, conc int) ([]*report.Latency, int) {
	perG := max(32/conc, 8)
	ctx := context.Background()
	paths := []*harness.CRIClient{direct}
	for _, p := range proxies {
		paths = append(paths, p.cri)
	}
	samples := make([][]time.Duration, len(paths))
	// perRound keeps each path's samples round by round, for the drift of
	// its p50 across the cell (report.Latency.WindowP50).
	perRound := make([][][]time.Duration, len(paths))
	var seq, proxyCalls int
	batch := func(path int, record bool) {
		c := paths[path]
		var wg sync.WaitGroup
		var mu sync.Mutex
		var firstErr error
		out := make([][]time.Duration, conc)
		begin := make(chan struct{})
		for g := range conc {
			base := seq + g*perG
			wg.Add(1)
			go func() {
				defer wg.Done()
				s := make([]time.Duration, 0, perG)
				<-begin
				for i := range perG {
					t0 := time.Now()
					err := call.do(ctx, c, base+i)
					d := time.Since(t0)
					if err != nil {
						mu.Lock()
						if firstErr == nil {
							firstErr = err
						}
						mu.Unlock()
						return
					}
					s = append(s, d)
				}
				out[g] = s
			}()
		}
		close(begin)
		wg.Wait()
		seq += conc * perG
		if path == 1 {
			proxyCalls += conc * perG
		}
		if firstErr != nil {
			b.Fatalf("%s: %v", call.name, firstErr)
		}
		if record {
			var r []time.Duration
			for _, s := range out {
				r = append(r, s...)
			}
			samples[path] = append(samples[path], r...)
			perRound[path] = append(perRound[path], r)
		}
	}
	round := 0
	one := func() {
		for k := range paths {
			batch((round+k)%len(paths), true)
		}
		round++
	}
	// Warm every path: connections, caches, the proxies' goroutines.
	for p := range paths {
		batch(p, false)
	}
	load := startLoadSampler()
	for b.Loop() {
		one()
	}
	for round < criMinRounds || slices.ContainsFunc(samples, func(s []time.Duration) bool { return len(s) < criMinSamples }) {
		one()
	}
	cond := load.finish()
	windows := make([][]int64, len(paths))
	for i := range paths {
		windows[i] = windowP50s(perRound[i])
	}
	dir := report.Summarize(samples[0])
	var out []*report.Latency
	us := func(ns int64) float64 { return float64(ns) / 1e3 }
	for i, p := range proxies {
		l := &report.Latency{Method: call.name, Concurrency: conc, Rounds: round, Note: call.note, Variant: p.variant,
			Direct: dir, Proxy: report.Summarize(samples[i+1]), Conditions: cond, WindowP50: windows[i+1], DirectWindowP50: windows[0]}
		out = append(out, l)
		suffix := ""
		if p.variant != "" {
			suffix = "-1proc"
		} else {
			b.ReportMetric(float64(l.Proxy.P50), "ns/op")
			b.ReportMetric(us(l.Direct.P50), "direct-p50-µs")
			b.ReportMetric(us(l.Direct.P99), "direct-p99-µs")
		}
		b.ReportMetric(us(l.Proxy.P50), "proxy"+suffix+"-p50-µs")
		b.ReportMetric(float64(l.Proxy.P50)/float64(l.Direct.P50), "p50-ratio"+suffix)
		b.ReportMetric(us(l.Proxy.P99), "proxy"+suffix+"-p99-µs")
		b.ReportMetric(float64(l.Proxy.P99)/float64(l.Direct.P99), "p99-ratio"+suffix)
	}
	b.Logf("%s c%d: other work %.2f CPU, load %.1f→%.1f, run queue %.1f (max %d)", call.name, conc,
		cond.ForeignCPU, cond.Load1Start, cond.Load1Max, cond.RunQueueMean, cond.RunQueueMax)
	return out, proxyCalls
}
