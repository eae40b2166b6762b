package bench

import (
	"context"
	"fmt"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/test/bench/report"
	"github.com/inplaced/inplaced/test/harness"
)

// BenchmarkSwapRuntime measures a swap's downtime (App1 → App2, the record's
// downtime_ns: old container stopped → new one started) on gVisor (handler
// runsc) and on runc in the same run, on containerd 2.x (gVisor's shim needs
// it): a fresh pod per repetition, the two runtimes taking turns. The new
// image is on the node (pulled before the first repetition), since the pull
// is outside the downtime anyway. It reports the medians and the ratio, and
// the median start-new step, where gVisor spends its extra time (a gofer and
// a sub-container in the sentry).
func BenchmarkSwapRuntime(b *testing.B) {
	benchBackends(b, func(b *testing.B, ctrd *harness.Containerd) {
		if ctrd.Backend == harness.Containerd16 {
			b.Skipf("%s: gVisor's shim needs containerd 2.x (shim bootstrap protocol v2); nothing to measure", ctrd.Backend)
		}
		ctrd.RequireRunsc(b)
		e := newSwapEnv(b, ctrd)
		handlers := []string{harness.RuntimeHandlerRunsc, "runc"}
		downtime := map[string][]int64{}
		startNew := map[string][]int64{}
		rep := 0
		one := func() {
			for k := range handlers {
				h := handlers[(rep+k)%len(handlers)]
				d, steps := e.runtimeTrial(b, h)
				downtime[h] = append(downtime[h], int64(d))
				startNew[h] = append(startNew[h], steps["start-new"])
			}
			rep++
		}
		for b.Loop() {
			one()
		}
		for rep < replaceReps() {
			one()
		}
		med := func(m map[string][]int64, h string) float64 { return float64(report.Median(m[h])) }
		for _, h := range handlers {
			b.Logf("%s downtime samples: %v; start-new: %v", h, durations(downtime[h]), durations(startNew[h]))
		}
		b.ReportMetric(med(downtime, "runsc"), "ns/op")
		b.ReportMetric(med(downtime, "runsc")/1e6, "runsc-ms")
		b.ReportMetric(med(downtime, "runc")/1e6, "runc-ms")
		b.ReportMetric(med(downtime, "runsc")/med(downtime, "runc"), "runsc/runc")
		b.ReportMetric(med(startNew, "runsc")/1e6, "runsc-start-new-ms")
		b.ReportMetric(med(startNew, "runc")/1e6, "runc-start-new-ms")
		b.ReportMetric(float64(rep), "reps")
	})
}

// runtimeTrial swaps App1 → App2 in a fresh pod on handler h.
func (e *replaceEnv) runtimeTrial(b *testing.B, h string) (time.Duration, map[string]int64) {
	b.Helper()
	e.seq++
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	p := newKubePodConfig(b, fmt.Sprintf("rt-%s-%d", h, e.seq))
	p.handler = h
	if err := p.run(ctx, e.proxy); err != nil {
		b.Fatal(err)
	}
	defer func() {
		if err := p.remove(e.proxy); err != nil {
			b.Errorf("remove pod: %v", err)
		}
	}()
	oldID, err := p.start(ctx, e.proxy, p.kubeContainerConfig("app", e.ctrd.Images.App1, 0))
	if err != nil {
		b.Fatal(err)
	}
	d, steps := e.swap(b, oldID, e.ctrd.Images.App2)
	b.Logf("swap on %s: %s", h, d.Round(time.Microsecond))
	return d, steps
}

// newSwapEnv is inplaced in front of ctrd with the images of an App1 → App2
// swap already on the node (the pull is outside what these benchmarks
// measure).
func newSwapEnv(b *testing.B, ctrd *harness.Containerd) *replaceEnv {
	b.Helper()
	e := &replaceEnv{ctrd: ctrd, px: startBenchProxy(b, ctrd.Endpoint, replaceMinRuntime), direct: ctrd.CRI(b)}
	e.proxy = harness.DialCRI(b, e.px.Endpoint)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, img := range []string{ctrd.Images.Pause, ctrd.Images.App1, ctrd.Images.App2} {
		if _, err := e.direct.Image.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: img}}); err != nil {
			b.Fatalf("PullImage %s: %v", img, err)
		}
	}
	return e
}

func durations(ns []int64) []time.Duration {
	out := make([]time.Duration, len(ns))
	for i, n := range ns {
		out[i] = time.Duration(n).Round(time.Millisecond)
	}
	return out
}
