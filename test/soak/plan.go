// Package soak is the soak harness: a kubelet registered to a real API
// server runs SOAK_PODS pods (110, kubelet's default maximum) through inplaced
// in Kubernetes mode on a private containerd, under continuous churn (image
// patches, annotation swaps, env-from-metadata label changes, kubelet and
// inplacectl resizes, pods created and deleted, now and then a swap to a
// crashing image) and faults on a schedule (containerd killed and restarted,
// inplaced SIGKILLed and restarted, inplaced replaced by another build in the
// middle of a swap, the API server stopped, the state filesystem filled and
// freed). Invariants are checked all along and a markdown report is written.
//
// It runs only when SOAK_DURATION is set (`make soak`; `make test` runs it for
// 5 minutes on one backend). The decisions — the fault schedule, the churn
// mix, the verdict on each CRI call that failed — are pure functions here,
// unit-tested without a machine; soak_test.go carries them out.
package soak

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// Settings is what the environment asks of a run.
type Settings struct {
	Duration time.Duration // SOAK_DURATION: churn and faults, set-up not counted
	Pods     int           // SOAK_PODS, default 110
	// ReportDir is where soak-<backend>.md goes (SOAK_REPORT_DIR; empty: the
	// report is only logged).
	ReportDir string
	// CheckEvery is the invariant checker's period (SOAK_CHECK_EVERY, default 15s).
	CheckEvery time.Duration
	// ChurnEvery is the pause between two churn operations (SOAK_CHURN_EVERY,
	// default 1.5s).
	ChurnEvery time.Duration
}

// DefaultPods is kubelet's default maxPods.
const DefaultPods = 110

// SettingsFromEnv reads SOAK_*; ok is false when SOAK_DURATION is unset.
func SettingsFromEnv(getenv func(string) string) (s Settings, ok bool, err error) {
	raw := strings.TrimSpace(getenv("SOAK_DURATION"))
	if raw == "" {
		return s, false, nil
	}
	if s.Duration, err = time.ParseDuration(raw); err != nil || s.Duration < time.Minute {
		return s, true, fmt.Errorf("SOAK_DURATION=%q: want a duration of at least 1m (e.g. 30m)", raw)
	}
	s.Pods = DefaultPods
	if v := strings.TrimSpace(getenv("SOAK_PODS")); v != "" {
		if s.Pods, err = strconv.Atoi(v); err != nil || s.Pods < 5 {
			return s, true, fmt.Errorf("SOAK_PODS=%q: want a number ≥ 5", v)
		}
	}
	s.ReportDir = getenv("SOAK_REPORT_DIR")
	for _, d := range []struct {
		env string
		dst *time.Duration
		def time.Duration
	}{{"SOAK_CHECK_EVERY", &s.CheckEvery, 15 * time.Second}, {"SOAK_CHURN_EVERY", &s.ChurnEvery, 1500 * time.Millisecond}} {
		*d.dst = d.def
		if v := strings.TrimSpace(getenv(d.env)); v != "" {
			if *d.dst, err = time.ParseDuration(v); err != nil || *d.dst <= 0 {
				return s, true, fmt.Errorf("%s=%q: want a positive duration", d.env, v)
			}
		}
	}
	return s, true, nil
}

// FaultKind is one of the faults the schedule injects.
type FaultKind string

// The faults, in the order one round injects them.
const (
	FaultContainerdKill  FaultKind = "containerd killed and restarted"
	FaultInplacedKill    FaultKind = "inplaced SIGKILLed and restarted"
	FaultInplacedUpgrade FaultKind = "inplaced replaced by another build in the middle of a swap"
	FaultAPIServerDown   FaultKind = "API server stopped"
	FaultStateFull       FaultKind = "state filesystem filled, then freed"
)

// AllFaults is one round of faults.
var AllFaults = []FaultKind{FaultContainerdKill, FaultInplacedKill, FaultInplacedUpgrade, FaultAPIServerDown, FaultStateFull}

// ScheduledFault is a fault at an offset from the start of the churn.
type ScheduledFault struct {
	At   time.Duration
	Kind FaultKind
	// Hold is how long the fault lasts where it has a length (the API server
	// down, the filesystem full); 0 for the others.
	Hold time.Duration
}

