package soak

import (
	"testing"
	"time"
)

func TestSettingsFromEnv(t *testing.T) {
	env := func(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }
	if _, ok, _ := SettingsFromEnv(env(nil)); ok {
		t.Fatal("no SOAK_DURATION: want not ok")
	}
	s, ok, err := SettingsFromEnv(env(map[string]string{"SOAK_DURATION": "30m"}))
	if !ok || err != nil || s.Duration != 30*time.Minute || s.Pods != DefaultPods || s.CheckEvery != 15*time.Second {
		t.Fatalf("30m: %+v %v %v", s, ok, err)
	}
	for _, bad := range []map[string]string{
		{"SOAK_DURATION": "soon"}, {"SOAK_DURATION": "10s"},
		{"SOAK_DURATION": "5m", "SOAK_PODS": "2"}, {"SOAK_DURATION": "5m", "SOAK_CHURN_EVERY": "-1s"},
	} {
		if _, ok, err := SettingsFromEnv(env(bad)); !ok || err == nil {
			t.Errorf("%v: want an error", bad)
		}
	}
}

func TestSchedule(t *testing.T) {
	for _, tc := range []struct {
		d      time.Duration
		rounds int
		hold   time.Duration
	}{{5 * time.Minute, 1, 20 * time.Second}, {30 * time.Minute, 2, time.Minute}, {2 * time.Hour, 8, time.Minute}} {
		fs := Schedule(tc.d)
		if len(fs) != tc.rounds*len(AllFaults) {
			t.Fatalf("%s: %d faults, want %d", tc.d, len(fs), tc.rounds*len(AllFaults))
		}
		seen := map[FaultKind]int{}
		for i, f := range fs {
			seen[f.Kind]++
			if f.At < tc.d/10 || f.At+f.Hold > tc.d*8/10 {
				t.Errorf("%s: fault %d (%s) at %s holding %s is outside [10%%, 80%%]", tc.d, i, f.Kind, f.At, f.Hold)
			}
			if i > 0 && f.At < fs[i-1].At+fs[i-1].Hold+10*time.Second {
				t.Errorf("%s: fault %d at %s overlaps the previous one (%s + %s)", tc.d, i, f.At, fs[i-1].At, fs[i-1].Hold)
			}
			if (f.Kind == FaultAPIServerDown || f.Kind == FaultStateFull) != (f.Hold == tc.hold) {
				t.Errorf("%s: %s holds %s", tc.d, f.Kind, f.Hold)
			}
		}
		for _, k := range AllFaults {
			if seen[k] != tc.rounds {
				t.Errorf("%s: %s %d times, want %d", tc.d, k, seen[k], tc.rounds)
			}
		}
	}
}

func TestPickChurn(t *testing.T) {
	seen := map[ChurnKind]int{}
	for i := range 1000 {
		seen[PickChurn(float64(i)/1000)]++
	}
	for _, k := range ChurnKinds() {
		if seen[k] == 0 {
			t.Errorf("%s never picked", k)
		}
	}
	if seen[ChurnCrashSwap] >= seen[ChurnImagePatch] {
		t.Errorf("crash swaps (%d) as often as image patches (%d)", seen[ChurnCrashSwap], seen[ChurnImagePatch])
	}
}

func TestAttribute(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 7, 0, 0, 0, time.UTC)
	ws := []Window{
		{Fault: 0, Start: t0, End: t0.Add(5 * time.Second), BackendDown: true},
		{Fault: 1, Start: t0.Add(time.Minute), End: t0.Add(2 * time.Minute)}, // API server down
	}
	fails := []CallFailure{
		{At: t0.Add(time.Second), Code: "Unavailable"},                                       // allowed
		{At: t0.Add(6 * time.Second), Code: "Unavailable"},                                   // in the grace: allowed
		{At: t0.Add(2 * time.Second), Code: "Unknown"},                                       // wrong code
		{At: t0.Add(90 * time.Second), Code: "Unavailable"},                                  // backend was up
		{At: t0.Add(10 * time.Minute), Code: "Unavailable"},                                  // no fault
		{At: t0.Add(-time.Millisecond), Code: "Unavailable"},                                 // before the fault
		{At: t0.Add(3 * time.Second), Code: "Unknown", Message: BackendStarting},             // containerd initialising: allowed
		{At: t0.Add(90 * time.Second), Code: "Unknown", Message: BackendStarting},            // but not with the backend up
		{At: t0.Add(3 * time.Second), Code: "Unknown", Message: "server is not initialized"}, // another message
		{At: t0.Add(5 * time.Second), Took: 5 * time.Second, Code: "DeadlineExceeded"},       // sent as the backend went down: allowed
		{At: t0.Add(5 * time.Second), Took: 6 * time.Second, Code: "DeadlineExceeded"},       // sent before it went down
		{At: t0.Add(65 * time.Second), Took: time.Second, Code: "DeadlineExceeded"},          // the API server was down, not the backend
	}
	fault, allowed := Attribute(fails, ws, 2*time.Second)
	wantFault := []int{0, 0, 0, 1, -1, -1, 0, 1, 0, 0, 0, 1}
	wantAllowed := []bool{true, true, false, false, false, false, true, false, false, true, false, false}
	for i := range fails {
		if fault[i] != wantFault[i] || allowed[i] != wantAllowed[i] {
			t.Errorf("failure %d: fault %d allowed %v, want %d %v", i, fault[i], allowed[i], wantFault[i], wantAllowed[i])
		}
	}
}

func TestFlat(t *testing.T) {
	ref := Sample{RSS: 40 << 20, Goroutines: 200, FDs: 60}
	if ok, why := Flat(ref, Sample{RSS: 70 << 20, Goroutines: 250, FDs: 90}); !ok {
		t.Errorf("within bounds judged a leak: %s", why)
	}
	if ok, _ := Flat(ref, Sample{RSS: 90 << 20, Goroutines: 200, FDs: 60}); ok {
		t.Error("RSS 40 → 90 MiB judged flat")
	}
	if ok, _ := Flat(ref, Sample{RSS: 40 << 20, Goroutines: 400, FDs: 60}); ok {
		t.Error("goroutines 200 → 400 judged flat")
	}
	if ok, _ := Flat(ref, Sample{RSS: 40 << 20, Goroutines: 200, FDs: 200}); ok {
		t.Error("fds 60 → 200 judged flat")
	}
}

func TestParseMetrics(t *testing.T) {
	text := "# HELP go_goroutines x\n# TYPE go_goroutines gauge\ngo_goroutines 123\nprocess_open_fds 45\nprocess_resident_memory_bytes 3.3554432e+07\ngo_threads 9\n"
	s, err := ParseMetrics(text)
	if err != nil || s.Goroutines != 123 || s.FDs != 45 || s.RSS != 32<<20 {
		t.Fatalf("%+v %v", s, err)
	}
	if _, err := ParseMetrics("go_goroutines 1\n"); err == nil {
		t.Fatal("missing gauges: want an error")
	}
}
