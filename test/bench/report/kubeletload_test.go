package report

import (
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// loadFixture is a 10-minute window sampled every 5 s: inplaced at 1/20
// of containerd's CPU, goroutines scraped every 15 s with one in-flight
// call now and then.
func loadFixture(grow bool) *KubeletLoad {
	k := &KubeletLoad{Backend: "containerd-2.4", Pods: 60, Image: "App1", WindowNs: int64(10 * time.Minute),
		SampleEveryNs: int64(5 * time.Second), ScrapeEveryNs: int64(15 * time.Second), Started: time.Unix(0, 0),
		Calls: map[string]int64{"ListContainers": 600, "ListPodSandbox": 600}, Scrapes: 40, ScrapeCPUNs: int64(time.Millisecond),
		VmHWMKiB: 25 << 10, Shims: 60, PodsRunning: 60,
		Conditions: &Conditions{NProc: 2, ForeignCPU: 0.1, Steal: new(0.01)}}
	for i := 1; i <= 120; i++ {
		s := LoadSample{AtNs: int64(i) * int64(5*time.Second), InplacedCPUNs: int64(i) * int64(5*time.Millisecond),
			ContainerdCPUNs: int64(i) * int64(100*time.Millisecond), RSSKiB: 20 << 10, FDs: 30, Threads: 9, Goroutines: -1}
		if i%3 == 0 {
			s.Goroutines = 40
			if i%9 == 0 {
				s.Goroutines = 43 // a call in flight
			}
			if grow && i > 100 {
				s.Goroutines = 41
			}
		}
		k.Samples = append(k.Samples, s)
	}
	return k
}

func TestKubeletLoadVerdicts(t *testing.T) {
	k := loadFixture(false)
	if r := k.CPURatio(); r < 0.0499 || r > 0.0501 {
		t.Fatalf("CPURatio %v", r)
	}
	if lo, hi, ok := k.MinuteRange(2, sampleGoroutines); !ok || lo != 40 || hi != 43 {
		t.Fatalf("minute 2 goroutines %d–%d %v", lo, hi, ok)
	}
	if lo, _, ok := k.MinuteRange(10, sampleFDs); !ok || lo != 30 {
		t.Fatalf("minute 10 fds %d %v", lo, ok)
	}
	for _, v := range KubeletLoadVerdicts(k) {
		if v.Result != "**PASS**" {
			t.Errorf("%s: %s: %s", v.Target, v.Measured, v.Result)
		}
	}
	g := loadFixture(true)
	if _, _, grew, ok := g.Growth(sampleGoroutines); !grew || !ok {
		t.Fatalf("growth not seen")
	}
	g.Conditions.ForeignCPU = 1.5
	g.Samples[len(g.Samples)-1].RSSKiB = 31 << 10
	var got []string
	for _, v := range KubeletLoadVerdicts(g) {
		got = append(got, v.Result)
	}
	// CPU, RSS, goroutines, fds.
	want := []string{"unreliable (other work used 1.5 of 2 CPUs)", "**FAIL**", "**FAIL**", "**PASS**"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("verdicts %q, want %q", got, want)
	}
	// Steal above 5% of the machine's CPU time takes the CPU verdict, and
	// only it.
	st := loadFixture(false)
	st.Conditions.Steal = new(0.07)
	if v := KubeletLoadVerdicts(st); v[0].Result != "unreliable (the hypervisor stole 7.0% of the CPU time)" || v[1].Result != "**PASS**" {
		t.Errorf("verdicts under steal: %+v", v)
	}
	var b strings.Builder
	if err := RenderKubeletLoad(&b, KubeletLoadRun{NProc: 2, Loads: []*KubeletLoad{k, g}}, "ENV"); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"| 10 | 60 ms | 1.20 s | 5.0% |", "| ListContainers | 600 | 1.00 |", "40 → 41 | **FAIL**",
		"Conditions: other work 0.10 CPU; steal 1.0%;", "or when steal exceeded 5% of the machine's CPU time"} {
		if !strings.Contains(b.String(), s) {
			t.Errorf("document lacks %q:\n%s", s, b.String())
		}
	}
}

// floorFixture is a 5-minute floor window sampled every 5 s: the relay at
// relayMs per sample, containerd at 100 ms per sample.
func floorFixture(relayMs int64) *LoadFloor { return floorFixtureOf(GoFloor, relayMs) }

func floorFixtureOf(relay string, relayMs int64) *LoadFloor {
	f := &LoadFloor{Relay: relay, ReconnectNs: int64(1200 * time.Millisecond), SettleNs: int64(30 * time.Second),
		Started: time.Unix(700, 0), WindowNs: int64(5 * time.Minute), RelayReadBytes: 300 << 20, PodsRunning: 60,
		Conditions: &Conditions{NProc: 2, ForeignCPU: 0.1, Steal: new(0.01)}}
	for i := int64(1); i <= 60; i++ {
		f.Samples = append(f.Samples, FloorSample{AtNs: i * int64(5*time.Second), RelayCPUNs: i * relayMs * int64(time.Millisecond),
			ContainerdCPUNs: i * int64(100*time.Millisecond), KubeletCPUNs: i * int64(50*time.Millisecond), RelayRSSKiB: 6 << 10})
	}
	return f
}