// Schedule spreads rounds of AllFaults evenly over [10%, 80%] of d: one round
// per 15 minutes (at least one), so a 5-minute run has each fault once and a
// 30-minute run twice. The last 20% is quiet: it is where the resources are
// judged flat and everything must settle. The API server outage and the full
// filesystem last d/30, between 20 s and 1 minute (the minute at 30m).
func Schedule(d time.Duration) []ScheduledFault {
	rounds := max(1, int(d/(15*time.Minute)))
	n := rounds * len(AllFaults)
	first, last := d/10, d*8/10
	step := (last - first) / time.Duration(n)
	hold := min(max(d/30, 20*time.Second), time.Minute)
	var out []ScheduledFault
	for i := range n {
		k := AllFaults[i%len(AllFaults)]
		f := ScheduledFault{At: first + time.Duration(i)*step, Kind: k}
		if k == FaultAPIServerDown || k == FaultStateFull {
			f.Hold = hold
		}
		out = append(out, f)
	}
	return out
}

// ChurnKind is one kind of churn operation.
type ChurnKind string

// The churn operations.
const (
	ChurnImagePatch    ChurnKind = "image patch (kubectl set image)"
	ChurnAnnotationEnv ChurnKind = "env swap by annotation"
	ChurnLabelEnv      ChurnKind = "label change, env from metadata"
	ChurnKubeletResize ChurnKind = "kubelet resize (pods/resize)"
	ChurnCtlResize     ChurnKind = "inplacectl resize"
	ChurnRecreate      ChurnKind = "pod deleted and a new one created"
	ChurnCrashSwap     ChurnKind = "swap to a crashing image (annotation)"
)

// churnMix is each kind's weight out of its sum: swaps dominate, a crash now
// and then.
var churnMix = []struct {
	kind   ChurnKind
	weight int
}{
	{ChurnImagePatch, 6}, {ChurnAnnotationEnv, 4}, {ChurnLabelEnv, 3}, {ChurnKubeletResize, 3},
	{ChurnCtlResize, 3}, {ChurnRecreate, 3}, {ChurnCrashSwap, 1},
}

// ChurnKinds lists the kinds in report order.
func ChurnKinds() []ChurnKind {
	out := make([]ChurnKind, len(churnMix))
	for i, m := range churnMix {
		out[i] = m.kind
	}
	return out
}

// PickChurn maps r in [0, 1) to a kind by the mix's weights.
func PickChurn(r float64) ChurnKind {
	total := 0
	for _, m := range churnMix {
		total += m.weight
	}
	x := int(r * float64(total))
	for _, m := range churnMix {
		if x < m.weight {
			return m.kind
		}
		x -= m.weight
	}
	return churnMix[len(churnMix)-1].kind
}

// RestartsAllowed is how much kubelet's restart count of the changed
// container may grow by one churn operation: a swap that commits starts one
// container; a swap to a crashing image starts the crashing one and then the
// old config again; a resize starts none.
func RestartsAllowed(k ChurnKind) int {
	switch k {
	case ChurnImagePatch, ChurnAnnotationEnv, ChurnLabelEnv:
		return 1
	case ChurnCrashSwap:
		return 2
	default:
		return 0
	}
}

// Window is a span of time in which a fault had a part of the stack down.
type Window struct {
	Fault      int // index into the run's faults
	Start, End time.Time
	// BackendDown: CRI calls through inplaced may fail in this window (the
	// runtime or inplaced itself was down); the API server and the full
	// filesystem are not such windows.
	BackendDown bool
}

// CallFailure is a CRI call through inplaced that failed.
type CallFailure struct {
	At      time.Time     // when the call returned
	Took    time.Duration // how long it waited for its answer
	Method  string
	Code    string
	Message string
}

// BackendStarting is containerd's own answer to CRI calls between its
// socket coming up and its CRI service being initialised (its instrumented
// service's checkInitialized): a plain error, so gRPC's Unknown. inplaced
// passes the backend's answers through unchanged, as kubelet would get them
// without it; the soak counts this one as the backend being down.
const BackendStarting = "server is not initialized yet"

