package report

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestSummarize(t *testing.T) {
	var s []time.Duration
	for i := 100; i >= 1; i-- { // unsorted on purpose
		s = append(s, time.Duration(i)*time.Microsecond)
	}
	got := Summarize(s)
	want := Summary{N: 100, P50: 50e3, P90: 90e3, P99: 99e3, Mean: 50500, Min: 1e3, Max: 100e3}
	if got != want {
		t.Fatalf("Summarize = %+v, want %+v", got, want)
	}
	if Summarize(nil) != (Summary{}) {
		t.Fatal("Summarize(nil) not zero")
	}
	one := []time.Duration{7}
	if p := Percentile(one, 99); p != 7 {
		t.Fatalf("p99 of one sample = %v", p)
	}
}

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		in   []int64
		want int64
	}{{nil, 0}, {[]int64{5}, 5}, {[]int64{9, 1, 5}, 5}, {[]int64{4, 1, 3, 2}, 2}} {
		if got := Median(c.in); got != c.want {
			t.Errorf("Median(%v) = %d, want %d", c.in, got, c.want)
		}
	}
}

func TestParseGoBench(t *testing.T) {
	out := `goos: linux
BenchmarkResize/containerd-2.4/inplaced-2         	      20	  51234567 ns/op
    resize_bench_test.go:12: some log
BenchmarkResize/containerd-2.4/cgroup-2           	  300000	      4100 ns/op
BenchmarkCRI/containerd-2.4/Version/c1-2  	      25	    818369 ns/op	       258.2 direct-p50-µs	         3.170 p50-ratio
--- FAIL: BenchmarkX
PASS
`
	got, err := ParseGoBench(strings.NewReader(out))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 {
		t.Fatalf("%d results: %+v", len(got), got)
	}
	if got[0].Name != "BenchmarkResize/containerd-2.4/inplaced" || got[0].Procs != 2 || got[0].N != 20 || got[0].Metrics["ns/op"] != 51234567 {
		t.Errorf("first: %+v", got[0])
	}
	if got[2].Metrics["p50-ratio"] != 3.170 || got[2].Metrics["direct-p50-µs"] != 258.2 {
		t.Errorf("custom metrics: %+v", got[2].Metrics)
	}
}

func TestAppendLoad(t *testing.T) {
	path := filepath.Join(t.TempDir(), "r.jsonl")
	t.Setenv(EnvResults, path)
	recs := []Record{
		{Backend: &Backend{Backend: "containerd-2.4", RuntimeName: "containerd", RuntimeVersion: "2.4.2"}},
		{Downtime: &Downtime{Backend: "containerd-2.4", Image: "App2", Method: MethodSwap, Samples: []int64{1, 2}}},
	}
	for _, r := range recs {
		if err := Append(r); err != nil {
			t.Fatal(err)
		}
	}
	got, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Backend.RuntimeVersion != "2.4.2" || got[1].Downtime.Samples[1] != 2 || got[0].Time.IsZero() {
		t.Fatalf("loaded %+v", got)
	}
}

// quiet are the conditions of a cell measured on a quiet machine.
var quiet = &Conditions{NProc: 2, Load1Start: 0.3, Load1Max: 1.1, RunQueueMean: 1.2, RunQueueMax: 3, ForeignCPU: 0.1, Steal: new(0.004)}

