// Package report carries what the benchmarks in test/bench measure to
// docs/benchmarks.md.
//
// The benchmarks append one JSON Record per line to the file named by
// $INPLACED_BENCH_RESULTS (nothing is written when it is unset, so a plain
// `go test -bench` works too). hack/bench.sh then runs test/bench/benchdoc,
// which reads those records, the `go test -bench` output (for benchmarks that
// report only through the testing package, like the resize benchmark) and
// the machine's facts, and renders the markdown with Render.
//
// Latencies are kept as per-call samples and summarised here (nearest-rank
// percentiles), not as ns/op: a proxy's cost shows in the tail as much as in
// the mean.
package report

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"sync"
	"time"
)

// EnvResults names the JSON-lines file the benchmarks append Records to.
const EnvResults = "INPLACED_BENCH_RESULTS"

// Summary describes a set of per-call latency samples. Durations are in
// nanoseconds.
type Summary struct {
	N    int   `json:"n"`
	P50  int64 `json:"p50_ns"`
	P90  int64 `json:"p90_ns"`
	P99  int64 `json:"p99_ns"`
	Mean int64 `json:"mean_ns"`
	Min  int64 `json:"min_ns"`
	Max  int64 `json:"max_ns"`
}

// Summarize sorts samples in place and returns their summary.
func Summarize(samples []time.Duration) Summary {
	if len(samples) == 0 {
		return Summary{}
	}
	slices.Sort(samples)
	var sum float64
	for _, s := range samples {
		sum += float64(s)
	}
	return Summary{
		N:    len(samples),
		P50:  int64(Percentile(samples, 50)),
		P90:  int64(Percentile(samples, 90)),
		P99:  int64(Percentile(samples, 99)),
		Mean: int64(sum / float64(len(samples))),
		Min:  int64(samples[0]),
		Max:  int64(samples[len(samples)-1]),
	}
}

// Percentile is the nearest-rank p-th percentile of sorted samples: the
// smallest sample such that at least p% of the samples are ≤ it.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	rank = min(max(rank, 1), len(sorted))
	return sorted[rank-1]
}

