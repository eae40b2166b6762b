package report

import (
	"bytes"
	"strings"
	"testing"
)

func TestDrift(t *testing.T) {
	for _, c := range []struct {
		in   []int64
		want float64
	}{{nil, 0}, {[]int64{100}, 0}, {[]int64{100, 100, 100}, 0}, {[]int64{100, 130, 110}, 0.3}, {[]int64{200, 100}, 1}, {[]int64{0, 5}, 0}} {
		if got := Drift(c.in); got < c.want-1e-9 || got > c.want+1e-9 {
			t.Errorf("Drift(%v) = %v, want %v", c.in, got, c.want)
		}
	}
}

// TestUnreliable is the verdict rule: other work above half the CPUs,
// steal above 5% of the machine's CPU time, a floor that moved more than
// 30% between windows, or no recorded conditions make a verdict
// unreliable; the benchmark's own load does not.
func TestUnreliable(t *testing.T) {
	cond := func(foreign float64) *Conditions {
		return &Conditions{NProc: 2, Load1Start: 1.5, Load1Max: 2.5, RunQueueMean: 2, RunQueueMax: 5, ForeignCPU: foreign, Steal: new(0.01)}
	}
	stolen := func(steal *float64) *Conditions {
		c := cond(0.2)
		c.Steal = steal
		return c
	}
	px := func(c *Conditions) *Latency { return &Latency{Method: "Version", Conditions: c} }
	floor := func(c *Conditions, w ...int64) *Latency {
		return &Latency{Method: "Version", Variant: GoFloor, Conditions: c, WindowP50: w}
	}
	for _, c := range []struct {
		name  string
		cells []*Latency
		want  string // substring; "" means reliable
	}{
		{"quiet, own load high", []*Latency{px(cond(0.2)), floor(cond(0.2), 100, 110, 105, 120)}, ""},
		{"exactly at the bound", []*Latency{px(cond(1.0)), floor(cond(1.0), 100, 130)}, ""},
		{"other work above half the CPUs", []*Latency{px(cond(1.3)), floor(cond(0.2), 100, 100)}, "other work used 1.3 of 2 CPUs"},
		{"floor moved", []*Latency{px(cond(0.2)), floor(cond(0.2), 100, 131, 120, 110)}, "Go byte relay moved 31% between rounds"},
		{"floor moved, direct shown but not judged", []*Latency{{Method: "Version", Variant: GoFloor, Conditions: cond(0.2),
			WindowP50: []int64{100, 140}, DirectWindowP50: []int64{80, 100}}}, "Go byte relay moved 40% between rounds (direct 25%)"},
		{"direct moving alone is not a hygiene failure", []*Latency{{Method: "Version", Variant: GoFloor, Conditions: cond(0.2),
			WindowP50: []int64{100, 110}, DirectWindowP50: []int64{80, 200}}}, ""},
		{"inplaced moving is not a hygiene failure", []*Latency{{Method: "Version", Conditions: cond(0.2), WindowP50: []int64{100, 300}}}, ""},
		{"no conditions", []*Latency{px(nil)}, "load not recorded"},
		{"foreign unknown", []*Latency{px(cond(-1))}, "load from other work unknown"},
		{"both reasons, once each", []*Latency{px(cond(1.5)), floor(cond(1.5), 100, 200)}, "other work used 1.5 of 2 CPUs; Go byte relay moved 100% between rounds"},
		{"four CPUs allow two", []*Latency{px(&Conditions{NProc: 4, ForeignCPU: 1.9, Steal: new(0.0)})}, ""},
		{"steal at the bound", []*Latency{px(stolen(new(0.05))), floor(stolen(new(0.05)), 100, 100)}, ""},
		{"steal above 5% in one cell", []*Latency{px(stolen(new(0.02))), floor(stolen(new(0.063)), 100, 100)}, "the hypervisor stole 6.3% of the CPU time"},
		{"steal not recorded", []*Latency{px(stolen(nil))}, "steal not recorded"},
		{"other work and steal", []*Latency{px(&Conditions{NProc: 2, ForeignCPU: 1.2, Steal: new(0.08)})},
			"other work used 1.2 of 2 CPUs; the hypervisor stole 8.0% of the CPU time"},
	} {
		got := Unreliable(c.cells...)
		if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
			t.Errorf("%s: Unreliable = %q, want %q", c.name, got, c.want)
		}
	}
}

