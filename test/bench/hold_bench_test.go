package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/test/bench/report"
	"github.com/inplaced/inplaced/test/harness"
)

// BenchmarkSwapHold measures what a client dialling the pod IP sees during a
// swap (App1 → App2, the new image already on the node), with the connection
// hold (the default, queue) and without it (the pod's annotation
// inplaced.io/connection-hold: off), taking turns in a fresh pod per
// repetition: a new TCP connection every 5 ms (harness.Dialer) from 300 ms
// before the swap to 300 ms after. Per repetition: the failed connections
// (refused, reset, timed out) and the slowest connection's handshake; with
// the hold, its duration from the record (install → the new process
// listening: the gap the clients were kept from) and the slowest handshake
// against 1.2 × that gap + 20 ms. Medians, except the failures (summed) and
// the worst ratio.
func BenchmarkSwapHold(b *testing.B) {
	benchBackends(b, func(b *testing.B, ctrd *harness.Containerd) {
		e := newSwapEnv(b, ctrd)
		modes := []string{"queue", "off"}
		failed := map[string]int{}
		slowest := map[string][]int64{}
		var gaps []int64
		worst := 0.0
		rep := 0
		one := func() {
			for k := range modes {
				m := modes[(rep+k)%len(modes)]
				t := e.holdTrial(b, m)
				failed[m] += t.failed
				slowest[m] = append(slowest[m], int64(t.slowest))
				if m == "queue" {
					gaps = append(gaps, int64(t.held))
					worst = max(worst, float64(t.slowest)/(1.2*float64(t.held)+float64(20*time.Millisecond)))
				}
			}
			rep++
		}
		for b.Loop() {
			one()
		}
		for rep < replaceReps() {
			one()
		}
		for _, m := range modes {
			b.Logf("%s: %d failed; slowest handshakes %v", m, failed[m], durations(slowest[m]))
		}
		b.Logf("hold durations (install → new listener): %v", durations(gaps))
		med := func(ns []int64) float64 { return float64(report.Median(ns)) / 1e6 }
		b.ReportMetric(float64(report.Median(slowest["queue"])), "ns/op")
		b.ReportMetric(float64(failed["queue"]), "hold-failed")
		b.ReportMetric(med(slowest["queue"]), "hold-slowest-ms")
		b.ReportMetric(med(gaps), "hold-gap-ms")
		b.ReportMetric(worst, "slowest/limit")
		b.ReportMetric(float64(failed["off"]), "off-failed")
		b.ReportMetric(med(slowest["off"]), "off-slowest-ms")
		b.ReportMetric(float64(rep), "reps")
	})
}

type holdTrialResult struct {
	failed        int
	slowest, held time.Duration
	// late counts the connections that waited past the release + 50 ms.
	late int
}

// BenchmarkHoldRelease measures the release of the parked SYNs to a server
// with a listen backlog of 5 that serves one connection at a time (the test
// app's -backlog=5 -serial: busybox httpd, Python's http.server): paced to
// the new listener's accept queue (the default) against one batch (the
// release before pacing, inplaced started with INPLACED_TEST_HOLD_ONE_BATCH=1),
// a fresh pod per repetition, the two taking turns, under a client opening a
// new connection every 5 ms. Per mode: failed connections and those that
// waited past the release + 50 ms (summed), the slowest handshake (median
// and worst).
func BenchmarkHoldRelease(b *testing.B) {
	benchBackends(b, func(b *testing.B, ctrd *harness.Containerd) {
		e := newSwapEnv(b, ctrd)
		modes := []string{"paced", "batch"}
		failed, late := map[string]int{}, map[string]int{}
		slowest := map[string][]int64{}
		rep := 0
		one := func() {
			for k := range modes {
				m := modes[(rep+k)%len(modes)]
				e.restartProxy(b, m == "batch")
				t := e.holdTrial(b, "queue", "-backlog=5", "-serial")
				failed[m] += t.failed
				late[m] += t.late
				slowest[m] = append(slowest[m], int64(t.slowest))
			}
			rep++
		}
		for b.Loop() {
			one()
		}
		for rep < replaceReps() {
			one()
		}
		for _, m := range modes {
			b.Logf("%s: %d failed, %d past the release + 50 ms; slowest handshakes %v", m, failed[m], late[m], durations(slowest[m]))
		}
		med := func(ns []int64) float64 { return float64(report.Median(ns)) / 1e6 }
		worst := func(ns []int64) float64 { return float64(slices.Max(ns)) / 1e6 }
		b.ReportMetric(float64(report.Median(slowest["paced"])), "ns/op")
		for _, m := range modes {
			b.ReportMetric(float64(failed[m]), m+"-failed")
			b.ReportMetric(float64(late[m]), m+"-late")
			b.ReportMetric(med(slowest[m]), m+"-slowest-ms")
			b.ReportMetric(worst(slowest[m]), m+"-worst-ms")
		}
		b.ReportMetric(float64(rep), "reps")
	})
}

