package report

import (
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strings"
	"time"
)

// What a node pays for inplaced: a real kubelet
// manages NodePods pods through inplaced for a window of minutes, and
// BenchmarkKubeletLoad samples inplaced's and containerd's processes.
const (
	// TargetLoadCPURatio bounds inplaced's CPU time over the window against
	// containerd's daemon process's in the same window.
	TargetLoadCPURatio = 0.10
	// TargetLoadRSSKiB bounds inplaced's resident memory during the window.
	TargetLoadRSSKiB = 30 << 10
)

// KubeletLoad is one backend's window of BenchmarkKubeletLoad. Durations
// are in nanoseconds; CPU times are the run time of the process's threads
// (/proc/<pid>/task/*/schedstat; utime + stime where there is none),
// cumulative from the window's start.
type KubeletLoad struct {
	Backend string `json:"backend"`
	// Pods is how many pods kubelet ran (one container each, Image).
	Pods  int    `json:"pods"`
	Image string `json:"image"`
	// Kubelet says how the kubelet was configured, e.g. its syncFrequency.
	Kubelet string `json:"kubelet"`
	// Inplaced is inplaced's command-line flags beyond its sockets.
	Inplaced string `json:"inplaced"`
	// Started is when the window began; PodsReadyNs how long the pods took
	// to be running and ready from their manifests' writing, SettleNs the
	// wait after that before the window.
	Started     time.Time `json:"started"`
	PodsReadyNs int64     `json:"pods_ready_ns"`
	SettleNs    int64     `json:"settle_ns"`
	WindowNs    int64     `json:"window_ns"`
	// SampleEveryNs and ScrapeEveryNs: /proc is read every SampleEvery,
	// inplaced's /metrics scraped (for go_goroutines) every ScrapeEvery.
	SampleEveryNs int64        `json:"sample_every_ns"`
	ScrapeEveryNs int64        `json:"scrape_every_ns"`
	Samples       []LoadSample `json:"samples"`
	// Calls are the CRI calls inplaced relayed during the window, by
	// method (its inplaced_cri_requests_total, every code).
	Calls map[string]int64 `json:"calls"`
	// Scrapes is how many /metrics scrapes of the window inplaced answered;
	// ScrapeCPUNs what one costs it (measured after the window: 100
	// scrapes in a row, inplaced's CPU time divided by 100).
	Scrapes     int   `json:"scrapes"`
	ScrapeCPUNs int64 `json:"scrape_cpu_ns"`
	// VmHWMKiB is inplaced's peak RSS since it started (the pods'
	// creation included), read at the window's end.
	VmHWMKiB int64 `json:"vmhwm_kib"`
	// BinaryBytes is the size of inplaced's executable.
	BinaryBytes int64 `json:"binary_bytes"`
	// Shims is how many containerd shim processes served the pods.
	Shims int `json:"shims"`
	// Restarts counts container restarts kubelet reported at the window's
	// end, PodsRunning the pods still running and ready then.
	Restarts    int `json:"restarts"`
	PodsRunning int `json:"pods_running"`
	// Conditions is how busy the machine was during the window.
	Conditions *Conditions `json:"conditions,omitempty"`
	// Floors are the windows measured after this one with a byte relay in
	// inplaced's place (the Go byte relay, then socat), in that order; none
	// when not measured.
	Floors []*LoadFloor `json:"floors,omitempty"`
}

