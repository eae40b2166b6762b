package report

import (
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