// restartProxy restarts inplaced with the one-batch release or without it,
// when it runs the other way.
func (e *replaceEnv) restartProxy(b *testing.B, oneBatch bool) {
	b.Helper()
	if e.oneBatch == oneBatch {
		return
	}
	if err := e.px.Stop(); err != nil {
		b.Fatal(err)
	}
	var env []string
	if oneBatch {
		env = append(env, "INPLACED_TEST_HOLD_ONE_BATCH=1")
	}
	if err := e.px.Start(env...); err != nil {
		b.Fatal(err)
	}
	e.oneBatch = oneBatch
}

// holdTrial swaps App1 → App2 in a fresh pod whose connection hold is mode
// (queue: the default; off: by the pod's annotation) under a Dialer.
func (e *replaceEnv) holdTrial(b *testing.B, mode string, args ...string) holdTrialResult {
	b.Helper()
	e.seq++
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	p := newKubePodConfig(b, fmt.Sprintf("hold-%s-%d", mode, e.seq))
	if mode == "off" {
		p.sandboxConfig.Annotations = map[string]string{"inplaced.io/connection-hold": "off"}
	}
	if err := p.run(ctx, e.proxy); err != nil {
		b.Fatal(err)
	}
	defer func() {
		if err := p.remove(e.proxy); err != nil {
			b.Errorf("remove pod: %v", err)
		}
	}()
	cfg := p.kubeContainerConfig("app", e.ctrd.Images.App1, 0)
	cfg.Args = args
	oldID, err := p.start(ctx, e.proxy, cfg)
	if err != nil {
		b.Fatal(err)
	}
	st, err := e.proxy.Runtime.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: p.sandboxID})
	if err != nil {
		b.Fatal(err)
	}
	addr := net.JoinHostPort(st.GetStatus().GetNetwork().GetIp(), strconv.Itoa(harness.AppPort))
	if err := harness.WaitHTTPAnswer("http://"+addr+"/version", "v1", 10*time.Second); err != nil {
		b.Fatalf("v1 before the swap: %v", err)
	}
	d := harness.StartDialer(addr)
	time.Sleep(300 * time.Millisecond)
	out, err := e.px.Ctl("swap", "--id", oldID, "--image", e.ctrd.Images.App2, "--min-runtime", replaceMinRuntime.String(), "-o", "json")
	time.Sleep(300 * time.Millisecond)
	ds := d.End()
	if err != nil {
		b.Fatalf("swap: %v\n%s", err, out)
	}
	var r struct {
		State string `json:"state"`
		Hold  struct {
			Mode            string `json:"mode"`
			DurationNs      string `json:"duration_ns"`
			StartedUnixNano string `json:"started_unix_nano"`
		} `json:"hold"`
	}
	if err := json.Unmarshal([]byte(out[strings.Index(out, "{"):]), &r); err != nil || r.State != "SWAP_STATE_COMMITTED" || r.Hold.Mode != mode {
		b.Fatalf("swap record (want committed, hold %s): %v\n%s", mode, err, out)
	}
	s := harness.TallyDials(b, ds)
	var res holdTrialResult
	res.failed = s.Failed()
	for _, a := range ds {
		if a.Err == nil {
			res.slowest = max(res.slowest, a.Connect)
		}
	}
	n, _ := strconv.ParseInt(r.Hold.DurationNs, 10, 64)
	res.held = time.Duration(n)
	if start, _ := strconv.ParseInt(r.Hold.StartedUnixNano, 10, 64); start > 0 {
		res.late = len(harness.WaitedPast(ds, time.Unix(0, start+n), 50*time.Millisecond))
	}
	b.Logf("hold %s: %d connections, %d failed (%+v), slowest handshake %s, held %s", mode, len(ds), res.failed, s,
		res.slowest.Round(time.Millisecond), res.held.Round(time.Millisecond))
	return res
}
