package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/test/bench/report"
	"github.com/inplaced/inplaced/test/harness"
)

// BenchmarkSwapOverlap compares the two swap strategies in the same run,
// taking turns in a fresh pod per repetition: stop-first with the
// connection hold (the default) and overlap (the pod's annotation
// inplaced.io/swap-strategy: overlap). The test app drains on SIGTERM
// (-drain=300ms). Clients: a new TCP connection every 5 ms
// (harness.Dialer) and 20 keep-alive connections each sending a request
// every 50 ms (harness.KeepAlive), from 2 s before the swap to 300 ms after.
// Per repetition: failed connections and requests (refused, reset, timed
// out, no answer), the slowest new connection's handshake during the swap
// and in as long a time before it, and the keep-alive connections the
// server ended (and of those, the ones ended before the old container was
// asked to stop: lost to the swap). Sums of the failures and ends, medians of the handshakes,
// the worst excess of the slowest during the swap over the slowest before.
func BenchmarkSwapOverlap(b *testing.B) {
	benchBackends(b, func(b *testing.B, ctrd *harness.Containerd) {
		e := newSwapEnv(b, ctrd)
		modes := []string{"stop-first", "overlap"}
		failed, ended, early := map[string]int{}, map[string]int{}, map[string]int{}
		during, excess := map[string][]int64{}, map[string][]int64{}
		rep := 0
		one := func() {
			for k := range modes {
				m := modes[(rep+k)%len(modes)]
				t := e.strategyTrial(b, m)
				failed[m] += t.failed
				ended[m] += t.ended
				early[m] += t.early
				during[m] = append(during[m], int64(t.during))
				excess[m] = append(excess[m], int64(t.during-t.before))
			}
			rep++
		}
		for b.Loop() {
			one()
		}
		for rep < replaceReps() {
			one()
		}
		med := func(ns []int64) float64 { return float64(report.Median(ns)) / 1e6 }
		worst := func(ns []int64) float64 {
			w := ns[0]
			for _, n := range ns {
				w = max(w, n)
			}
			return float64(w) / 1e6
		}
		for _, m := range modes {
			b.Logf("%s: %d failed, %d keep-alive connections ended by the server (%d before the old container was asked to stop); slowest handshakes during the swap %v, over the slowest before %v",
				m, failed[m], ended[m], early[m], durations(during[m]), durations(excess[m]))
		}
		b.ReportMetric(float64(report.Median(during["overlap"])), "ns/op")
		for _, m := range modes {
			b.ReportMetric(float64(failed[m]), m+"-failed")
			b.ReportMetric(float64(ended[m]), m+"-ended")
			b.ReportMetric(float64(early[m]), m+"-closed-early")
			b.ReportMetric(med(during[m]), m+"-slowest-ms")
			b.ReportMetric(worst(excess[m]), m+"-excess-ms")
		}
		b.ReportMetric(float64(rep), "reps")
	})
}

type strategyTrialResult struct {
	failed, ended  int
	early          int // keep-alive connections the server ended before the old container's stop
	during, before time.Duration
}

// strategyTrial swaps App1 → App2 in a fresh pod with strategy under the
// two clients.
func (e *replaceEnv) strategyTrial(b *testing.B, strategy string) strategyTrialResult {
	b.Helper()
	e.seq++
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	p := newKubePodConfig(b, fmt.Sprintf("strategy-%s-%d", strategy, e.seq))
	p.sandboxConfig.Annotations = map[string]string{"inplaced.io/swap-strategy": strategy}
	if err := p.run(ctx, e.proxy); err != nil {
		b.Fatal(err)
	}
	defer func() {
		if err := p.remove(e.proxy); err != nil {
			b.Errorf("remove pod: %v", err)
		}
	}()
	cfg := p.kubeContainerConfig("app", e.ctrd.Images.App1, 0)
	cfg.Args = []string{"-drain=300ms"}
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
	d, ka := harness.StartDialer(addr), harness.StartKeepAlive(addr, 20)
	time.Sleep(2 * time.Second)
	out, err := e.px.Ctl("swap", "--id", oldID, "--image", e.ctrd.Images.App2, "--min-runtime", replaceMinRuntime.String(), "-o", "json")
	time.Sleep(300 * time.Millisecond)
	ds := d.End()
	ka.End()
	if err != nil {
		b.Fatalf("swap: %v\n%s", err, out)
	}
	var r struct {
		State    string `json:"state"`
		Strategy string `json:"strategy"`
		Why      string `json:"strategy_why"`
		Started  string `json:"started_unix_nano"`
		Finished string `json:"finished_unix_nano"`
		Steps    []struct {
			Name    string `json:"name"`
			Started string `json:"started_unix_nano"`
		} `json:"steps"`
	}
	if err := json.Unmarshal([]byte(out[strings.Index(out, "{"):]), &r); err != nil || r.State != "SWAP_STATE_COMMITTED" || r.Strategy != strategy {
		b.Fatalf("swap record (want committed, %s): %v\n%s", strategy, err, out)
	}
	s, k := harness.TallyDials(b, ds), ka.Tally()
	start, _ := strconv.ParseInt(r.Started, 10, 64)
	end, _ := strconv.ParseInt(r.Finished, 10, 64)
	res := strategyTrialResult{failed: s.Failed() + len(k.Failed), ended: len(k.Closes)}
	// The old process ends its keep-alive connections in its drain, which
	// begins with its stop; one ended before that was lost to the swap.
	var stopAt time.Time
	for _, st := range r.Steps {
		if st.Name == "stop-old" {
			n, _ := strconv.ParseInt(st.Started, 10, 64)
			stopAt = time.Unix(0, n)
		}
	}
	if stopAt.IsZero() {
		b.Fatalf("swap record without a stop-old step:\n%s", out)
	}
	for _, c := range k.Closes {
		if c.At.Before(stopAt) {
			res.early++
		}
	}
	from, to := time.Unix(0, start), time.Unix(0, end)
	for _, a := range ds {
		switch {
		case a.Err != nil:
		case !a.At.Before(from) && a.At.Before(to):
			res.during = max(res.during, a.Connect)
		case !a.At.Before(from.Add(-to.Sub(from))) && a.At.Before(from):
			res.before = max(res.before, a.Connect)
		}
	}
	b.Logf("%s: %d connections (%+v), %d keep-alive requests (%d failed, %d sent again, %d connections ended); slowest handshake during %s, before %s",
		strategy, len(ds), s, k.OK, len(k.Failed), k.Retried, len(k.Closes), res.during.Round(100*time.Microsecond), res.before.Round(100*time.Microsecond))
	return res
}