// LoadFloor is one of BenchmarkKubeletLoad's floor windows on one
// backend: after inplaced's window, on the same kubelet and pods, a byte
// relay (the Go byte relay, test/bench/floorrelay: io.Copy each way; or
// socat), parsing nothing, listens on inplaced's socket in its place;
// kubelet reconnects by itself. The cheapest processes there can be on
// that path, under the same calls: what their CPU is against containerd's
// says what any proxy could show.
type LoadFloor struct {
	// Relay names what ran in inplaced's place (GoFloor, SocatFloor).
	Relay string `json:"relay"`
	// ReconnectNs is from the relay listening until kubelet's first
	// connection through it; SettleNs the wait after that before the
	// window.
	ReconnectNs int64         `json:"reconnect_ns"`
	SettleNs    int64         `json:"settle_ns"`
	Started     time.Time     `json:"started"`
	WindowNs    int64         `json:"window_ns"`
	Samples     []FloorSample `json:"samples"`
	// RelayReadBytes is what the relay read during the window, both
	// directions (/proc/<pid>/io rchar, its processes added up).
	RelayReadBytes int64 `json:"relay_read_bytes"`
	// Unavailable counts kubelet's log lines with "code = Unavailable"
	// written during the window: 0 when every call reached containerd.
	Unavailable int `json:"unavailable"`
	// PodsRunning are the pods running and ready at the window's end;
	// Restarts the container restarts kubelet reported between the end of
	// inplaced's window and the end of this one.
	PodsRunning int `json:"pods_running"`
	Restarts    int `json:"restarts"`
	// Conditions is how busy the machine was during the window.
	Conditions *Conditions `json:"conditions,omitempty"`
}

// FloorSample is one reading during the floor window; CPU times are
// cumulative from its start.
type FloorSample struct {
	AtNs            int64 `json:"at_ns"`
	RelayCPUNs      int64 `json:"relay_cpu_ns"`
	ContainerdCPUNs int64 `json:"containerd_cpu_ns"`
	KubeletCPUNs    int64 `json:"kubelet_cpu_ns"`
	RelayRSSKiB     int64 `json:"relay_rss_kib"`
}

func (f *LoadFloor) last() FloorSample { return lastSample(f.Samples) }

// CPURatio is the relay's CPU time over its window ÷ containerd's daemon's
// in the same window.
func (f *LoadFloor) CPURatio() float64 {
	l := f.last()
	return ratio(float64(l.RelayCPUNs), float64(l.ContainerdCPUNs))
}

// MaxRSSKiB is the relay's highest VmRSS sampled.
func (f *LoadFloor) MaxRSSKiB() int64 {
	return maxSample(f.Samples, func(s FloorSample) int64 { return s.RelayRSSKiB })
}

// lastSample is the last of samples, the zero sample when there is none.
func lastSample[S any](samples []S) S {
	var last S
	if len(samples) > 0 {
		last = samples[len(samples)-1]
	}
	return last
}

// maxSample is the highest value of f over samples, 0 for none.
func maxSample[S any](samples []S, f func(S) int64) int64 {
	var m int64
	for _, s := range samples {
		m = max(m, f(s))
	}
	return m
}

// LoadSample is one reading during the window.
type LoadSample struct {
	AtNs            int64 `json:"at_ns"` // since the window's start
	InplacedCPUNs   int64 `json:"inplaced_cpu_ns"`
	ContainerdCPUNs int64 `json:"containerd_cpu_ns"`
	ShimsCPUNs      int64 `json:"shims_cpu_ns"`
	KubeletCPUNs    int64 `json:"kubelet_cpu_ns"`
	RSSKiB          int64 `json:"rss_kib"`
	// RSSAnonKiB and RSSFileKiB split VmRSS (RssAnon, RssFile): memory
	// inplaced allocated, and pages of files it maps (its executable).
	RSSAnonKiB int64 `json:"rss_anon_kib"`
	RSSFileKiB int64 `json:"rss_file_kib"`
	FDs        int   `json:"fds"`
	Threads    int   `json:"threads"`
	// Goroutines is go_goroutines from inplaced's /metrics, -1 when not
	// scraped at this sample.
	Goroutines int `json:"goroutines"`
	// HeapInuseKiB is go_memstats_heap_inuse_bytes from the same scrape.
	HeapInuseKiB int64   `json:"heap_inuse_kib,omitempty"`
	Load1        float64 `json:"load1"`
}

func (k *KubeletLoad) last() LoadSample { return lastSample(k.Samples) }

// CPURatio is inplaced's CPU time over the window ÷ containerd's daemon's.
func (k *KubeletLoad) CPURatio() float64 {
	l := k.last()
	return ratio(float64(l.InplacedCPUNs), float64(l.ContainerdCPUNs))
}

// MaxRSSKiB is the highest VmRSS sampled during the window.
func (k *KubeletLoad) MaxRSSKiB() int64 {
	return maxSample(k.Samples, func(s LoadSample) int64 { return s.RSSKiB })
}