func sampleInput() Input {
	us := func(n int64) int64 { return n * 1e3 }
	ms := func(n int64) int64 { return n * 1e6 }
	return Input{
		Machine: Machine{CPUModel: "AMD EPYC", NProc: 2, Kernel: "6.1", GoVersion: "go1.26", Load: []float64{0.5, 3.5, 1}},
		Records: []Record{
			{Backend: &Backend{Backend: "containerd-2.4", RuntimeName: "containerd", RuntimeVersion: "2.4.2", Binary: "/x/containerd"}},
			{Latency: &Latency{Backend: "containerd-2.4", Method: "Version", Concurrency: 1,
				Direct: Summary{N: 2000, P50: us(60), P99: us(200)}, Proxy: Summary{N: 2000, P50: us(100), P99: us(300)}, Conditions: quiet}},
			{Latency: &Latency{Backend: "containerd-2.4", Method: "ListContainers", Concurrency: 1, Note: "100 containers",
				Direct: Summary{N: 2000, P50: us(1000), P99: us(2000)}, Proxy: Summary{N: 2000, P50: us(1100), P99: us(2100)}, Conditions: quiet}},
			{Latency: &Latency{Backend: "containerd-2.4", Method: "Version", Concurrency: 1, Variant: "GOMAXPROCS=1",
				Direct: Summary{N: 2000, P50: us(60), P99: us(200)}, Proxy: Summary{N: 2000, P50: us(90), P99: us(250)}, ProxyCPUPerCall: us(40)}},
			{Latency: &Latency{Backend: "containerd-2.4", Method: "Version", Concurrency: 1, Variant: "floor: Go byte relay",
				Direct: Summary{N: 2000, P50: us(60), P99: us(200)}, Proxy: Summary{N: 2000, P50: us(130), P99: us(250)}, Conditions: quiet}},
			{Latency: &Latency{Backend: "containerd-2.4", Method: "ListContainers", Concurrency: 1, Note: "100 containers", Variant: "floor: Go byte relay",
				Direct: Summary{N: 2000, P50: us(1000), P99: us(2000)}, Proxy: Summary{N: 2000, P50: us(1030), P99: us(2100)}, Conditions: quiet}},
			{Profile: &Profile{Backend: "containerd-2.4", Samples: 100,
				Groups:  []ProfileEntry{{"kernel: syscalls, socket I/O, scheduling", 60}, {"inplaced: relay and interceptors", 0.3}},
				Top:     []ProfileEntry{{"pvm_irq_enable", 50}},
				PerCall: []CallCost{{Method: "Version", Calls: 10, Syscalls: 29.6, ContextSwitches: 14.2, CPUNs: 5e5}}}},
			{Memory: &Memory{Backend: "containerd-2.4", VmRSSKiB: 20480, VmHWMKiB: 30720, Calls: 40000}},
			{Downtime: &Downtime{Backend: "containerd-2.4", Image: "Large", Method: MethodSwap, Samples: []int64{ms(100), ms(120), ms(110)}}},
			{Downtime: &Downtime{Backend: "containerd-2.4", Image: "Large", Method: MethodKubelet, Samples: []int64{ms(3000), ms(3100), ms(2900)},
				Steps: []map[string]int64{{"pull": ms(2800), "start": ms(120)}, {"pull": ms(2900), "start": ms(100)}, {"pull": ms(2700), "start": ms(110)}}}},
			{Downtime: &Downtime{Backend: "containerd-2.4", Image: "Large", Method: MethodRecreate, Samples: []int64{ms(500), ms(520), ms(510)},
				Steps: []map[string]int64{{"remove-sandbox": ms(100)}, {"remove-sandbox": ms(100)}, {"remove-sandbox": ms(100)}}}},
			{Downtime: &Downtime{Backend: "containerd-2.4", Image: "Large over 1 Gbit/s", Method: MethodSwap, Samples: []int64{ms(100)}}},
			{Downtime: &Downtime{Backend: "containerd-2.4", Image: "Large over 1 Gbit/s", Method: MethodKubelet, Samples: []int64{ms(900)}}},
			{Latency: &Latency{Backend: InProcessBackend, Method: "Version", Concurrency: 1, Phase: "before",
				Direct: Summary{N: 2000, P50: us(50)}, Proxy: Summary{N: 2000, P50: us(120)}}},
			// BenchmarkRelayCost: the floor and the router at 1 and 16 callers.
			{Latency: &Latency{Backend: InProcessBackend, Method: "Version", Concurrency: 1, Phase: "relay cost", Variant: GoFloor,
				Direct: Summary{N: 3000, P50: us(30)}, Proxy: Summary{N: 3000, P50: us(80)}, ProxyCPUPerCall: us(40), ProxyInstrPerCall: 9800,
				WindowP50: []int64{us(80), us(88)}, Conditions: quiet}},
			{Latency: &Latency{Backend: InProcessBackend, Method: "Version", Concurrency: 1, Phase: "relay cost", Variant: "relay: HTTP/2 router (as served)",
				Direct: Summary{N: 3000, P50: us(30)}, Proxy: Summary{N: 3000, P50: us(105)}, ProxyCPUPerCall: us(60), ProxyInstrPerCall: 50000, Conditions: quiet}},
			{Latency: &Latency{Backend: InProcessBackend, Method: "Version", Concurrency: 16, Phase: "relay cost", Variant: GoFloor,
				Direct: Summary{N: 3000, P50: us(300)}, Proxy: Summary{N: 3000, P50: us(400)}, ProxyCPUPerCall: us(8), Conditions: quiet}},
			{Latency: &Latency{Backend: InProcessBackend, Method: "Version", Concurrency: 16, Phase: "relay cost", Variant: "relay: HTTP/2 router (as served)",
				Direct: Summary{N: 3000, P50: us(300)}, Proxy: Summary{N: 3000, P50: us(500)}, ProxyCPUPerCall: us(12), Conditions: quiet}},
		},
	}
}

