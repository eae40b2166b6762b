package metrics

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

func TestMetricsCountAndLint(t *testing.T) {
	m := New("test", func() (int, error) { return 2, nil })
	ic := m.StreamInterceptor()
	call := func(method string, err error) {
		_ = ic(nil, nil, &grpc.StreamServerInfo{FullMethod: method}, func(any, grpc.ServerStream) error { return err })
	}
	call("/runtime.v1.RuntimeService/Version", nil)
	call("/runtime.v1.RuntimeService/Version", nil)
	call("/runtime.v1.RuntimeService/ContainerStatus", status.Error(codes.NotFound, "x"))
	call("/runtime.v1.RuntimeService/NotInThisBuild", nil)
	m.SwapStarted(&inplacedv1.SwapRecord{})
	m.StepEnded(nil, &inplacedv1.Step{Name: "pull", DurationNs: 1e6})
	m.SwapEnded(&inplacedv1.SwapRecord{Kind: "swap", State: inplacedv1.SwapState_SWAP_STATE_COMMITTED, DowntimeNs: 1.5e8})
	m.Resized(&inplacedv1.ResizeRecord{Result: "applied", Method: "sandbox", RuntimeClass: "sandbox-cgroup"})
	m.Recovered("x", nil)
	m.PulledBytes(1000)
	m.RelayAbuse("rapid_reset")

	for _, c := range []struct {
		vec    string
		labels []string
		want   float64
	}{
		{"cri_requests_total", []string{"Version", "OK"}, 2},
		{"cri_requests_total", []string{"ContainerStatus", "NotFound"}, 1},
		{"cri_requests_total", []string{"other", "OK"}, 1},
		{"swaps_total", []string{"swap", "committed"}, 1},
		{"resizes_total", []string{"applied", "sandbox", "sandbox-cgroup"}, 1},
		{"relay_abuse_total", []string{"rapid_reset"}, 1},
	} {
		var got float64
		switch c.vec {
		case "cri_requests_total":
			got = testutil.ToFloat64(m.criRequests.WithLabelValues(c.labels...))
		case "swaps_total":
			got = testutil.ToFloat64(m.swaps.WithLabelValues(c.labels...))
		case "resizes_total":
			got = testutil.ToFloat64(m.resizes.WithLabelValues(c.labels...))
		case "relay_abuse_total":
			got = testutil.ToFloat64(m.relayAbuse.WithLabelValues(c.labels...))
		}
		if got != c.want {
			t.Errorf("%s%v = %v, want %v", c.vec, c.labels, got, c.want)
		}
	}
	if n := testutil.ToFloat64(m.swapsRunning); n != 0 {
		t.Errorf("swaps_running %v after the swap ended", n)
	}
	problems, err := testutil.GatherAndLint(m.Registry())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		if !strings.HasPrefix(p.Metric, "go_") && !strings.HasPrefix(p.Metric, "process_") {
			t.Errorf("lint: %s: %s", p.Metric, p.Text)
		}
	}
}

// The hot path: a relayed call that succeeds allocates nothing in the
// interceptor once its method and code were seen.
func TestInterceptorAllocs(t *testing.T) {
	m := New("test", nil)
	ic := m.StreamInterceptor()
	info := &grpc.StreamServerInfo{FullMethod: "/runtime.v1.RuntimeService/Version"}
	h := func(any, grpc.ServerStream) error { return nil }
	_ = ic(nil, nil, info, h)
	if a := testing.AllocsPerRun(1000, func() { _ = ic(nil, nil, info, h) }); a > 0 {
		t.Fatalf("%v allocations per call", a)
	}
}

// TestHandlerUncompressed: a scraper that offers gzip (Prometheus does) gets
// plain text, so no gzip writer's tables stay in the heap between scrapes.
func TestHandlerUncompressed(t *testing.T) {
	m := New("test", func() (int, error) { return 2, nil })
	req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
	req.Header.Set("Accept-Encoding", "gzip, deflate")
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		t.Fatalf("status %d", rec.Code)
	}
	if enc := rec.Header().Get("Content-Encoding"); enc != "" {
		t.Errorf("Content-Encoding %q, want none", enc)
	}
	if !strings.Contains(rec.Body.String(), "go_goroutines") {
		t.Errorf("body is not the text exposition:\n%.300s", rec.Body.String())
	}
}