// MaxRSS is the sample with the highest VmRSS.
func (k *KubeletLoad) MaxRSS() LoadSample {
	var m LoadSample
	for _, s := range k.Samples {
		if s.RSSKiB > m.RSSKiB {
			m = s
		}
	}
	return m
}

// MinuteRange is the minimum and maximum of f over the samples of minute
// n of the window (1-based: (n−1) min < at ≤ n min) that f takes (ok);
// found is false when there is none.
func (k *KubeletLoad) MinuteRange(n int, f func(LoadSample) (int, bool)) (lo, hi int, found bool) {
	from, to := int64(n-1)*int64(time.Minute), int64(n)*int64(time.Minute)
	for _, s := range k.Samples {
		v, ok := f(s)
		if !ok || s.AtNs <= from || s.AtNs > to {
			continue
		}
		if !found {
			lo, hi, found = v, v, true
			continue
		}
		lo, hi = min(lo, v), max(hi, v)
	}
	return lo, hi, found
}

// Minutes is the window's length in whole minutes.
func (k *KubeletLoad) Minutes() int {
	return int(math.Round(float64(k.WindowNs) / float64(time.Minute)))
}

// Sample fields for MinuteRange.
func sampleGoroutines(s LoadSample) (int, bool) { return s.Goroutines, s.Goroutines >= 0 }
func sampleFDs(s LoadSample) (int, bool)        { return s.FDs, true }

// Growth compares minute 2 with the window's last minute: each one's
// minimum (a count sampled while a relayed call is in flight holds that
// call's goroutines and, briefly, no more fds; the minimum is what stays).
// grew says the last minute's minimum is above minute 2's.
func (k *KubeletLoad) Growth(f func(LoadSample) (int, bool)) (early, late int, grew, ok bool) {
	early, _, ok1 := k.MinuteRange(2, f)
	late, _, ok2 := k.MinuteRange(k.Minutes(), f)
	return early, late, late > early, ok1 && ok2 && k.Minutes() >= 2
}

// KubeletLoadRun is what RenderKubeletLoad needs besides the windows.
type KubeletLoadRun struct {
	Host, CPUModel, Kernel, GoVersion string
	NProc                             int
	KubeletVersion                    string
	// Backends are "name: runtime version", in run order.
	Backends          []string
	Commit, Command   string
	Started, Finished time.Time
	// Load is the 1-minute load average sampled during the whole run.
	Load  []float64
	Loads []*KubeletLoad
	// Rendered, when set, says how the document was written if not by the
	// benchmark during the run.
	Rendered string
}