// Label is how the report names the failure's kind: the code, and for the
// backend's start-up answer its message.
func (f CallFailure) Label() string {
	if f.starting() {
		return f.Code + " (" + BackendStarting + ")"
	}
	return f.Code
}

func (f CallFailure) starting() bool { return f.Code == "Unknown" && f.Message == BackendStarting }

// waitedOnDownBackend says whether f is a call that ran out of its own
// deadline while the backend was down: sent after w began, answered by
// nobody. Seen once in CI (2026-12-07: 1 of 2362 probe calls, sent in the
// first second of a containerd kill, cause not found: docs/reliability.md);
// kubelet retries it as it retries Unavailable.
func (f CallFailure) waitedOnDownBackend(w Window) bool {
	return f.Code == "DeadlineExceeded" && !f.At.Add(-f.Took).Before(w.Start)
}

// Attribute gives each failure the fault window it fell into (−1: none) and
// whether it is allowed: only in a window with the backend down, and only
// with Unavailable, the backend's own start-up answer (BackendStarting) or
// the caller's deadline for a call sent after the backend went down.
// grace extends each window past its end (the client's reconnect, the
// backend's initialisation).
func Attribute(fails []CallFailure, ws []Window, grace time.Duration) (fault []int, allowed []bool) {
	fault, allowed = make([]int, len(fails)), make([]bool, len(fails))
	for i, f := range fails {
		fault[i] = -1
		for _, w := range ws {
			if !f.At.Before(w.Start) && !f.At.After(w.End.Add(grace)) {
				fault[i] = w.Fault
				allowed[i] = w.BackendDown && (f.Code == "Unavailable" || f.starting() || f.waitedOnDownBackend(w))
				break
			}
		}
	}
	return fault, allowed
}

// Sample is inplaced's footprint at a moment, from its metrics endpoint.
type Sample struct {
	At         time.Time
	PID        int
	RSS        int64 // process_resident_memory_bytes
	Goroutines int   // go_goroutines
	FDs        int   // process_open_fds
}

// Flat judges inplaced's footprint after warm-up: the last sample against the
// reference (minute 5, or the run's middle when it is shorter). The bounds
// leave room for what a node's churn legitimately moves — a few pods more
// or fewer, a swap in flight, the GC's cycle — and catch a leak: RSS at most
// 1.5× + 16 MiB, goroutines at most +60, fds at most +40.
func Flat(ref, end Sample) (ok bool, why string) {
	var bad []string
	if end.RSS > ref.RSS*3/2+16<<20 {
		bad = append(bad, fmt.Sprintf("RSS %s → %s", MiB(ref.RSS), MiB(end.RSS)))
	}
	if end.Goroutines > ref.Goroutines+60 {
		bad = append(bad, fmt.Sprintf("goroutines %d → %d", ref.Goroutines, end.Goroutines))
	}
	if end.FDs > ref.FDs+40 {
		bad = append(bad, fmt.Sprintf("fds %d → %d", ref.FDs, end.FDs))
	}
	return len(bad) == 0, strings.Join(bad, ", ")
}

// MiB formats bytes as MiB with one decimal.
func MiB(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// ParseMetrics picks the three footprint gauges out of Prometheus text.
func ParseMetrics(text string) (s Sample, err error) {
	found := 0
	for _, line := range strings.Split(text, "\n") {
		name, val, ok := strings.Cut(line, " ")
		if !ok || strings.HasPrefix(line, "#") {
			continue
		}
		f, perr := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if perr != nil {
			continue
		}
		switch name {
		case "process_resident_memory_bytes":
			s.RSS, found = int64(f), found+1
		case "go_goroutines":
			s.Goroutines, found = int(f), found+1
		case "process_open_fds":
			s.FDs, found = int(f), found+1
		}
	}
	if found != 3 {
		return s, fmt.Errorf("metrics: found %d of process_resident_memory_bytes, go_goroutines, process_open_fds", found)
	}
	return s, nil
}

// reportDir returns where to write reports, made if needed.
func reportDir(dir string) (string, error) {
	if dir == "" {
		return "", nil
	}
	return dir, os.MkdirAll(dir, 0o755)
}