// TestKubeletLoadFloor: each floor window adds a reference row after the
// CPU verdict (met, not met, or unreliable under its own conditions),
// leaves inplaced's verdict alone, and is rendered beside inplaced's.
func TestKubeletLoadFloor(t *testing.T) {
	k := loadFixture(false)
	k.Floors = []*LoadFloor{floorFixture(1)}
	v := KubeletLoadVerdicts(k)
	if len(v) != 5 || v[0].Result != "**PASS**" || v[1].Result != "met by the floor" {
		t.Fatalf("verdicts %+v", v)
	}
	if want := "1.0% (60 ms ÷ 6.00 s over 5m0s); inplaced's 5.0% is 5.00× the floor's"; v[1].Measured != want {
		t.Errorf("floor row measured %q, want %q", v[1].Measured, want)
	}
	if !strings.HasPrefix(v[1].Target, "reference, *floor: Go byte relay* in inplaced's place") {
		t.Errorf("floor row target %q", v[1].Target)
	}
	k.Floors = []*LoadFloor{floorFixture(15)}
	if v := KubeletLoadVerdicts(k); v[1].Result != "not met even by the floor" || v[0].Result != "**PASS**" {
		t.Errorf("a floor above the target: %+v", v[:2])
	}
	k.Floors[0].Conditions.Steal = new(0.06)
	if v := KubeletLoadVerdicts(k); v[1].Result != "unreliable (the hypervisor stole 6.0% of the CPU time)" || v[0].Result != "**PASS**" {
		t.Errorf("a floor window under steal: %+v", v[:2])
	}

	k.Floors = []*LoadFloor{floorFixture(1), floorFixtureOf(SocatFloor, 2)}
	if v := KubeletLoadVerdicts(k); len(v) != 6 || !strings.HasPrefix(v[2].Target, "reference, *floor: socat -b 1 MiB* in inplaced's place") ||
		v[2].Measured != "2.0% (120 ms ÷ 6.00 s over 5m0s); inplaced's 5.0% is 2.50× the floor's" {
		t.Errorf("two floors: %+v", v)
	}
	var b strings.Builder
	if err := RenderKubeletLoad(&b, KubeletLoadRun{NProc: 2, Loads: []*KubeletLoad{k, loadFixture(false)}}, "ENV"); err != nil {
		t.Fatal(err)
	}
	md := b.String()
	for _, s := range []string{
		"**The floor windows.**",
		"| containerd-2.4 | reference, *floor: Go byte relay* in inplaced's place, its own window: its CPU ≤ 10% of containerd's | 1.0% (60 ms ÷ 6.00 s over 5m0s); inplaced's 5.0% is 5.00× the floor's | met by the floor |",
		"kubelet's first connection came through the relay 1.20 s after it listened; kubelet logged 0 `code = Unavailable` errors",
		"the relay read 300.0 MiB (both directions)",
		"| inplaced | 10m0s | 600 ms | 0.10% | 12.00 s | 5.0% | 0 ms | 20.0 MiB |",
		"| floor: Go byte relay | 5m0s | 60 ms | 0.02% | 6.00 s | 1.0% | 3.00 s | 6.0 MiB |",
		"| floor: socat -b 1 MiB | 5m0s | 120 ms | 0.04% | 6.00 s | 2.0% | 3.00 s | 6.0 MiB |",
		"inplaced's share of containerd's CPU ÷ *floor: Go byte relay*'s: **5.00×** (5.0% ÷ 1.0%).",
		"inplaced's share of containerd's CPU ÷ *floor: socat -b 1 MiB*'s: **2.50×** (5.0% ÷ 2.0%).",
	} {
		if !strings.Contains(md, s) {
			t.Errorf("document lacks %q:\n%s", s, md)
		}
	}
	if n := strings.Count(md, "The floor window with"); n != 2 {
		t.Errorf("%d floor windows described, want 2 (the second backend has none)", n)
	}

	// The results file keeps it.
	path := filepath.Join(t.TempDir(), "r.jsonl")
	t.Setenv(EnvResults, path)
	if err := Append(Record{KubeletLoad: k}); err != nil {
		t.Fatal(err)
	}
	recs, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	fs := recs[0].KubeletLoad.Floors
	if len(fs) != 2 || fs[1].Relay != SocatFloor {
		t.Fatalf("floors after a round trip: %+v", fs)
	}
	f := fs[0]
	if f.CPURatio() != k.Floors[0].CPURatio() || len(f.Samples) != 60 || f.Relay != GoFloor || *f.Conditions.Steal != 0.01 {
		t.Errorf("floor after a round trip: %+v", f)
	}
}