// KubeletLoadVerdicts are the four verdicts of one window (CPU, RSS,
// goroutines, fds),
// and after the CPU verdict, for each floor window measured, its
// reference row: the same target applied to that byte relay.
func KubeletLoadVerdicts(k *KubeletLoad) []struct{ Target, Measured, Result string } {
	var out []struct{ Target, Measured, Result string }
	add := func(t, m, r string) { out = append(out, struct{ Target, Measured, Result string }{t, m, r}) }
	l := k.last()
	cpu := verdict(k.CPURatio() <= TargetLoadCPURatio)
	if why := UnreliableConditions(k.Conditions); why != "" {
		cpu = "unreliable (" + why + ")"
	}
	add(fmt.Sprintf("inplaced's CPU over the window ≤ %.0f%% of containerd's", TargetLoadCPURatio*100),
		fmt.Sprintf("%.1f%% (%s ÷ %s)", k.CPURatio()*100, fmtCPU(l.InplacedCPUNs), fmtCPU(l.ContainerdCPUNs)), cpu)
	for _, f := range k.Floors {
		fl := f.last()
		res := "met by the floor"
		if f.CPURatio() > TargetLoadCPURatio {
			res = "not met even by the floor"
		}
		if why := UnreliableConditions(f.Conditions); why != "" {
			res = "unreliable (" + why + ")"
		}
		add(fmt.Sprintf("reference, *%s* in inplaced's place, its own window: its CPU ≤ %.0f%% of containerd's", f.Relay, TargetLoadCPURatio*100),
			fmt.Sprintf("%.1f%% (%s ÷ %s over %s); inplaced's %.1f%% is %s the floor's", f.CPURatio()*100, fmtCPU(fl.RelayCPUNs),
				fmtCPU(fl.ContainerdCPUNs), time.Duration(f.WindowNs).Round(time.Second), k.CPURatio()*100, fmtRatio(ratio(k.CPURatio(), f.CPURatio()))), res)
	}
	mx := k.MaxRSS()
	add(fmt.Sprintf("inplaced's RSS (VmRSS) ≤ %d MiB during the window", TargetLoadRSSKiB>>10),
		fmt.Sprintf("max %s: %s anonymous + %s file-backed (VmHWM, the kernel's peak since start, the pods' creation included: %s)",
			fmtKiB(mx.RSSKiB), fmtKiB(mx.RSSAnonKiB), fmtKiB(mx.RSSFileKiB), fmtKiB(k.VmHWMKiB)), verdict(k.MaxRSSKiB() <= TargetLoadRSSKiB))
	for _, g := range []struct {
		what string
		f    func(LoadSample) (int, bool)
	}{{"goroutines", sampleGoroutines}, {"open fds", sampleFDs}} {
		early, late, grew, ok := k.Growth(g.f)
		if !ok {
			add("no growth of "+g.what+" from minute 2 to the last", "not measured (window shorter than 2 minutes or no samples)", "–")
			continue
		}
		add(fmt.Sprintf("no growth of inplaced's %s, minute 2 → minute %d (each minute's minimum)", g.what, k.Minutes()),
			fmt.Sprintf("%d → %d", early, late), verdict(!grew))
	}
	return out
}