// Median returns the median of ns values (the mean of the middle two for an
// even count).
func Median(ns []int64) int64 {
	if len(ns) == 0 {
		return 0
	}
	s := slices.Clone(ns)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// Latency compares one CRI method called directly on the backend's socket
// and through inplaced, measured in alternating batches in the same run.
type Latency struct {
	Backend     string  `json:"backend"`
	Method      string  `json:"method"`
	Concurrency int     `json:"concurrency"`
	Rounds      int     `json:"rounds"` // direct/proxy batch pairs
	Direct      Summary `json:"direct"`
	Proxy       Summary `json:"proxy"`
	Note        string  `json:"note,omitempty"` // e.g. "100 containers"
	// Phase tells runs of one build apart, e.g. "before" and "after" a
	// relay change measured with an in-process relay.
	Phase string `json:"phase,omitempty"`
	// Variant names the path measured beside direct, when it is not
	// inplaced as installed: in BenchmarkCRI a second inplaced
	// ("GOMAXPROCS=1") or a floor (IsFloor); in BenchmarkRelay the relay's
	// configuration, "interceptors" (inplaced's table) or "bare" (none);
	// in BenchmarkRelayCost the relay process.
	Variant string `json:"variant,omitempty"`
	// ProxyCPUPerCall is the CPU time the proxy process spent during the
	// cell (its threads' run time, /proc/<pid>/task/*/schedstat) divided by
	// the calls it relayed, in ns; 0 if unknown.
	ProxyCPUPerCall int64 `json:"proxy_cpu_per_call_ns,omitempty"`
	// ProxyInstrPerCall is the instructions the proxy process executed per
	// call (valgrind --tool=callgrind), when measured.
	ProxyInstrPerCall int64 `json:"proxy_instr_per_call,omitempty"`
	// ProxyAllocBytes and ProxyAllocs are the heap bytes and objects the
	// proxy path allocated per call beyond the direct path (in-process
	// relay only).
	ProxyAllocBytes int64 `json:"proxy_alloc_bytes,omitempty"`
	ProxyAllocs     int64 `json:"proxy_allocs,omitempty"`
	// Conditions is how busy the machine was during the cell (hygiene.go).
	Conditions *Conditions `json:"conditions,omitempty"`
	// WindowP50 is this path's p50 in each of DriftWindows consecutive
	// windows of the cell's rounds: how much it moved while measured.
	WindowP50 []int64 `json:"window_p50_ns,omitempty"`
	// DirectWindowP50 is the direct path's p50 in the same windows: when
	// it moved as much as a floor did, the machine changed under the cell
	// (every path saw it), not the floor alone.
	DirectWindowP50 []int64 `json:"direct_window_p50_ns,omitempty"`
}

// Profile is where inplaced's CPU time went while it relayed the calls of
// BenchmarkCRI, from `perf record -p` (self time, cpu-clock samples).
type Profile struct {
	Backend string `json:"backend"`
	Samples int64  `json:"samples"`
	// Groups is the share of samples per part of the program (see
	// ProfileGroup), largest first.
	Groups []ProfileEntry `json:"groups"`
	// Top are the symbols with the most samples.
	Top []ProfileEntry `json:"top"`
	// PerCall counts, per CRI method, what inplaced did for each call it
	// relayed in that phase (`perf stat -p`, /proc/<pid>/stat).
	PerCall []CallCost `json:"per_call,omitempty"`
}

// CallCost is what inplaced spent, on average, to relay one call of Method.
type CallCost struct {
	Method          string  `json:"method"`
	Calls           int     `json:"calls"`
	Syscalls        float64 `json:"syscalls"`
	ContextSwitches float64 `json:"context_switches"`
	CPUNs           int64   `json:"cpu_ns"`
}

// ProfileEntry is a symbol or group and its share of the samples, in percent.
type ProfileEntry struct {
	Name    string  `json:"name"`
	Percent float64 `json:"percent"`
}

// ProfileGroup names the part of the program a perf symbol belongs to.
func ProfileGroup(dso, sym string) string {
	switch {
	case strings.HasPrefix(dso, "[kernel") || strings.HasPrefix(dso, "[vdso"):
		return "kernel: syscalls, socket I/O, scheduling"
	case strings.HasPrefix(sym, "runtime.") || strings.HasPrefix(sym, "internal/runtime") || strings.HasPrefix(sym, "gcWriteBarrier") ||
		strings.HasPrefix(sym, "aeshash") || strings.HasPrefix(sym, "memeqbody") || strings.HasPrefix(sym, "indexbytebody"):
		return "Go runtime: scheduler, allocation, GC"
	case strings.HasPrefix(sym, "google.golang.org/grpc") || strings.HasPrefix(sym, "golang.org/x/net/http2"):
		return "gRPC and HTTP/2 transport"
	case strings.HasPrefix(sym, "google.golang.org/protobuf"):
		return "protobuf"
	case strings.HasPrefix(sym, "github.com/inplaced/"):
		return "inplaced: relay and interceptors"
	case strings.HasPrefix(sym, "go.uber.org/zap"):
		return "logging"
	default:
		return "other Go code (std library: sync, context, net, io...)"
	}
}

// Memory is inplaced's memory after the latency runs, from
// /proc/<pid>/status.
type Memory struct {
	Backend  string `json:"backend"`
	VmRSSKiB int64  `json:"vmrss_kib"`
	VmHWMKiB int64  `json:"vmhwm_kib"` // peak RSS
	Calls    int64  `json:"calls"`     // calls relayed before the reading
	CPUNs    int64  `json:"cpu_ns"`    // CPU time inplaced used for them
}

// Downtime is how long a container name had nothing running while it was
// replaced by one method: from the old container stopped (StopContainer
// returned) until StartContainer of the new one returned.
type Downtime struct {
	Backend string `json:"backend"`
	Image   string `json:"image"`  // "App2" or "Large"
	Method  string `json:"method"` // MethodSwap, MethodKubelet, MethodRecreate
	// Pulled says whether the new image was removed from the node before the
	// replacement, so that a pull was part of it.
	Pulled bool `json:"pulled"`
	// Samples are the downtimes of the repetitions, in order.
	Samples []int64 `json:"samples_ns"`
	// Steps holds per-step durations of each repetition (same order), e.g.
	// "pull", "create", "start".
	Steps []map[string]int64 `json:"steps_ns,omitempty"`
}

// Replacement methods.
const (
	MethodSwap     = "swap"
	MethodKubelet  = "kubelet"
	MethodRecreate = "recreate"
)

// Backend describes a backend the benchmarks ran against.
type Backend struct {
	Backend        string `json:"backend"`
	Binary         string `json:"binary"`
	RuntimeName    string `json:"runtime_name"`
	RuntimeVersion string `json:"runtime_version"`
}

// Record is one line of the results file: exactly one field is set.
type Record struct {
	Time     time.Time `json:"time"`
	Latency  *Latency  `json:"latency,omitempty"`
	Memory   *Memory   `json:"memory,omitempty"`
	Profile  *Profile  `json:"profile,omitempty"`
	Downtime *Downtime `json:"downtime,omitempty"`
	Backend  *Backend  `json:"backend,omitempty"`
	// KubeletLoad is BenchmarkKubeletLoad's window on one backend; it has
	// its own document (RenderKubeletLoad), Render skips it.
	KubeletLoad *KubeletLoad `json:"kubelet_load,omitempty"`
}

var appendMu sync.Mutex

// Append writes rec to $INPLACED_BENCH_RESULTS, if set.
func Append(rec Record) error {
	path := os.Getenv(EnvResults)
	if path == "" {
		return nil
	}
	if rec.Time.IsZero() {
		rec.Time = time.Now().UTC()
	}
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	appendMu.Lock()
	defer appendMu.Unlock()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(append(b, '\n')); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// Load reads a results file.
func Load(path string) ([]Record, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []Record
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for line := 1; sc.Scan(); line++ {
		if len(sc.Bytes()) == 0 {
			continue
		}
		var r Record
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, line, err)
		}
		out = append(out, r)
	}
	return out, sc.Err()
}