func TestRender(t *testing.T) {
	var buf bytes.Buffer
	if err := Render(&buf, sampleInput()); err != nil {
		t.Fatal(err)
	}
	md := buf.String()
	for _, want := range []string{
		"AMD EPYC, 2 CPUs",
		"containerd 2.4.2",
		"| Version | 1 | 60 µs | 100 µs | 40 µs | 1.67× |",   // added 40 µs: within
		"ListContainers (100 containers) p50 ≤ 1.05× direct", // target row
		"| 1.10× (p99 1.05×) | **FAIL** |",                   // 1100/1000 > 1.05
		"VmRSS 20.0 MiB",
		"started with `GOMAXPROCS=1`",
		"`test/bench/floorrelay`: a Go byte relay",
		"| reference, *floor: Go byte relay*: p50 added ≤ 50 µs, every call, 1 caller | containerd-2.4 | 1 of 2 calls within; largest: Version +70 µs | not met even by the floor |",
		"| reference, *floor: Go byte relay*: ListContainers p50 ≤ 1.05× direct, 1 caller | containerd-2.4 | 1.03× | met by the floor |",
		"cannot be met by any process",
		"| reference, *Large over 1 Gbit/s*: swap downtime ≤ 0.1× kubelet-style replacement | containerd-2.4 | 0.11× (100 ms ÷ 900 ms) | not met over this link |",
		"pull the same image over a paced registry link",
		"| reference, *floor: one StartContainer*: ≤ 0.1× kubelet-style replacement (Large) | containerd-2.4 | 0.037× (110 ms ÷ 3.00 s) | met by the floor |",
		"the cheapest floor (*floor: Go byte relay*, a relay that only copies bytes) added 70 µs to the same call",
		"its own code (the HTTP/2 router, relay and interceptors) is 0.3%",
		"inplaced added no more than that. No swap runs here, so none of the calls measured is intercepted: inplaced's HTTP/2 router",
		"with no gRPC server or client on the path",
		"### What relaying costs a process of its own",
		"| Version | 1 | floor: Go byte relay | 30 µs | 80 µs | 50 µs | – | 40 µs | – | 9.8 k | – | 10% | other work 0.10 CPU; steal 0.4%;",
		"| Version | 1 | relay: HTTP/2 router (as served) | 30 µs | 105 µs | 75 µs | 1.50× | 60 µs | 1.50× | 50.0 k | 5.10× | – |",
		"| Version | 16 | relay: HTTP/2 router (as served) | 300 µs | 500 µs | 200 µs | 2.00× | 12 µs | 1.50× | – | – | – |",
		"it made 30 system calls and 14 context switches",
		"`pvm_irq_enable` (50%), is where this paravirtualized",
		"| Version | 1 | GOMAXPROCS=1 | 60 µs | 90 µs | 30 µs | 1.50× | 200 µs | 250 µs | 1.25× | 40 µs |",
		"swap downtime ≤ 0.1× kubelet-style replacement (Large) | containerd-2.4 | 0.037× | **PASS**",
		"swap downtime ≤ 0.3× pod recreation (Large) | containerd-2.4 | 0.22× | **PASS**",
		"without the RemovePodSandbox step",
		"| before | interceptors | Version | 1 | 50 µs | 120 µs | 70 µs | 2.40× |",
		"*Placeholder:*",
		"load average exceeded the CPU count",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	if strings.Contains(md, "| relay cost |") {
		t.Errorf("BenchmarkRelayCost's cells in BenchmarkRelay's table:\n%s", md)
	}
}

func TestRenderResize(t *testing.T) {
	in := sampleInput()
	in.ResizeFile = true
	in.GoBench = []GoBench{
		{Name: "BenchmarkResize/containerd-2.4/inplaced", N: 20, Metrics: map[string]float64{"ns/op": 50e6}},
		{Name: "BenchmarkResize/containerd-2.4/cri", N: 30, Metrics: map[string]float64{"ns/op": 40e6}},
		{Name: "BenchmarkResize/containerd-2.4/cgroup", N: 300000, Metrics: map[string]float64{"ns/op": 4000}},
	}
	var buf bytes.Buffer
	if err := Render(&buf, in); err != nil {
		t.Fatal(err)
	}
	want := "| containerd-2.4 | 50 ms (20 ops) | 40 ms (30 ops) | 4 µs (300000 ops) | 1.25× | 12500× | 10000× |"
	if !strings.Contains(buf.String(), want) {
		t.Errorf("markdown lacks %q:\n%s", want, buf.String())
	}
}

func TestRenderSwapRuntime(t *testing.T) {
	var b strings.Builder
	in := Input{GoBench: []GoBench{{Name: "BenchmarkSwapRuntime/containerd-2.4", N: 1, Metrics: map[string]float64{
		"runsc-ms": 212, "runc-ms": 61, "runsc/runc": 3.47, "runsc-start-new-ms": 201, "runc-start-new-ms": 55, "reps": 5}}}}
	if err := Render(&b, in); err != nil {
		t.Fatal(err)
	}
	if want := "| containerd-2.4 | 212 ms | 61 ms | 3.47× | 201 ms | 55 ms | 5 |"; !strings.Contains(b.String(), want) {
		t.Errorf("section 4 lacks %q:\n%s", want, b.String()[strings.Index(b.String(), "## 4."):])
	}
}

func TestRenderHoldRelease(t *testing.T) {
	var b strings.Builder
	in := Input{GoBench: []GoBench{{Name: "BenchmarkHoldRelease/containerd-2.4", N: 1, Metrics: map[string]float64{
		"paced-failed": 0, "paced-late": 0, "paced-slowest-ms": 200, "paced-worst-ms": 230,
		"batch-failed": 0, "batch-late": 21, "batch-slowest-ms": 1030, "batch-worst-ms": 1041, "reps": 5}},
		{Name: "BenchmarkHoldRelease/containerd-1.6", N: 1, Metrics: map[string]float64{
			"paced-failed": 0, "paced-late": 2, "paced-slowest-ms": 200, "paced-worst-ms": 1010, "reps": 5}}}}
	if err := Render(&b, in); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"| containerd-2.4 | 0 | 0 | 200 ms / 230 ms | 0 | 21 | 1.03 s / 1.04 s | 5 | **PASS** |",
		"| containerd-1.6 | 0 | 2 | 200 ms / 1.01 s |",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("the release table lacks %q:\n%s", want, b.String()[strings.Index(b.String(), "### The release"):])
		}
	}
}