// RenderKubeletLoad writes the document of BenchmarkKubeletLoad
// (docs/benchmarks-kubelet-load.md from hack/bench.sh).
func RenderKubeletLoad(w io.Writer, r KubeletLoadRun, docEnv string) error {
	var b strings.Builder
	fmt.Fprintf(&b, "# Benchmarks: what a node pays (kubelet through inplaced)\n\n")
	fmt.Fprintf(&b, "Written by `BenchmarkKubeletLoad` (`test/bench/kubeletload_test.go`) when `$%s` names this file "+
		"(`hack/bench.sh` sets it: `BENCH=KubeletLoad hack/bench.sh`); do not edit by hand. "+
		"The rest of `make bench` is in [benchmarks.md](benchmarks.md).\n\n", docEnv)
	fmt.Fprintf(&b, "## Machine and run\n\n| | |\n|---|---|\n")
	fmt.Fprintf(&b, "| Host | `%s`: %s, %d CPUs, kernel %s |\n", r.Host, r.CPUModel, r.NProc, r.Kernel)
	fmt.Fprintf(&b, "| Go | %s |\n", r.GoVersion)
	for _, be := range r.Backends {
		fmt.Fprintf(&b, "| Backend | %s, runc, CNI bridge |\n", be)
	}
	fmt.Fprintf(&b, "| kubelet | %s, standalone (static pods, no API server) |\n", r.KubeletVersion)
	fmt.Fprintf(&b, "| inplaced | commit `%s` |\n", r.Commit)
	fmt.Fprintf(&b, "| Run | %s → %s UTC (%s) |\n", r.Started.UTC().Format("2006-01-02 15:04:05"), r.Finished.UTC().Format("15:04:05"),
		r.Finished.Sub(r.Started).Round(time.Second))
	if len(r.Load) > 0 {
		fmt.Fprintf(&b, "| 1-min load average during the run | %s (min–median–max; %d CPUs) |\n", loadRange(r.Load), r.NProc)
	}
	fmt.Fprintf(&b, "| Command | `%s` |\n", r.Command)
	if r.Rendered != "" {
		fmt.Fprintf(&b, "| Written | %s |\n", r.Rendered)
	}
	b.WriteString("\n")

	fmt.Fprintf(&b, "## Verdicts\n\n| Backend | Target | Measured | Result |\n|---|---|---|---|\n")
	for _, k := range r.Loads {
		for _, v := range KubeletLoadVerdicts(k) {
			fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", k.Backend, v.Target, v.Measured, v.Result)
		}
	}
	b.WriteString("\nEach backend's section below has the figures behind them, minute by minute.\n\n")
	fmt.Fprintf(&b, "## What was measured\n\n")
	if len(r.Loads) > 0 {
		k := r.Loads[0]
		fmt.Fprintf(&b, "A real kubelet (%s) runs %d static pods, one container each (the harness's test image %s: an HTTP server that "+
			"does nothing unless asked), with its CRI runtime and image endpoints on inplaced's socket, inplaced in front of a private containerd. "+
			"Once every pod is running and ready, and %s more, inplaced, containerd and kubelet are left alone for %d minutes: "+
			"the only CRI calls are kubelet's own — its relist (PLEG, every second), pod workers' status calls, the periodic sync of every pod, "+
			"the stats the eviction manager and the summary API ask for (kubelet's CRI stats provider: ListPodSandboxStats, ListContainerStats, "+
			"ImageFsInfo). Nothing else calls inplaced, except a scrape of its `/metrics` every %s (for `go_goroutines`, as a Prometheus would; "+
			"the cost of one scrape to inplaced is measured after the window and shown). The pods have no probes (kubelet's HTTP probes do not go through CRI).\n\n",
			k.Kubelet, k.Pods, k.Image, time.Duration(k.SettleNs), k.Minutes(), time.Duration(k.ScrapeEveryNs))
		fmt.Fprintf(&b, "inplaced runs as a node runs it: `%s`.\n\n", k.Inplaced)
		fmt.Fprintf(&b, "Every %s the benchmark reads each process's CPU time (the scheduler's run time of its threads, "+
			"`/proc/<pid>/task/*/schedstat`), `/proc/<pid>/status` (VmRSS, VmHWM, Threads) and counts `/proc/<pid>/fd`:\n\n", time.Duration(k.SampleEveryNs))
	}
	fmt.Fprintf(&b, "- **inplaced**: its one process.\n")
	fmt.Fprintf(&b, "- **containerd**: containerd's own daemon process only, the process kubelet's calls reach through inplaced. "+
		"Its shims (`containerd-shim-runc-v2`, one per pod, separate processes that own the containers' tasks) are shown in their own column "+
		"and are not in the ratio: with them the ratio would be smaller, so the daemon alone is the stricter and the fairer comparison "+
		"(inplaced relays calls to the daemon; the shims work for the containers whether inplaced is there or not).\n")
	fmt.Fprintf(&b, "- **kubelet**: for scale, not judged.\n\n")
	fmt.Fprintf(&b, "Goroutines and open fds are compared as the minimum of each minute (minute 2 against the last): "+
		"a sample taken while a relayed call is in flight also counts that call's goroutines, the minimum is what stays. "+
		"Growth would be a leak: each minute of the window has the same calls.\n\n")
	if len(r.Loads) > 0 && r.Loads[0].BinaryBytes > 0 {
		fmt.Fprintf(&b, "*RSS* is VmRSS, what `ps` and `top` show and what the target names. It is split as the kernel counts it: "+
			"*anonymous* (RssAnon: the Go heap, stacks, the runtime's own) and *file-backed* (RssFile: pages of files inplaced maps, "+
			"in practice its %.0f MiB executable — the Kubernetes client libraries are most of it — as far as it touched them). "+
			"File-backed pages are in the page cache, shared with any other process mapping the same file and reclaimable under memory pressure, "+
			"but they are resident and VmRSS counts them: the verdict is on VmRSS, the highest sampled. "+
			"(VmHWM, the kernel's own peak, is updated lazily — not when pages are given back — so it can read below a VmRSS sampled earlier.) *Go heap in use* is `go_memstats_heap_inuse_bytes` from the scrapes.\n\n",
			float64(r.Loads[0].BinaryBytes)/(1<<20))
	}
	fmt.Fprintf(&b, "*Load*: other work is the CPU time, in CPUs, that processes outside the benchmark (the test binary and every process below it: "+
		"containerd, its shims and the pods, inplaced, kubelet) used during the window (`/proc/stat` busy time minus theirs). "+
		"*Steal* is the share of the machine's CPU time that `/proc/stat` counts as steal during the window: this is a virtual machine, and "+
		"steal is the time a vCPU wanted to run while the hypervisor ran another guest. "+
		"As in [benchmarks.md](benchmarks.md), the CPU verdict is **unreliable** when other work used more than %.0f%% of the CPUs, or when "+
		"steal exceeded %.0f%% of the machine's CPU time: CPU time is work done, but a contended CPU makes each unit of it dearer (cache, wake-ups) "+
		"for one process and not the other. "+
		"Memory, goroutine and fd counts do not depend on how busy the CPUs are and are judged in any case.\n\n", MaxForeignLoadPerCPU*100, MaxSteal*100)
	if i := slices.IndexFunc(r.Loads, func(k *KubeletLoad) bool { return len(k.Floors) > 0 }); i >= 0 {
		k := r.Loads[i]
		fmt.Fprintf(&b, "**The floor windows.** containerd's daemon may use little CPU for kubelet's calls (containerd 1.6 does), so the ratio "+
			"needs a reference: what the cheapest process there can be on the same path costs under the same calls. After inplaced's window, "+
			"with the same kubelet and the same %d pods, inplaced is stopped and a byte relay listens on inplaced's socket, parsing nothing "+
			"(not a CRI proxy: it cannot see a method): first `test/bench/floorrelay`, a Go byte relay, one goroutine per direction doing `io.Copy` "+
			"between kubelet's connection and containerd's socket; then, in a window of its own, `socat -b 1048576 UNIX-LISTEN:…,fork UNIX-CONNECT:<containerd>`, "+
			"a C byte relay (when installed), its CPU counted over its whole process group: the listener, the child it forks for each of kubelet's "+
			"connections, and any child it reaped. kubelet's gRPC clients reconnect by themselves. Once kubelet's first connection has come through the relay, "+
			"and %s more, a window of %s is sampled as inplaced's was, every %s: the relay's, containerd's and kubelet's CPU time and the relay's RSS. "+
			"That kubelet's calls reach containerd through it is checked: kubelet must log no `code = Unavailable` error during the window, and "+
			"every pod must still be running and ready at its end (the benchmark fails otherwise). The %.0f%% verdict stays inplaced's; the floors' "+
			"rows are references: a target no floor meets cannot be met by any process between kubelet and containerd on this machine and backend. "+
			"The windows follow each other, they are not the same one: each process is compared with containerd's CPU in its own window, "+
			"and *inplaced's ÷ the floor's* divides the two ratios.\n\n",
			k.Pods, time.Duration(k.Floors[0].SettleNs), time.Duration(k.Floors[0].WindowNs).Round(time.Second), time.Duration(k.SampleEveryNs), TargetLoadCPURatio*100)
	}

	for _, k := range r.Loads {
		l := k.last()
		fmt.Fprintf(&b, "## %s\n\n", k.Backend)
		fmt.Fprintf(&b, "Window %s → %s UTC (%d minutes); %d pods running and ready at its end (%d container restarts), "+
			"%s from the manifests to all ready, %d shims. Conditions: %s.\n\n",
			k.Started.UTC().Format("2006-01-02 15:04:05"), k.Started.Add(time.Duration(k.WindowNs)).UTC().Format("15:04:05"), k.Minutes(),
			k.PodsRunning, k.Restarts, fmtDur(k.PodsReadyNs), k.Shims, fmtConditions(k.Conditions))
		fmt.Fprintf(&b, "| Target | Measured | Result |\n|---|---|---|\n")
		for _, v := range KubeletLoadVerdicts(k) {
			fmt.Fprintf(&b, "| %s | %s | %s |\n", v.Target, v.Measured, v.Result)
		}
		win := time.Duration(k.WindowNs).Seconds()
		pct := func(ns int64) string { return fmt.Sprintf("%.2f%%", float64(ns)/1e9/win*100) }
		var total int64
		for _, n := range k.Calls {
			total += n
		}
		perCall := func(ns int64) string {
			if total == 0 {
				return "–"
			}
			return fmtDur(ns / total)
		}
		fmt.Fprintf(&b, "\nCPU time over the window (*per relayed call*: the process's CPU time over the window ÷ the CRI calls inplaced relayed in it, "+
			"whatever else the process did):\n\n")
		fmt.Fprintf(&b, "| Process | CPU time | Of one CPU | Per relayed call |\n|---|--:|--:|--:|\n")
		fmt.Fprintf(&b, "| inplaced | %s | %s | %s |\n", fmtCPU(l.InplacedCPUNs), pct(l.InplacedCPUNs), perCall(l.InplacedCPUNs))
		fmt.Fprintf(&b, "| containerd (daemon) | %s | %s | %s |\n", fmtCPU(l.ContainerdCPUNs), pct(l.ContainerdCPUNs), perCall(l.ContainerdCPUNs))
		fmt.Fprintf(&b, "| containerd's %d shims | %s | %s | %s |\n", k.Shims, fmtCPU(l.ShimsCPUNs), pct(l.ShimsCPUNs), perCall(l.ShimsCPUNs))
		fmt.Fprintf(&b, "| kubelet | %s | %s | %s |\n\n", fmtCPU(l.KubeletCPUNs), pct(l.KubeletCPUNs), perCall(l.KubeletCPUNs))
		if total > 0 {
			fmt.Fprintf(&b, "inplaced relayed %d CRI calls in the window (%.1f per second), %s of its CPU per call on average "+
				"(everything it did, divided by the calls; BenchmarkCRI in [benchmarks.md](benchmarks.md) measures the same per call); it also answered %d `/metrics` scrapes at %s each (%s in all):\n\n",
				total, float64(total)/win, fmtDur(l.InplacedCPUNs/total), k.Scrapes, fmtDur(k.ScrapeCPUNs), fmtCPU(int64(k.Scrapes)*k.ScrapeCPUNs))
			fmt.Fprintf(&b, "| Method | Calls | Per second |\n|---|--:|--:|\n")
			ms := slices.Collect(maps.Keys(k.Calls))
			slices.SortFunc(ms, func(a, c string) int {
				if k.Calls[a] != k.Calls[c] {
					return int(k.Calls[c] - k.Calls[a])
				}
				return strings.Compare(a, c)
			})
			for _, m := range ms {
				fmt.Fprintf(&b, "| %s | %d | %.2f |\n", m, k.Calls[m], float64(k.Calls[m])/win)
			}
			b.WriteString("\n")
		}
		floorSection(&b, k)
		fmt.Fprintf(&b, "Minute by minute (CPU in that minute; RSS, goroutines and fds as min–max of the minute's samples):\n\n")
		fmt.Fprintf(&b, "| Minute | inplaced CPU | containerd CPU | Ratio | inplaced VmRSS | of it anonymous | Go heap in use | Goroutines | Open fds | Threads | 1-min load |\n")
		fmt.Fprintf(&b, "|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
		prev := LoadSample{}
		for n := 1; n <= k.Minutes(); n++ {
			var in []LoadSample
			for _, s := range k.Samples {
				if s.AtNs > int64(n-1)*int64(time.Minute) && s.AtNs <= int64(n)*int64(time.Minute) {
					in = append(in, s)
				}
			}
			if len(in) == 0 {
				continue
			}
			end := in[len(in)-1]
			rs := func(f func(LoadSample) int64) string {
				lo, hi := f(in[0]), f(in[0])
				for _, s := range in {
					lo, hi = min(lo, f(s)), max(hi, f(s))
				}
				return fmtKiB(lo) + "–" + fmtKiB(hi)
			}
			span := func(f func(LoadSample) (int, bool)) string {
				lo, hi, ok := k.MinuteRange(n, f)
				if !ok {
					return "–"
				}
				return fmt.Sprintf("%d–%d", lo, hi)
			}
			var loads []float64
			for _, s := range in {
				loads = append(loads, s.Load1)
			}
			di, dc := end.InplacedCPUNs-prev.InplacedCPUNs, end.ContainerdCPUNs-prev.ContainerdCPUNs
			heap := "–"
			if lo, hi, ok := k.MinuteRange(n, func(s LoadSample) (int, bool) { return int(s.HeapInuseKiB), s.HeapInuseKiB > 0 }); ok {
				heap = fmtKiB(int64(lo)) + "–" + fmtKiB(int64(hi))
			}
			fmt.Fprintf(&b, "| %d | %s | %s | %.1f%% | %s | %s | %s | %s | %s | %s | %s |\n", n, fmtCPU(di), fmtCPU(dc), ratio(float64(di), float64(dc))*100,
				rs(func(s LoadSample) int64 { return s.RSSKiB }), rs(func(s LoadSample) int64 { return s.RSSAnonKiB }), heap,
				span(sampleGoroutines), span(sampleFDs),
				span(func(s LoadSample) (int, bool) { return s.Threads, true }), loadRange(loads))
			prev = end
		}
		b.WriteString("\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// fmtCPU is a CPU time: "1.23 s", "450 ms".
func fmtCPU(ns int64) string {
	d := time.Duration(ns)
	if d >= time.Second {
		return fmt.Sprintf("%.2f s", d.Seconds())
	}
	return fmt.Sprintf("%.0f ms", float64(d)/1e6)
}

func fmtKiB(kib int64) string { return fmt.Sprintf("%.1f MiB", float64(kib)/1024) }

// loadRange is "min–median–max" of load averages.
func loadRange(l []float64) string {
	if len(l) == 0 {
		return "–"
	}
	s := slices.Clone(l)
	slices.Sort(s)
	return fmt.Sprintf("%.1f–%.1f–%.1f", s[0], s[len(s)/2], s[len(s)-1])
}

// floorSection writes backend k's floor windows beside inplaced's, if
// they were measured.
func floorSection(b *strings.Builder, k *KubeletLoad) {
	if len(k.Floors) == 0 {
		return
	}
	for _, f := range k.Floors {
		read := ""
		if f.RelayReadBytes > 0 {
			read = fmt.Sprintf("; the relay read %s (both directions)", fmtKiB(f.RelayReadBytes>>10))
		}
		fmt.Fprintf(b, "The floor window with *%s* in inplaced's place (same kubelet and pods): %s → %s UTC (%s); kubelet's first connection came through "+
			"the relay %s after it listened; kubelet logged %d `code = Unavailable` errors during the window; %d pods running and ready at its end "+
			"(%d container restarts since inplaced's window)%s. Conditions: %s.\n\n",
			f.Relay, f.Started.UTC().Format("2006-01-02 15:04:05"), f.Started.Add(time.Duration(f.WindowNs)).UTC().Format("15:04:05"),
			time.Duration(f.WindowNs).Round(time.Second), fmtDur(f.ReconnectNs), f.Unavailable, f.PodsRunning, f.Restarts,
			read, fmtConditions(f.Conditions))
	}
	l := k.last()
	fmt.Fprintf(b, "| In kubelet's path | Window | Its CPU | Of one CPU | containerd's CPU | Its CPU ÷ containerd's | kubelet's CPU | Its highest VmRSS |\n")
	fmt.Fprintf(b, "|---|--:|--:|--:|--:|--:|--:|--:|\n")
	row := func(name string, windowNs, cpu, ctrd, kubelet, rssKiB int64) {
		fmt.Fprintf(b, "| %s | %s | %s | %.2f%% | %s | %.1f%% | %s | %s |\n", name, time.Duration(windowNs).Round(time.Second), fmtCPU(cpu),
			ratio(float64(cpu), float64(windowNs))*100, fmtCPU(ctrd), ratio(float64(cpu), float64(ctrd))*100, fmtCPU(kubelet), fmtKiB(rssKiB))
	}
	row("inplaced", k.WindowNs, l.InplacedCPUNs, l.ContainerdCPUNs, l.KubeletCPUNs, k.MaxRSSKiB())
	for _, f := range k.Floors {
		fl := f.last()
		row(f.Relay, f.WindowNs, fl.RelayCPUNs, fl.ContainerdCPUNs, fl.KubeletCPUNs, f.MaxRSSKiB())
	}
	b.WriteString("\n")
	for _, f := range k.Floors {
		fmt.Fprintf(b, "inplaced's share of containerd's CPU ÷ *%s*'s: **%s** (%.1f%% ÷ %.1f%%).\n",
			f.Relay, fmtRatio(ratio(k.CPURatio(), f.CPURatio())), k.CPURatio()*100, f.CPURatio()*100)
	}
	b.WriteString("\n")
}