// TestRenderUnderLoad: a target whose cells were measured under load is
// reported as unreliable, not as PASS or FAIL; the per-call rows compare
// inplaced with the Go floor.
func TestRenderUnderLoad(t *testing.T) {
	us := func(n int64) int64 { return n * 1e3 }
	busy := &Conditions{NProc: 2, Load1Start: 3.9, Load1Max: 4.1, RunQueueMean: 5, RunQueueMax: 9, ForeignCPU: 1.6, Steal: new(0.012)}
	in := Input{Machine: Machine{NProc: 2}, Records: []Record{
		{Latency: &Latency{Backend: "b", Method: "Version", Concurrency: 1, Direct: Summary{P50: us(100)}, Proxy: Summary{P50: us(180)},
			ProxyCPUPerCall: us(60), Conditions: quiet}},
		{Latency: &Latency{Backend: "b", Method: "Version", Concurrency: 1, Variant: GoFloor, Direct: Summary{P50: us(100)}, Proxy: Summary{P50: us(150)},
			ProxyCPUPerCall: us(50), Conditions: quiet, WindowP50: []int64{us(150), us(155)}, DirectWindowP50: []int64{us(100), us(125)}}},
		{Latency: &Latency{Backend: "b", Method: "Version", Concurrency: 16, Direct: Summary{P50: us(500)}, Proxy: Summary{P50: us(900)},
			ProxyCPUPerCall: us(40), Conditions: busy}},
		{Latency: &Latency{Backend: "b", Method: "Version", Concurrency: 16, Variant: GoFloor, Direct: Summary{P50: us(500)}, Proxy: Summary{P50: us(600)},
			ProxyCPUPerCall: us(30), Conditions: busy, WindowP50: []int64{us(600), us(610)}}},
	}}
	var buf bytes.Buffer
	if err := Render(&buf, in); err != nil {
		t.Fatal(err)
	}
	md := buf.String()
	for _, want := range []string{
		"| p50 added ≤ 2× the Go floor's added p50, every call, 1 caller | b | 1 of 1 calls within; largest: Version 1.60× (+80 µs vs +50 µs) | **PASS** |",
		"| CPU per relayed call ≤ 1.5× the Go floor's, every call, 1 caller | b | 1 of 1 calls within; largest: Version 1.20× (60 µs vs 50 µs) | **PASS** |",
		"| p50 added ≤ 2× the Go floor's added p50, every call, 16 callers | b | 0 of 1 calls within; largest: Version 4.00× (+400 µs vs +100 µs) | unreliable (other work used 1.6 of 2 CPUs) |",
		"| p50 added ≤ 50 µs, every call, 1 caller | b | 0 of 1 calls within; largest: Version +80 µs | **FAIL** |",
		"| p50 added ≤ 50 µs, every call, 16 callers | b | 0 of 1 calls within; largest: Version +400 µs | unreliable (other work used 1.6 of 2 CPUs) |",
		"An *unreliable* verdict was drawn from cells measured while other work",
		"other work 1.60 CPU; steal 1.2%; load 3.9→4.1; run queue 5.0 (max 9)",
		"when steal exceeded 5% of the machine's CPU time during one of its cells",
		"| Version | 1 | 80 µs | 50 µs | 1.60× | 60 µs | 50 µs | 1.20× | 3% | 25% | added **PASS**; CPU **PASS** |",
		"| Version | 1 | floor: Go byte relay | 100 µs | 150 µs | 50 µs | 1.50× | 0 µs | 0 µs | – | 50 µs | 3% | 25% |",
		"| Version | 16 | 400 µs | 100 µs | 4.00× | 40 µs | 30 µs | 1.33× | 2% | – | added unreliable (other work used 1.6 of 2 CPUs); CPU unreliable (other work used 1.6 of 2 CPUs) |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
}

// TestRenderVsBaseline: with another build of inplaced measured in the same
// rounds, the targets compare inplaced's p50 and CPU per call with it.
func TestRenderVsBaseline(t *testing.T) {
	us := func(n int64) int64 { return n * 1e3 }
	in := Input{Machine: Machine{NProc: 2}, Records: []Record{
		{Latency: &Latency{Backend: "b", Method: "Version", Concurrency: 1, Direct: Summary{P50: us(100)}, Proxy: Summary{P50: us(210)},
			ProxyCPUPerCall: us(60), Conditions: quiet}},
		{Latency: &Latency{Backend: "b", Method: "Version", Concurrency: 1, Variant: BaselinePrefix + "7ec0191", Direct: Summary{P50: us(100)},
			Proxy: Summary{P50: us(200)}, ProxyCPUPerCall: us(50), Conditions: quiet}},
	}}
	var buf bytes.Buffer
	if err := Render(&buf, in); err != nil {
		t.Fatal(err)
	}
	md := buf.String()
	for _, want := range []string{
		"| p50 ≤ 1.10× inplaced at 7ec0191 (same rounds), every call, 1 caller | b | 1 of 1 calls within; largest: Version 1.05× (210 µs vs 200 µs) | **PASS** |",
		"| CPU per relayed call ≤ 1.10× inplaced at 7ec0191's, every call, 1 caller | b | 0 of 1 calls within; largest: Version 1.20× (60 µs vs 50 µs) | **FAIL** |",
		"a second inplaced, built from commit `7ec0191`",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
}