func TestRenderSwapHold(t *testing.T) {
	var b strings.Builder
	in := Input{GoBench: []GoBench{{Name: "BenchmarkSwapHold/containerd-2.4", N: 1, Metrics: map[string]float64{
		"hold-failed": 0, "hold-slowest-ms": 180, "hold-gap-ms": 190, "slowest/limit": 0.8, "off-failed": 31, "off-slowest-ms": 12, "reps": 5}},
		{Name: "BenchmarkSwapHold/containerd-1.6", N: 1, Metrics: map[string]float64{
			"hold-failed": 2, "hold-slowest-ms": 180, "hold-gap-ms": 190, "slowest/limit": 0.8, "off-failed": 31, "off-slowest-ms": 12, "reps": 5}}}}
	if err := Render(&b, in); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"| containerd-2.4 | 0 | 180 ms | 190 ms | 0.80 | 31 | 12 ms | 5 | **PASS** |",
		"| containerd-1.6 | 2 | 180 ms | 190 ms | 0.80 | 31 | 12 ms | 5 | **FAIL** |",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("section 5 lacks %q:\n%s", want, b.String()[strings.Index(b.String(), "## 5."):])
		}
	}
}

func TestRenderSwapOverlap(t *testing.T) {
	var b strings.Builder
	m := func(failed, excess, early float64) map[string]float64 {
		return map[string]float64{"stop-first-failed": 0, "stop-first-slowest-ms": 210, "stop-first-excess-ms": 205, "stop-first-ended": 100,
			"stop-first-closed-early": 0, "overlap-failed": failed, "overlap-slowest-ms": 4.5, "overlap-excess-ms": excess,
			"overlap-ended": 100, "overlap-closed-early": early, "reps": 5}
	}
	in := Input{GoBench: []GoBench{{Name: "BenchmarkSwapOverlap/containerd-2.4", N: 1, Metrics: m(0, 2, 0)},
		{Name: "BenchmarkSwapOverlap/containerd-1.6", N: 1, Metrics: m(0, 9, 0)},
		{Name: "BenchmarkSwapOverlap/containerd-x", N: 1, Metrics: m(0, 2, 1)}}}
	if err := Render(&b, in); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"### Stop-first with the hold against the overlap swap",
		"| containerd-2.4 | 0 | 210 ms | 205 ms | 0 / 100 | 0 | 4.50 ms | 2.00 ms | 0 / 100 | 5 | **PASS** |",
		"| containerd-1.6 | 0 | 210 ms | 205 ms | 0 / 100 | 0 | 4.50 ms | 9.00 ms | 0 / 100 | 5 | **FAIL** |",
		"| containerd-x | 0 | 210 ms | 205 ms | 0 / 100 | 0 | 4.50 ms | 2.00 ms | 1 / 100 | 5 | **FAIL** |",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("section 5 lacks %q:\n%s", want, b.String()[strings.Index(b.String(), "## 5."):])
		}
	}
}
