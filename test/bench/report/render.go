package report

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"
)

// The targets the benchmarks are judged against.
const (
	// TargetAddedP50 is the most the proxy may add to a call's median.
	TargetAddedP50 = 50 * time.Microsecond
	// TargetListRatio bounds ListContainers (100 containers) through the
	// proxy against direct, at the median.
	TargetListRatio = 1.05
	// TargetSwapVsRecreate bounds a swap's downtime against a pod recreation.
	TargetSwapVsRecreate = 0.3
	// TargetLargeSwapVsKubelet bounds a swap's downtime against a
	// kubelet-style replacement when the new image has a 100 MiB layer.
	TargetLargeSwapVsKubelet = 0.1
)

// InProcessBackend is the Latency.Backend of BenchmarkRelay's results.
const InProcessBackend = "in-process fake"

// Machine describes where and when the benchmarks ran.
type Machine struct {
	CPUModel  string
	NProc     int
	MemTotal  string
	Kernel    string
	OS        string
	GoVersion string
	Commit    string
	Command   string
	Started   time.Time
	Finished  time.Time
	// Load holds the 1-minute load averages sampled during the run.
	Load []float64
	// QuietWait says how hack/bench.sh's wait for a quiet machine ended.
	QuietWait string
}

// Input is everything Render needs.
type Input struct {
	Machine Machine
	Records []Record
	GoBench []GoBench
	// ResizeFile says whether test/bench/resize_bench_test.go existed.
	ResizeFile bool
}

// Render writes docs/benchmarks.md.
func Render(w io.Writer, in Input) error {
	d := newDoc(in)
	var b strings.Builder
	d.header(&b)
	d.targets(&b)
	d.latency(&b)
	d.downtime(&b)
	d.resize(&b)
	d.swapRuntime(&b)
	d.swapHold(&b)
	_, err := io.WriteString(w, b.String())
	return err
}

type doc struct {
	in        Input
	backends  []string // in order of first appearance
	backend   map[string]*Backend
	latencies map[string][]*Latency // by backend, in order: inplaced as installed
	variants  map[string][]*Latency // by backend: other inplaced variants
	memory    map[string]*Memory
	profile   map[string]*Profile
	downtimes map[string]map[string]map[string]*Downtime // backend → image → method
	inProc    []*Latency
	relayCost []*Latency                    // BenchmarkRelayCost's cells
	rz        map[string]map[string]GoBench // backend → variant
	rzOrder   []string
	swapRT    []GoBench // BenchmarkSwapRuntime/<backend>
	hold      []GoBench // BenchmarkSwapHold/<backend>
	release   []GoBench // BenchmarkHoldRelease/<backend>
	overlap   []GoBench // BenchmarkSwapOverlap/<backend>
}

func newDoc(in Input) *doc {
	d := &doc{in: in, backend: map[string]*Backend{}, latencies: map[string][]*Latency{}, variants: map[string][]*Latency{}, memory: map[string]*Memory{}, profile: map[string]*Profile{},
		downtimes: map[string]map[string]map[string]*Downtime{}, rz: map[string]map[string]GoBench{}}
	seen := func(b string) {
		if b != "" && !slices.Contains(d.backends, b) {
			d.backends = append(d.backends, b)
		}
	}
	for _, r := range in.Records {
		switch {
		case r.Backend != nil:
			seen(r.Backend.Backend)
			d.backend[r.Backend.Backend] = r.Backend
		case r.Latency != nil && r.Latency.Backend == InProcessBackend && r.Latency.Phase == relayCostPhase:
			// A later record of the same cell replaces an earlier one.
			d.relayCost = append(slices.DeleteFunc(d.relayCost, r.Latency.sameCell), r.Latency)
		case r.Latency != nil && r.Latency.Backend == InProcessBackend:
			d.inProc = append(d.inProc, r.Latency)
		case r.Latency != nil:
			seen(r.Latency.Backend)
			// A later record of the same cell replaces an earlier one.
			m := d.latencies
			if r.Latency.Variant != "" {
				m = d.variants
			}
			m[r.Latency.Backend] = append(slices.DeleteFunc(m[r.Latency.Backend], r.Latency.sameCell), r.Latency)
		case r.Memory != nil:
			seen(r.Memory.Backend)
			d.memory[r.Memory.Backend] = r.Memory
		case r.Profile != nil:
			seen(r.Profile.Backend)
			d.profile[r.Profile.Backend] = r.Profile
		case r.Downtime != nil:
			x := r.Downtime
			seen(x.Backend)
			if d.downtimes[x.Backend] == nil {
				d.downtimes[x.Backend] = map[string]map[string]*Downtime{}
			}
			if d.downtimes[x.Backend][x.Image] == nil {
				d.downtimes[x.Backend][x.Image] = map[string]*Downtime{}
			}
			d.downtimes[x.Backend][x.Image][x.Method] = x
		}
	}
	for _, gb := range in.GoBench {
		parts := strings.Split(gb.Name, "/")
		if parts[0] == "BenchmarkSwapRuntime" && len(parts) == 2 && gb.Metrics["runsc-ms"] > 0 {
			d.swapRT = append(d.swapRT, gb)
			continue
		}
		if parts[0] == "BenchmarkSwapHold" && len(parts) == 2 && gb.Metrics["reps"] > 0 {
			d.hold = append(d.hold, gb)
			continue
		}
		if parts[0] == "BenchmarkHoldRelease" && len(parts) == 2 && gb.Metrics["reps"] > 0 {
			d.release = append(d.release, gb)
			continue
		}
		if parts[0] == "BenchmarkSwapOverlap" && len(parts) == 2 && gb.Metrics["reps"] > 0 {
			d.overlap = append(d.overlap, gb)
			continue
		}
		if parts[0] != "BenchmarkResize" || len(parts) < 3 {
			continue
		}
		be, variant := parts[1], strings.Join(parts[2:], "/")
		if d.rz[be] == nil {
			d.rz[be] = map[string]GoBench{}
			d.rzOrder = append(d.rzOrder, be)
		}
		d.rz[be][variant] = gb
	}
	return d
}

// Formatting helpers.

func fmtDur(ns int64) string {
	d := time.Duration(ns)
	switch {
	case d < 0:
		return "−" + fmtDur(-ns)
	case d < time.Millisecond:
		return fmt.Sprintf("%.0f µs", float64(d)/1e3)
	case d < 10*time.Millisecond:
		return fmt.Sprintf("%.2f ms", float64(d)/1e6)
	case d < time.Second:
		return fmt.Sprintf("%.0f ms", float64(d)/1e6)
	default:
		return fmt.Sprintf("%.2f s", d.Seconds())
	}
}

func fmtBytes(n int64) string {
	switch {
	case n < 0:
		return "−" + fmtBytes(-n)
	case n < 10<<10:
		return fmt.Sprintf("%d B", n)
	default:
		return fmt.Sprintf("%.0f KiB", float64(n)/1024)
	}
}

func fmtNs(ns float64) string {
	switch {
	case ns < 1e3:
		return fmt.Sprintf("%.0f ns", ns)
	default:
		return fmtDur(int64(ns))
	}
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

func fmtRatio(r float64) string {
	switch {
	case r == 0:
		return "–"
	case r < 0.1:
		return fmt.Sprintf("%.3f×", r)
	case r < 10:
		return fmt.Sprintf("%.2f×", r)
	default:
		return fmt.Sprintf("%.0f×", r)
	}
}

func callers(n int) string {
	if n == 1 {
		return "1 caller"
	}
	return fmt.Sprintf("%d callers", n)
}

func verdict(ok bool) string {
	if ok {
		return "**PASS**"
	}
	return "**FAIL**"
}

func (d *doc) header(b *strings.Builder) {
	m := d.in.Machine
	fmt.Fprintf(b, "# Benchmarks\n\n")
	fmt.Fprintf(b, "Written by `make bench` (`hack/bench.sh` → `go test -bench . ./test/bench/` → `test/bench/benchdoc`); do not edit by hand. ")
	fmt.Fprintf(b, "Every figure below was measured in that one run, on the machine described here; ")
	fmt.Fprintf(b, "the proxy is always compared with the direct path measured **in the same run**, so the ratios matter more than the absolute numbers. "+
		"Two benchmarks that run a kubelet write documents of their own: [benchmarks-kubernetes.md](benchmarks-kubernetes.md) (`BenchmarkKubePatch`, "+
		"an image patch in Kubernetes mode) and [benchmarks-kubelet-load.md](benchmarks-kubelet-load.md) (`BenchmarkKubeletLoad`, what a node pays "+
		"for inplaced while a kubelet manages 60 pods through it).\n\n")
	fmt.Fprintf(b, "## Machine and run\n\n")
	fmt.Fprintf(b, "| | |\n|---|---|\n")
	fmt.Fprintf(b, "| CPU | %s, %d CPUs (`nproc`) |\n", m.CPUModel, m.NProc)
	if m.MemTotal != "" {
		fmt.Fprintf(b, "| Memory | %s |\n", m.MemTotal)
	}
	fmt.Fprintf(b, "| Kernel | %s |\n", m.Kernel)
	if m.OS != "" {
		fmt.Fprintf(b, "| OS | %s |\n", m.OS)
	}
	fmt.Fprintf(b, "| Go | %s |\n", m.GoVersion)
	for _, be := range d.backends {
		if x := d.backend[be]; x != nil {
			fmt.Fprintf(b, "| Backend `%s` | %s %s (`%s`), runc, CNI bridge |\n", be, x.RuntimeName, x.RuntimeVersion, x.Binary)
		}
	}
	if m.Commit != "" {
		fmt.Fprintf(b, "| inplaced | commit `%s`, started at `--log-level info` as a node runs it |\n", m.Commit)
	}
	if !m.Started.IsZero() {
		fmt.Fprintf(b, "| Run | %s, %s |\n", m.Started.UTC().Format("2006-01-02 15:04 MST"), m.Finished.Sub(m.Started).Round(time.Second))
	}
	if len(m.Load) > 0 {
		s := slices.Clone(m.Load)
		slices.Sort(s)
		fmt.Fprintf(b, "| 1-min load average during the run | min %.1f, median %.1f, max %.1f (%d samples; on %d CPUs) |\n",
			s[0], s[len(s)/2], s[len(s)-1], len(s), m.NProc)
	}
	if m.QuietWait != "" {
		fmt.Fprintf(b, "| Before the run | %s |\n", m.QuietWait)
	}
	if m.Command != "" {
		fmt.Fprintf(b, "| Command | `%s` |\n", m.Command)
	}
	b.WriteString("\n")
	if len(m.Load) > 0 && slices.Max(m.Load) > float64(max(m.NProc, 1)) {
		fmt.Fprintf(b, "The load average exceeded the CPU count during the run: other work shared the machine. "+
			"Direct and proxy calls were measured in alternating batches, so that load hit both paths alike, "+
			"but the proxy path has two more process hops, each a wake-up that a busy CPU delays: absolute "+
			"latencies and the added time are higher than on an idle machine.\n\n")
	}
}

// targetRow is one line of the targets table.
type targetRow struct {
	target, backend, measured string
	ok                        bool
	// floor marks a reference row: the target applied to a floor, to say
	// whether any process on the path could meet it on this machine.
	floor bool
	// link marks a reference row: the swap target with the large image
	// pulled over a paced link instead of loopback.
	link bool
	// cells are the latency cells the verdict is drawn from: when any was
	// measured under load the verdict is "unreliable" (hygiene.go).
	cells []*Latency
}

// IsFloor tells the floors of BenchmarkCRI (byte relays that parse
// nothing, measured as what any process on the path costs) from inplaced's
// own variants.
func IsFloor(variant string) bool { return strings.HasPrefix(variant, "floor: ") }

// variantNames lists the variants of vs in their first-seen order.
func variantNames(vs []*Latency) []string {
	var out []string
	for _, l := range vs {
		if !slices.Contains(out, l.Variant) {
			out = append(out, l.Variant)
		}
	}
	return out
}

// variantAbout says what a BenchmarkCRI variant is.
func variantAbout(v string) string {
	switch {
	case strings.HasPrefix(v, BaselinePrefix):
		return "a second inplaced, built from commit `" + strings.TrimPrefix(v, BaselinePrefix) + "` (`hack/bench.sh` `BASELINE=`), started as the first: " +
			"the same cells before the change under test."
	case strings.HasPrefix(v, "GOMAXPROCS="):
		return "a second inplaced started with `" + v + "`: the Go scheduler on one OS thread, so a call handed from goroutine to goroutine " +
			"inside inplaced does not wake a second CPU. Not how inplaced is installed."
	case strings.Contains(v, "socat"):
		return "`socat -b 1048576 UNIX-LISTEN:… UNIX-CONNECT:<containerd>`: a C byte relay that copies between the two sockets and parses nothing " +
			"(not a CRI proxy: it cannot see a method). A floor: no proxy on the path can cost less. CPU is not counted (socat forks a child per connection)."
	case IsFloor(v):
		return "`test/bench/floorrelay`: a Go byte relay, one goroutine per direction doing `io.Copy` between the two sockets, parsing nothing " +
			"(not a CRI proxy: it cannot see a method). A floor: no proxy on the path can cost less."
	default:
		return "a variant of inplaced."
	}
}

func (d *doc) targetRows() []targetRow {
	var rows []targetRow
	for _, be := range d.backends {
		for _, conc := range []int{1, 16} {
			pass, n, worst := addedWithin(d.latencies[be], "", conc)
			if n > 0 {
				rows = append(rows, targetRow{
					target:   fmt.Sprintf("p50 added ≤ %s, every call, %s", fmtDur(int64(TargetAddedP50)), callers(conc)),
					backend:  be,
					measured: fmt.Sprintf("%d of %d calls within; largest: %s +%s", pass, n, worst.Method, fmtDur(worst.Proxy.P50-worst.Direct.P50)),
					ok:       pass == n,
					cells:    cellsAt(d.latencies[be], "", conc),
				})
			}
		}
		for _, l := range d.latencies[be] {
			if l.Method != "ListContainers" {
				continue
			}
			r := ratio(float64(l.Proxy.P50), float64(l.Direct.P50))
			rows = append(rows, targetRow{
				target:   fmt.Sprintf("ListContainers (%s) p50 ≤ %.2f× direct, %s", l.Note, TargetListRatio, callers(l.Concurrency)),
				backend:  be,
				measured: fmt.Sprintf("%s (p99 %s)", fmtRatio(r), fmtRatio(ratio(float64(l.Proxy.P99), float64(l.Direct.P99)))),
				ok:       r <= TargetListRatio,
				cells:    []*Latency{l},
			})
		}
		rows = append(rows, d.vsFloorRows(be)...)
		rows = append(rows, d.vsBaselineRows(be)...)
		rows = append(rows, d.floorRows(be)...)
		for _, img := range sortedKeys(d.downtimes[be]) {
			ms := d.downtimes[be][img]
			sw, kl, rc := ms[MethodSwap], ms[MethodKubelet], ms[MethodRecreate]
			if sw != nil && rc != nil {
				r := ratio(float64(Median(sw.Samples)), float64(Median(rc.Samples)))
				rows = append(rows, targetRow{target: fmt.Sprintf("swap downtime ≤ %.1f× pod recreation (%s)", TargetSwapVsRecreate, img),
					backend: be, measured: fmtRatio(r), ok: r <= TargetSwapVsRecreate})
			}
			if strings.HasPrefix(img, "Large over ") && sw != nil && kl != nil {
				r := ratio(float64(Median(sw.Samples)), float64(Median(kl.Samples)))
				rows = append(rows, targetRow{link: true, backend: be,
					target:   fmt.Sprintf("reference, *%s*: swap downtime ≤ %.1f× kubelet-style replacement", img, TargetLargeSwapVsKubelet),
					measured: fmt.Sprintf("%s (%s ÷ %s)", fmtRatio(r), fmtDur(Median(sw.Samples)), fmtDur(Median(kl.Samples))),
					ok:       r <= TargetLargeSwapVsKubelet})
			}
			if img == "Large" && sw != nil && kl != nil {
				r := ratio(float64(Median(sw.Samples)), float64(Median(kl.Samples)))
				rows = append(rows, targetRow{target: fmt.Sprintf("swap downtime ≤ %.1f× kubelet-style replacement (Large)", TargetLargeSwapVsKubelet),
					backend: be, measured: fmtRatio(r), ok: r <= TargetLargeSwapVsKubelet})
				// No replacement through CRI can have less downtime than one
				// StartContainer of the new container: the kubelet-style
				// path's own start step, measured in the same repetitions.
				if len(kl.Steps) == len(kl.Samples) {
					var starts []int64
					for _, st := range kl.Steps {
						if v, ok := st["start"]; ok {
							starts = append(starts, v)
						}
					}
					if len(starts) == len(kl.Samples) {
						fr := ratio(float64(Median(starts)), float64(Median(kl.Samples)))
						rows = append(rows, targetRow{floor: true, backend: be,
							target:   fmt.Sprintf("reference, *floor: one StartContainer*: ≤ %.1f× kubelet-style replacement (Large)", TargetLargeSwapVsKubelet),
							measured: fmt.Sprintf("%s (%s ÷ %s)", fmtRatio(fr), fmtDur(Median(starts)), fmtDur(Median(kl.Samples))),
							ok:       fr <= TargetLargeSwapVsKubelet})
					}
				}
			}
		}
	}
	return rows
}

// cheapestFloor is the floor of backend be that added least to method's
// p50 at conc callers, or nil.
func (d *doc) cheapestFloor(be, method string, conc int) *Latency {
	var best *Latency
	for _, l := range d.variants[be] {
		if IsFloor(l.Variant) && l.Method == method && l.Concurrency == conc &&
			(best == nil || l.Proxy.P50-l.Direct.P50 < best.Proxy.P50-best.Direct.P50) {
			best = l
		}
	}
	return best
}

// addedWithin counts the cells of variant at conc callers among ls, how
// many of them add at most TargetAddedP50 to the p50, and the one that adds
// most.
func addedWithin(ls []*Latency, variant string, conc int) (pass, n int, worst *Latency) {
	for _, l := range ls {
		if l.Variant != variant || l.Concurrency != conc {
			continue
		}
		n++
		if time.Duration(l.Proxy.P50-l.Direct.P50) <= TargetAddedP50 {
			pass++
		}
		if worst == nil || l.Proxy.P50-l.Direct.P50 > worst.Proxy.P50-worst.Direct.P50 {
			worst = l
		}
	}
	return pass, n, worst
}

// floorRows applies the per-call targets to each floor of backend be.
func (d *doc) floorRows(be string) []targetRow {
	var rows []targetRow
	for _, v := range variantNames(d.variants[be]) {
		if !IsFloor(v) {
			continue
		}
		for _, conc := range []int{1, 16} {
			pass, n, worst := addedWithin(d.variants[be], v, conc)
			var list *Latency
			for _, l := range d.variants[be] {
				if l.Variant == v && l.Concurrency == conc && l.Method == "ListContainers" {
					list = l
				}
			}
			if n == 0 {
				continue
			}
			rows = append(rows, targetRow{floor: true, backend: be,
				target:   fmt.Sprintf("reference, *%s*: p50 added ≤ %s, every call, %s", v, fmtDur(int64(TargetAddedP50)), callers(conc)),
				measured: fmt.Sprintf("%d of %d calls within; largest: %s +%s", pass, n, worst.Method, fmtDur(worst.Proxy.P50-worst.Direct.P50)),
				ok:       pass == n, cells: cellsAt(d.variants[be], v, conc)})
			if list != nil {
				r := ratio(float64(list.Proxy.P50), float64(list.Direct.P50))
				rows = append(rows, targetRow{floor: true, backend: be,
					target:   fmt.Sprintf("reference, *%s*: ListContainers p50 ≤ %.2f× direct, %s", v, TargetListRatio, callers(conc)),
					measured: fmtRatio(r), ok: r <= TargetListRatio, cells: []*Latency{list}})
			}
		}
	}
	return rows
}

func (d *doc) targets(b *strings.Builder) {
	rows := d.targetRows()
	if len(rows) == 0 {
		return
	}
	fmt.Fprintf(b, "## Targets\n\n| Target | Backend | Measured | Result |\n|---|---|---|---|\n")
	for _, r := range rows {
		v := verdict(r.ok)
		if r.link {
			v = "met over this link"
			if !r.ok {
				v = "not met over this link"
			}
		}
		if r.floor {
			v = "met by the floor"
			if !r.ok {
				v = "not met even by the floor"
			}
		}
		if why := Unreliable(r.cells...); why != "" {
			v = "unreliable (" + why + ")"
		}
		fmt.Fprintf(b, "| %s | %s | %s | %s |\n", r.target, r.backend, r.measured, v)
	}
	b.WriteString("\n")
	if slices.ContainsFunc(rows, func(r targetRow) bool { return Unreliable(r.cells...) != "" }) {
		fmt.Fprintf(b, "An *unreliable* verdict was drawn from cells measured while other work used more than %.0f%% of the machine's CPUs, "+
			"while the hypervisor stole more than %.0f%% of the machine's CPU time (`/proc/stat` steal), "+
			"or while a floor's p50 moved by more than %.0f%% between the rounds of a cell (section 1, *Conditions*): on this machine such "+
			"a run says nothing either way about the target; it must be measured again on a quiet machine.\n\n", MaxForeignLoadPerCPU*100, MaxSteal*100, MaxFloorDrift*100)
	}
	if slices.ContainsFunc(rows, func(r targetRow) bool { return r.floor }) {
		fmt.Fprintf(b, "The *reference* rows apply the targets to floors measured in the same run. Per call: byte relays that only copy "+
			"between the caller's socket and containerd's (section 1); a per-call target the floor does not meet cannot be met by any process "+
			"between kubelet and containerd on this machine, inplaced or other. Swap: one StartContainer of the new container, the kubelet-style "+
			"path's own start step (section 2): a replacement that stops the old container before it starts the new one, as it must when both "+
			"would share the pod's ports and volumes, cannot have less downtime than that start.\n\n")
	}
	if slices.ContainsFunc(rows, func(r targetRow) bool { return r.link }) {
		fmt.Fprintf(b, "The *Large over …* rows pull the same image over a paced registry link instead of loopback (section 2): "+
			"what a node on such a network sees. They are not how the targets are judged.\n\n")
	}
}

func (d *doc) latency(b *strings.Builder) {
	fmt.Fprintf(b, "## 1. Per-call cost of the proxy\n\n")
	fmt.Fprintf(b, "`BenchmarkCRI` (`test/bench/cri_bench_test.go`). On each backend: %s; "+
		"every container carries kubelet's labels and annotations, so ListContainers answers with a kubelet-sized message. "+
		"One CRI client connection to containerd's socket (*direct*) and one to inplaced's (*proxy*: client → inplaced → containerd), "+
		"shared by all callers as kubelet shares its connection. Each call's latency is timed on its own; "+
		"direct and proxy batches alternate (their order rotating every round) until each path has at least 2000 samples and at least 64 rounds were made, "+
		"so the two paths see the same machine. Percentiles are nearest-rank over all samples. "+
		"Added = proxy p50 − direct p50.\n\n", d.populationNote())
	for _, be := range d.backends {
		ls := d.latencies[be]
		if len(ls) == 0 {
			continue
		}
		fmt.Fprintf(b, "### %s\n\n", be)
		fmt.Fprintf(b, "| Call | Callers | Direct p50 | Proxy p50 | Added p50 | p50 ratio | Direct p99 | Proxy p99 | p99 ratio | inplaced CPU per call | Calls per path | Target | Conditions |\n")
		fmt.Fprintf(b, "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|---|\n")
		for _, l := range ls {
			added := l.Proxy.P50 - l.Direct.P50
			name := l.Method
			if l.Note != "" {
				name += " (" + l.Note + ")"
			}
			target := fmt.Sprintf("added ≤ %s: %s", fmtDur(int64(TargetAddedP50)), judged(time.Duration(added) <= TargetAddedP50, l))
			if l.Method == "ListContainers" {
				target += fmt.Sprintf("; ≤ %.2f×: %s", TargetListRatio, judged(ratio(float64(l.Proxy.P50), float64(l.Direct.P50)) <= TargetListRatio, l))
			}
			cpu := "–"
			if l.ProxyCPUPerCall > 0 {
				cpu = fmtDur(l.ProxyCPUPerCall)
			}
			fmt.Fprintf(b, "| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %d | %s | %s |\n", name, l.Concurrency,
				fmtDur(l.Direct.P50), fmtDur(l.Proxy.P50), fmtDur(added), fmtRatio(ratio(float64(l.Proxy.P50), float64(l.Direct.P50))),
				fmtDur(l.Direct.P99), fmtDur(l.Proxy.P99), fmtRatio(ratio(float64(l.Proxy.P99), float64(l.Direct.P99))),
				cpu, min(l.Direct.N, l.Proxy.N), target, fmtConditions(l.Conditions))
		}
		b.WriteString("\n")
		if vs := d.variants[be]; len(vs) > 0 {
			fmt.Fprintf(b, "The same cells, measured in the same rounds (so against the same direct samples), through other processes in front of the same containerd:\n\n")
			for _, v := range variantNames(vs) {
				fmt.Fprintf(b, "- *%s*: %s\n", v, variantAbout(v))
			}
			fmt.Fprintf(b, "\nThe targets above are judged on inplaced as installed.\n\n")
			conditionsNote(b)
			fmt.Fprintf(b, "| Call | Callers | Path | Direct p50 | Path p50 | Added p50 | p50 ratio | Direct p99 | Path p99 | p99 ratio | CPU per call | p50 moved between rounds | Direct moved between rounds |\n")
			fmt.Fprintf(b, "|---|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
			for _, l := range vs {
				name := l.Method
				if l.Note != "" {
					name += " (" + l.Note + ")"
				}
				cpu := "–"
				if l.ProxyCPUPerCall > 0 {
					cpu = fmtDur(l.ProxyCPUPerCall)
				}
				fmt.Fprintf(b, "| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", name, l.Concurrency, l.Variant,
					fmtDur(l.Direct.P50), fmtDur(l.Proxy.P50), fmtDur(l.Proxy.P50-l.Direct.P50), fmtRatio(ratio(float64(l.Proxy.P50), float64(l.Direct.P50))),
					fmtDur(l.Direct.P99), fmtDur(l.Proxy.P99), fmtRatio(ratio(float64(l.Proxy.P99), float64(l.Direct.P99))), cpu,
					fmtMoved(l.WindowP50), fmtMoved(l.DirectWindowP50))
			}
			b.WriteString("\n")
		}
		d.vsFloorTable(b, be)
		if m := d.memory[be]; m != nil {
			fmt.Fprintf(b, "inplaced after relaying the %d calls of these cells: **VmRSS %.1f MiB**, peak (VmHWM) %.1f MiB (`/proc/<pid>/status`); "+
				"it used %s of CPU for them (the scheduler's run time of its threads, `/proc/<pid>/task/*/schedstat`), %s per call on average. "+
				"*inplaced CPU per call* above is the same per cell.\n\n",
				m.Calls, float64(m.VmRSSKiB)/1024, float64(m.VmHWMKiB)/1024, fmtDur(m.CPUNs), fmtDur(m.CPUNs/max(m.Calls, 1)))
		}
		if p := d.profile[be]; p != nil {
			fmt.Fprintf(b, "Where inplaced's CPU time goes — `perf record -e cpu-clock -p <inplaced>` (self time, %d samples) "+
				"in a phase of its own after the cells above, while each call was made through the proxy for %s by one caller:\n\n", p.Samples, "1.5 s")
			fmt.Fprintf(b, "| Part of inplaced | Share of its CPU samples |\n|---|--:|\n")
			for _, g := range p.Groups {
				fmt.Fprintf(b, "| %s | %.1f%% |\n", g.Name, g.Percent)
			}
			if len(p.PerCall) > 0 {
				fmt.Fprintf(b, "\nWhat inplaced did per relayed call in that phase (`perf stat -e raw_syscalls:sys_enter,context-switches -p`, CPU from `/proc/<pid>/task/*/schedstat`):\n\n")
				fmt.Fprintf(b, "| Call | Calls | System calls per call | Context switches per call | CPU per call |\n|---|--:|--:|--:|--:|\n")
				for _, c := range p.PerCall {
					fmt.Fprintf(b, "| %s | %d | %.1f | %.1f | %s |\n", c.Method, c.Calls, c.Syscalls, c.ContextSwitches, fmtDur(c.CPUNs))
				}
			}
			b.WriteString("\n<details><summary>Top symbols</summary>\n\n| Symbol | Self |\n|---|--:|\n")
			for _, t := range p.Top {
				fmt.Fprintf(b, "| `%s` | %.1f%% |\n", t.Name, t.Percent)
			}
			b.WriteString("\n</details>\n\n")
		}
	}
	d.dominates(b)
	if len(d.inProc) > 0 {
		d.inProcess(b)
	}
	if len(d.relayCost) > 0 {
		d.relayCostTable(b)
	}
}

// sameCell says whether x measured the same cell as l: method, callers and
// variant (of one backend).
func (l *Latency) sameCell(x *Latency) bool {
	return x.Method == l.Method && x.Concurrency == l.Concurrency && x.Variant == l.Variant
}

// relayCostPhase is the Latency.Phase of BenchmarkRelayCost's cells
// (test/bench/relaycost_test.go).
const relayCostPhase = "relay cost"

// relayCostTable renders BenchmarkRelayCost: each relay as a process of its
// own in front of an in-memory backend, against the Go floor of the same
// rounds.
func (d *doc) relayCostTable(b *strings.Builder) {
	fmt.Fprintf(b, "### What relaying costs a process of its own\n\n")
	fmt.Fprintf(b, "`BenchmarkRelayCost` (`test/bench/relaycost_test.go`): an in-memory CRI server (no containerd) and, each in a process of its own "+
		"in front of it, the Go byte relay (the floor), `pkg/relay` as inplaced serves it (the HTTP/2 router, no interceptors) and `pkg/relay` "+
		"behind grpc-go's server (every call through grpc-go's server and client: the relay before the router, and today its intercepted path); "+
		"direct and relayed batches alternate, at 1 and 16 callers sharing one connection. *CPU per call* is the relay process's CPU time "+
		"(its threads' run time, `/proc/<pid>/task/*/schedstat`) over the calls it relayed; *instructions per call* (user space, "+
		"`valgrind --tool=callgrind`) are there only when the run set `INPLACED_RELAY_COST_VALGRIND=1`, and then latency and CPU are valgrind's "+
		"and no CPU is shown. *÷ floor* compares with the Go byte relay's figure of the same cell. No target is judged here: the proxy's cost "+
		"targets are judged on BenchmarkCRI, against containerd (section 1).\n\n")
	fmt.Fprintf(b, "| Call | Callers | Relay | Direct p50 | Relayed p50 | Added p50 | ÷ floor | CPU per call | ÷ floor | Instructions per call | ÷ floor | p50 moved between rounds | Conditions |\n")
	fmt.Fprintf(b, "|---|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|\n")
	for _, l := range d.relayCost {
		var floor *Latency
		if i := slices.IndexFunc(d.relayCost, func(f *Latency) bool {
			return f.Variant == GoFloor && f.Method == l.Method && f.Concurrency == l.Concurrency
		}); i >= 0 {
			floor = d.relayCost[i]
		}
		vsFloor := func(f func(*Latency) int64) string {
			if floor == nil || l == floor || f(l) <= 0 || f(floor) <= 0 {
				return "–"
			}
			return fmtRatio(ratio(float64(f(l)), float64(f(floor))))
		}
		added := func(x *Latency) int64 { return x.Proxy.P50 - x.Direct.P50 }
		cpu := func(x *Latency) int64 { return x.ProxyCPUPerCall }
		instr := func(x *Latency) int64 { return x.ProxyInstrPerCall }
		cpuS, instrS := "–", "–"
		if l.ProxyCPUPerCall > 0 {
			cpuS = fmtDur(l.ProxyCPUPerCall)
		}
		if l.ProxyInstrPerCall > 0 {
			instrS = fmt.Sprintf("%.1f k", float64(l.ProxyInstrPerCall)/1e3)
		}
		fmt.Fprintf(b, "| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", l.Method, l.Concurrency, l.Variant,
			fmtDur(l.Direct.P50), fmtDur(l.Proxy.P50), fmtDur(added(l)), vsFloor(added), cpuS, vsFloor(cpu), instrS, vsFloor(instr),
			fmtMoved(l.WindowP50), fmtConditions(l.Conditions))
	}
	b.WriteString("\n")
}

// dominates says, from this run's figures, what the proxy's added time is
// made of.
func (d *doc) dominates(b *strings.Builder) {
	var lines []string
	for _, be := range d.backends {
		var v *Latency
		for _, l := range d.latencies[be] {
			if l.Method == "Version" && l.Concurrency == 1 {
				v = l
			}
		}
		p := d.profile[be]
		if v == nil || p == nil {
			continue
		}
		share := map[string]float64{}
		for _, g := range p.Groups {
			share[g.Name] = g.Percent
		}
		var sys, cs float64
		for _, c := range p.PerCall {
			if c.Method == "Version" {
				sys, cs = c.Syscalls, c.ContextSwitches
			}
		}
		line := fmt.Sprintf("- **%s**: one round trip to containerd (direct Version, 1 caller) takes %s at the median; the proxy puts a second one in the path "+
			"(caller → inplaced → containerd) and adds %s (%s the direct time). Of inplaced's CPU samples, its own code (the HTTP/2 router, relay and interceptors) is %.1f%%, "+
			"HTTP/2 framing and gRPC (`golang.org/x/net/http2`, grpc-go) %.1f%%, the Go runtime (scheduler, allocation, GC) %.1f%% and the kernel %.1f%%; "+
			"per relayed Version call it made %.0f system calls and %.0f context switches.",
			be, fmtDur(v.Direct.P50), fmtDur(v.Proxy.P50-v.Direct.P50), fmtRatio(ratio(float64(v.Proxy.P50-v.Direct.P50), float64(v.Direct.P50))),
			share["inplaced: relay and interceptors"], share["gRPC and HTTP/2 transport"], share["Go runtime: scheduler, allocation, GC"],
			share["kernel: syscalls, socket I/O, scheduling"], sys, cs)
		if len(p.Top) > 0 && p.Top[0].Name == "pvm_irq_enable" {
			line += fmt.Sprintf(" The top symbol, `pvm_irq_enable` (%.0f%%), is where this paravirtualized (PVM) guest kernel re-enables interrupts: "+
				"samples that fall while the kernel runs with interrupts off — system call entry and exit, context switches — are counted there. "+
				"That kernel work, paid on every system call and context switch, not the relay's own work, is where the added time goes.", p.Top[0].Percent)
		}
		if f := d.cheapestFloor(be, "Version", 1); f != nil {
			fa, ia := f.Proxy.P50-f.Direct.P50, v.Proxy.P50-v.Direct.P50
			line += fmt.Sprintf(" In the same rounds the cheapest floor (*%s*, a relay that only copies bytes) added %s to the same call: "+
				"that much is the price of one more process on the path on this machine, whatever it does", f.Variant, fmtDur(fa))
			if ia > fa {
				line += fmt.Sprintf("; the other %s is inplaced's own work on the call", fmtDur(ia-fa))
			} else {
				line += "; inplaced added no more than that"
			}
			line += ". No swap runs here, so none of the calls measured is intercepted: inplaced's HTTP/2 router (`pkg/relay/server.go`) " +
				"forwards each call's frames to its connection to containerd — it decodes the stream's headers to read `:path`, re-encodes them " +
				"(HPACK) for the backend connection and keeps stream IDs and flow control per connection — with no gRPC server or client on the path."
		}
		lines = append(lines, line)
	}
	if len(lines) == 0 {
		return
	}
	fmt.Fprintf(b, "### What the proxy's time is made of\n\n")
	fmt.Fprintf(b, "%s\n\n", strings.Join(lines, "\n"))
	fmt.Fprintf(b, "perf was attached only in the profile phase (its sampling and counting inflate the CPU per call seen there); the cells' *inplaced CPU per call* were measured without it. "+
		"The `GOMAXPROCS=1` rows show how much of the cost is the Go scheduler handing work between threads.\n\n")
}

// inProcess renders BenchmarkRelay's results: per build (phase), relay
// variant and call, the median over runs of each run's p50s.
// BenchmarkRelayCost's cells have a table of their own (relayCostTable).
func (d *doc) inProcess(b *strings.Builder) {
	type key struct{ phase, variant, method string }
	var order []key
	runs := map[key][]*Latency{}
	for _, l := range d.inProc {
		k := key{l.Phase, l.Variant, l.Method}
		if k.phase == "" {
			k.phase = "this commit"
		}
		if k.variant == "" {
			k.variant = "interceptors"
		}
		if _, ok := runs[k]; !ok {
			order = append(order, k)
		}
		runs[k] = append(runs[k], l)
	}
	fmt.Fprintf(b, "### The relay in process\n\n")
	fmt.Fprintf(b, "`BenchmarkRelay` (`test/bench/relay_bench_test.go`): the relay in the benchmark's own process, served as inplaced serves it "+
		"(the HTTP/2 router), in front of an in-memory CRI server (no containerd), one caller, direct and relayed batches alternating — "+
		"the proxy's cost without the runtime's. "+
		"*interceptors* is the relay with inplaced's interceptor table but without the gates inplaced adds (`relay.WithGate`): ListContainers has "+
		"an interceptor, so the router hands its streams to the in-process gRPC server, whose watching interceptor passes the call on — the path "+
		"kubelet's relist takes in inplaced while a swap runs; Version has none and is forwarded frame by frame. "+
		"*bare* has no table: every call is forwarded frame by frame, as inplaced forwards kubelet's relists while no swap runs. "+
		"*Relay heap per call* is what the relayed batches allocated per call beyond the direct ones (`runtime.MemStats` around each batch). "+
		"Rows of another build come from `RELAY_AB=<commit> make bench`: the same benchmark built with `pkg/relay` of that commit and of this tree, run alternately; "+
		"with several runs, each figure is the median of the runs' figures.\n\n")
	fmt.Fprintf(b, "| Build | Relay | Call | Runs | Direct p50 | Relayed p50 | Added p50 | p50 ratio | Direct p99 | Relayed p99 | Relay heap per call |\n")
	fmt.Fprintf(b, "|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, k := range order {
		ls := runs[k]
		pick := func(f func(*Latency) int64) int64 {
			v := make([]int64, len(ls))
			for i, l := range ls {
				v[i] = f(l)
			}
			return Median(v)
		}
		dp50 := pick(func(l *Latency) int64 { return l.Direct.P50 })
		pp50 := pick(func(l *Latency) int64 { return l.Proxy.P50 })
		added := pick(func(l *Latency) int64 { return l.Proxy.P50 - l.Direct.P50 })
		name := k.method
		if ls[0].Note != "" {
			name += " (" + ls[0].Note + ")"
		}
		ratios := make([]int64, len(ls))
		for i, l := range ls {
			ratios[i] = int64(1e6 * ratio(float64(l.Proxy.P50), float64(l.Direct.P50)))
		}
		heap := "–"
		if ab := pick(func(l *Latency) int64 { return l.ProxyAllocBytes }); ab != 0 {
			heap = fmt.Sprintf("%s in %d objects", fmtBytes(ab), pick(func(l *Latency) int64 { return l.ProxyAllocs }))
		}
		fmt.Fprintf(b, "| %s | %s | %s | %d | %s | %s | %s | %s | %s | %s | %s |\n", k.phase, k.variant, name, len(ls),
			fmtDur(dp50), fmtDur(pp50), fmtDur(added), fmtRatio(float64(Median(ratios))/1e6),
			fmtDur(pick(func(l *Latency) int64 { return l.Direct.P99 })), fmtDur(pick(func(l *Latency) int64 { return l.Proxy.P99 })), heap)
	}
	b.WriteString("\n")
	// What the watching interceptor costs ListContainers, in this build.
	it, ok1 := runs[key{"this commit", relayTable, "ListContainers"}]
	bare, ok2 := runs[key{"this commit", relayBare, "ListContainers"}]
	if ok1 && ok2 {
		added := func(l *Latency) int64 { return l.Proxy.P50 - l.Direct.P50 }
		fmt.Fprintf(b, "In this build, ListContainers through the relay with inplaced's interceptors adds %s and allocates %s per call; "+
			"through the bare relay %s and %s. The difference is the intercepted path: the in-process gRPC server decodes the call and the "+
			"relay reads the answer into a `[]byte` for the interceptor before it passes it on. inplaced takes that path for ListContainers only "+
			"while a swap has a fence up (its gates); with no swap, kubelet's relist costs the bare figures.\n\n",
			fmtDur(added(it[0])), fmtBytes(it[0].ProxyAllocBytes), fmtDur(added(bare[0])), fmtBytes(bare[0].ProxyAllocBytes))
	}
}

// BenchmarkRelay's variants.
const (
	relayTable = "interceptors"
	relayBare  = "bare"
)

func (d *doc) populationNote() string {
	for _, be := range d.backends {
		for _, l := range d.latencies[be] {
			if l.Method == "ListContainers" && l.Note != "" {
				return "10 pods of 10 containers (" + l.Note + " in all, each running the test pause image)"
			}
		}
	}
	return "10 pods of 10 containers (each running the test pause image)"
}

var methodTitle = map[string]string{
	MethodSwap:     "swap (inplaced)",
	MethodKubelet:  "kubelet-style replacement",
	MethodRecreate: "pod recreation",
}

var stepOrder = map[string][]string{
	MethodSwap:     {"pull", "create-new", "pre-stop", "stop-old", "start-new", "health-gate"},
	MethodKubelet:  {"stop", "pull", "create", "start"},
	MethodRecreate: {"stop", "stop-sandbox", "remove-sandbox", "run-sandbox", "create", "start"},
}

// hasLinkImages says whether the run pulled the large image over links.
func (d *doc) hasLinkImages() bool {
	for _, imgs := range d.downtimes {
		for img := range imgs {
			if strings.HasPrefix(img, "Large over ") {
				return true
			}
		}
	}
	return false
}

func (d *doc) downtime(b *strings.Builder) {
	fmt.Fprintf(b, "## 2. Swap downtime\n\n")
	fmt.Fprintf(b, "`BenchmarkReplace` (`test/bench/replace_bench_test.go`). A pod runs App1 (an HTTP server that exits on SIGTERM); "+
		"its container is replaced by a new image three ways. Downtime is the same for all three: from the **old container stopped "+
		"(its StopContainer returned) until StartContainer of the new one returned** — the time the container name has nothing running. "+
		"The stop itself (SIGTERM, the app's exit, containerd's task cleanup) is the same work in all three and is shown as a step, outside the downtime.\n\n"+
		"- **swap**: `inplacectl swap --id … --image … --min-runtime 200ms -o json`, the record's `downtime_ns`. inplaced pulls the image and creates the new container *before* it stops the old one, so only starting the new container is downtime; the health gate runs after it, also outside.\n"+
		"- **kubelet-style replacement**: what kubelet does when a pod's image changes, directly on containerd: StopContainer, then PullImage → CreateContainer (attempt 1) → StartContainer.\n"+
		"- **pod recreation**: StopContainer, then StopPodSandbox → RemovePodSandbox → RunPodSandbox (new network namespace, CNI bridge ADD) → CreateContainer → StartContainer, with the image already on the node (no pull: the fastest a new pod can be).\n\n"+
		"Before every swap and kubelet-style repetition the new image is removed from the node (CRI RemoveImage, after the pods that used it are gone; for Large the run checks that the 100 MiB blob left containerd's content store), "+
		"so both really pull it from the loopback registry. Small image: App2 (busybox + the v2 app binary). Large: App1 plus a 100 MiB layer of random data. "+
		"Every repetition uses a fresh pod; the three methods take turns in a rotating order. Figures are medians.\n\n")
	if d.hasLinkImages() {
		fmt.Fprintf(b, "*Large over …*: the same large image pulled from a second port of the same registry that paces its answers "+
			"to that rate, all transfers through it together (`harness.Registry.StartLink`), as a node's network link would: the loopback "+
			"registry is faster than any network, and the kubelet-style replacement's downtime is mostly its pull. "+
			"The targets are judged on loopback (*Large*); these rows are what a node on such a link sees.\n\n")
	}
	for _, be := range d.backends {
		imgs := d.downtimes[be]
		if len(imgs) == 0 {
			continue
		}
		fmt.Fprintf(b, "### %s\n\n", be)
		fmt.Fprintf(b, "| New image | Swap downtime | Kubelet-style | Pod recreation | Swap ÷ kubelet-style | Swap ÷ recreation | Repetitions | Target |\n")
		fmt.Fprintf(b, "|---|--:|--:|--:|--:|--:|--:|---|\n")
		for _, img := range sortedKeys(imgs) {
			ms := imgs[img]
			sw, kl, rc := med(ms[MethodSwap]), med(ms[MethodKubelet]), med(ms[MethodRecreate])
			var targets []string
			if sw > 0 && rc > 0 {
				targets = append(targets, fmt.Sprintf("÷ recreation ≤ %.1f: %s", TargetSwapVsRecreate, verdict(ratio(float64(sw), float64(rc)) <= TargetSwapVsRecreate)))
			}
			if img == "Large" && sw > 0 && kl > 0 {
				targets = append(targets, fmt.Sprintf("÷ kubelet-style ≤ %.1f: %s", TargetLargeSwapVsKubelet, verdict(ratio(float64(sw), float64(kl)) <= TargetLargeSwapVsKubelet)))
			}
			fmt.Fprintf(b, "| %s | %s | %s | %s | %s | %s | %d | %s |\n", img, fmtDur(sw), fmtDur(kl), fmtDur(rc),
				fmtRatio(ratio(float64(sw), float64(kl))), fmtRatio(ratio(float64(sw), float64(rc))), reps(ms), strings.Join(targets, "; "))
		}
		b.WriteString("\n")
		fmt.Fprintf(b, "Where the time goes (median of each step, in the order they ran; the downtime is the steps after the stop: "+
			"for the swap `start-new` alone, since `pull`, `create-new`, `pre-stop` and `stop-old` come before it and `health-gate` after):\n\n")
		fmt.Fprintf(b, "| New image | Method | Steps (median) | Downtime samples |\n|---|---|---|---|\n")
		for _, img := range sortedKeys(imgs) {
			for _, m := range []string{MethodSwap, MethodKubelet, MethodRecreate} {
				x := imgs[img][m]
				if x == nil {
					continue
				}
				var steps []string
				for _, s := range stepOrder[m] {
					var v []int64
					for _, st := range x.Steps {
						if n, ok := st[s]; ok {
							v = append(v, n)
						}
					}
					if len(v) > 0 {
						steps = append(steps, fmt.Sprintf("%s %s", s, fmtDur(Median(v))))
					}
				}
				var samples []string
				for _, s := range x.Samples {
					samples = append(samples, fmtDur(s))
				}
				fmt.Fprintf(b, "| %s | %s | %s | %s |\n", img, methodTitle[m], strings.Join(steps, " · "), strings.Join(samples, ", "))
			}
		}
		b.WriteString("\n")
		// kubelet does not remove the old sandbox before it runs the new one
		// (its GC does, later): say what the recreation costs without it.
		for _, img := range sortedKeys(imgs) {
			rc, sw := imgs[img][MethodRecreate], imgs[img][MethodSwap]
			if rc == nil || sw == nil || len(rc.Steps) != len(rc.Samples) {
				continue
			}
			var without []int64
			for i, s := range rc.Samples {
				without = append(without, s-rc.Steps[i]["remove-sandbox"])
			}
			fmt.Fprintf(b, "- %s: pod recreation without the RemovePodSandbox step (kubelet's GC removes the old sandbox later) takes %s; the swap is %s of that.\n",
				img, fmtDur(Median(without)), fmtRatio(ratio(float64(Median(sw.Samples)), float64(Median(without)))))
		}
		// The kubelet-style replacement is the swap's steps plus the pull:
		// say how long a pull would have to take for the 0.1× target.
		if kl, sw := imgs["Large"][MethodKubelet], imgs["Large"][MethodSwap]; kl != nil && sw != nil && len(kl.Steps) == len(kl.Samples) {
			var rest, pulls []int64
			for i, s := range kl.Samples {
				rest = append(rest, s-kl.Steps[i]["pull"])
				pulls = append(pulls, kl.Steps[i]["pull"])
			}
			need := int64(float64(Median(sw.Samples))/TargetLargeSwapVsKubelet) - Median(rest)
			fmt.Fprintf(b, "- Large: the kubelet-style replacement's downtime is pull + create + start; without its pull it took %s (median; the swap: %s), "+
				"and the pull itself %s (100 MiB from a registry on loopback: the best case for kubelet). "+
				"Derived from these medians, not measured: the swap would be ≤ %.1f× once a pull of the new layers takes ≥ %s "+
				"(≈ %.0f MiB/s or less for this 100 MiB layer).\n",
				fmtDur(Median(rest)), fmtDur(Median(sw.Samples)), fmtDur(Median(pulls)), TargetLargeSwapVsKubelet, fmtDur(need),
				100/max(time.Duration(need).Seconds(), 1e-9))
		}
		b.WriteString("\n")
	}
}

func med(x *Downtime) int64 {
	if x == nil {
		return 0
	}
	return Median(x.Samples)
}

func reps(ms map[string]*Downtime) int {
	n := 0
	for i, x := range ms {
		if _, ok := methodTitle[i]; ok && (n == 0 || len(x.Samples) < n) {
			n = len(x.Samples)
		}
	}
	return n
}

func sortedKeys[V any](m map[string]V) []string {
	ks := slices.Collect(maps.Keys(m))
	// "App2" before "Large"; anything else alphabetically.
	sort.Strings(ks)
	return ks
}

// Resize variants as BenchmarkResize names them.
const (
	resizeInplaced = "inplaced"
	resizeCRI      = "cri"
	resizeCgroup   = "cgroup"
)

func (d *doc) resize(b *strings.Builder) {
	fmt.Fprintf(b, "## 3. In-place resize\n\n")
	if len(d.rz) == 0 {
		if d.in.ResizeFile {
			fmt.Fprintf(b, "`test/bench/resize_bench_test.go` was present but reported no `BenchmarkResize/<backend>/<variant>` results in this run (skipped or failed: see the bench log).\n\n")
		} else {
			fmt.Fprintf(b, "*Placeholder:* `test/bench/resize_bench_test.go` did not exist when this run was made. "+
				"`hack/bench.sh` runs every benchmark in `test/bench/`, so the next `make bench` after that file lands fills this section "+
				"with its `BenchmarkResize/<backend>/{inplaced,cri,cgroup}` results as ratios.\n\n")
		}
		return
	}
	fmt.Fprintf(b, "`BenchmarkResize` (`test/bench/resize_bench_test.go`): one CPU-limit change of a running container (alternating 1000m and 1200m), "+
		"three ways in the same run — through inplaced's control API (resolve, runtime call, cgroup read-back and verification, history record), "+
		"CRI UpdateContainerResources directly on containerd (runc update), and the write of `cpu.cfs_quota_us` alone. Time per operation from `go test -bench` (ns/op).\n\n")
	fmt.Fprintf(b, "| Backend | Through inplaced | CRI UpdateContainerResources | cgroup file write | inplaced ÷ CRI | inplaced ÷ cgroup write | CRI ÷ cgroup write |\n")
	fmt.Fprintf(b, "|---|--:|--:|--:|--:|--:|--:|\n")
	for _, be := range d.rzOrder {
		v := d.rz[be]
		ns := func(k string) float64 { return v[k].Metrics["ns/op"] }
		cell := func(k string) string {
			if _, ok := v[k]; !ok {
				return "–"
			}
			return fmt.Sprintf("%s (%d ops)", fmtNs(ns(k)), v[k].N)
		}
		fmt.Fprintf(b, "| %s | %s | %s | %s | %s | %s | %s |\n", be, cell(resizeInplaced), cell(resizeCRI), cell(resizeCgroup),
			fmtRatio(ratio(ns(resizeInplaced), ns(resizeCRI))), fmtRatio(ratio(ns(resizeInplaced), ns(resizeCgroup))), fmtRatio(ratio(ns(resizeCRI), ns(resizeCgroup))))
		for _, k := range sortedKeys(v) {
			if k != resizeInplaced && k != resizeCRI && k != resizeCgroup {
				fmt.Fprintf(b, "| %s (%s) | %s | | | | | |\n", be, k, fmtNs(ns(k)))
			}
		}
	}
	b.WriteString("\n")
}

// swapRuntime is BenchmarkSwapRuntime's section: swap downtime on gVisor
// (runsc) against runc, in the same run.
func (d *doc) swapRuntime(b *strings.Builder) {
	fmt.Fprintf(b, "## 4. Swap downtime on a sandboxed runtime (gVisor)\n\n")
	if len(d.swapRT) == 0 {
		fmt.Fprintf(b, "`BenchmarkSwapRuntime` (`test/bench/runtime_bench_test.go`) reported no results in this run (not selected, skipped or failed: see the bench log).\n\n")
		return
	}
	fmt.Fprintf(b, "`BenchmarkSwapRuntime` (`test/bench/runtime_bench_test.go`): `inplacectl swap` App1 → App2 in a fresh pod per repetition, "+
		"on gVisor (CRI handler `runsc`, systrap platform) and on runc, taking turns in the same run; the new image is already on the node. "+
		"Downtime is the record's `downtime_ns` (old container stopped → new one started); medians. "+
		"On gVisor the sandbox (the sentry) is kept across the swap, as the pod's network namespace and IP are on both.\n\n")
	fmt.Fprintf(b, "| Backend | gVisor (runsc) | runc | runsc ÷ runc | start-new on runsc | start-new on runc | Repetitions each |\n")
	fmt.Fprintf(b, "|---|--:|--:|--:|--:|--:|--:|\n")
	for _, gb := range d.swapRT {
		m := gb.Metrics
		ms := func(k string) string { return fmtNs(m[k] * 1e6) }
		fmt.Fprintf(b, "| %s | %s | %s | %s | %s | %s | %.0f |\n", strings.TrimPrefix(gb.Name, "BenchmarkSwapRuntime/"),
			ms("runsc-ms"), ms("runc-ms"), fmtRatio(m["runsc/runc"]), ms("runsc-start-new-ms"), ms("runc-start-new-ms"), m["reps"])
	}
	b.WriteString("\n")
}

// swapHold is BenchmarkSwapHold's section: what a client dialling the pod IP
// sees during a swap, with the connection hold and without it.
func (d *doc) swapHold(b *strings.Builder) {
	fmt.Fprintf(b, "## 5. New connections during a swap: the connection hold on and off\n\n")
	if len(d.hold) == 0 {
		fmt.Fprintf(b, "`BenchmarkSwapHold` (`test/bench/hold_bench_test.go`) reported no results in this run (not selected, skipped or failed: see the bench log).\n\n")
		d.holdRelease(b)
		d.swapOverlap(b)
		return
	}
	fmt.Fprintf(b, "`BenchmarkSwapHold` (`test/bench/hold_bench_test.go`): `inplacectl swap` App1 → App2 in a fresh pod per repetition, "+
		"with the connection hold (`queue`, the default) and without it (the pod's annotation `inplaced.io/connection-hold: off`), taking turns; "+
		"a client on the node opens a new TCP connection to the pod IP every 5 ms from 300 ms before the swap to 300 ms after. "+
		"*Failed*: refused, reset or timed out, summed over the repetitions. *Slowest*: the slowest handshake of a repetition, median. "+
		"*Gap*: the hold's duration from the record (installed → the new process listening), median. "+
		"Target: no failure with the hold, and every repetition's slowest handshake within 1.2 × its gap + 20 ms (*worst ratio* ≤ 1).\n\n")
	fmt.Fprintf(b, "| Backend | Failed, hold | Slowest, hold | Gap | Worst ratio | Failed, off | Slowest, off | Repetitions each | Target |\n")
	fmt.Fprintf(b, "|---|--:|--:|--:|--:|--:|--:|--:|---|\n")
	for _, gb := range d.hold {
		m := gb.Metrics
		ms := func(k string) string { return fmtNs(m[k] * 1e6) }
		verdict := "**PASS**"
		if m["hold-failed"] > 0 || m["slowest/limit"] > 1 {
			verdict = "**FAIL**"
		}
		fmt.Fprintf(b, "| %s | %.0f | %s | %s | %.2f | %.0f | %s | %.0f | %s |\n", strings.TrimPrefix(gb.Name, "BenchmarkSwapHold/"),
			m["hold-failed"], ms("hold-slowest-ms"), ms("hold-gap-ms"), m["slowest/limit"], m["off-failed"], ms("off-slowest-ms"), m["reps"], verdict)
	}
	b.WriteString("\n")
	d.holdRelease(b)
	d.swapOverlap(b)
}

// swapOverlap is BenchmarkSwapOverlap's part of section 5: stop-first with
// the connection hold against the overlap swap, in the same run.
func (d *doc) swapOverlap(b *strings.Builder) {
	fmt.Fprintf(b, "### Stop-first with the hold against the overlap swap\n\n")
	if len(d.overlap) == 0 {
		fmt.Fprintf(b, "`BenchmarkSwapOverlap` (`test/bench/overlap_bench_test.go`) reported no results in this run (not selected, skipped or failed: see the bench log).\n\n")
		return
	}
	fmt.Fprintf(b, "`BenchmarkSwapOverlap` (`test/bench/overlap_bench_test.go`): the same swap of the test app draining on SIGTERM (`-drain=300ms`), "+
		"a fresh pod per repetition, *stop-first* with the connection hold (the default) or *overlap* (the pod's annotation "+
		"`inplaced.io/swap-strategy: overlap`), taking turns, under a new TCP connection every 5 ms and 20 keep-alive connections sending a request "+
		"every 50 ms each. *Failed*: connections and requests refused, reset, timed out or unanswered, summed. *Slowest*: the slowest new "+
		"connection's handshake during the swap, median. *Excess*: the slowest during the swap less the slowest in as long a time before it, worst. "+
		"*Closed early / ended*: keep-alive connections the server ended before the old container was asked to stop (lost to the swap), "+
		"and in all (the old process's drain ends the rest), summed. "+
		"Target for overlap: no failure, every repetition's excess at most 5 ms, no keep-alive connection closed early.\n\n")
	fmt.Fprintf(b, "| Backend | Failed, stop-first | Slowest, stop-first | Excess, stop-first | Closed early / ended, stop-first | Failed, overlap | Slowest, overlap | Excess, overlap | Closed early / ended, overlap | Repetitions each | Target |\n")
	fmt.Fprintf(b, "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|\n")
	for _, gb := range d.overlap {
		m := gb.Metrics
		ms := func(k string) string { return fmtNs(m[k] * 1e6) }
		verdict := "**PASS**"
		if m["overlap-failed"] > 0 || m["overlap-excess-ms"] > 5 || m["overlap-closed-early"] > 0 {
			verdict = "**FAIL**"
		}
		fmt.Fprintf(b, "| %s | %.0f | %s | %s | %.0f / %.0f | %.0f | %s | %s | %.0f / %.0f | %.0f | %s |\n", strings.TrimPrefix(gb.Name, "BenchmarkSwapOverlap/"),
			m["stop-first-failed"], ms("stop-first-slowest-ms"), ms("stop-first-excess-ms"), m["stop-first-closed-early"], m["stop-first-ended"],
			m["overlap-failed"], ms("overlap-slowest-ms"), ms("overlap-excess-ms"), m["overlap-closed-early"], m["overlap-ended"], m["reps"], verdict)
	}
	b.WriteString("\n")
}

// holdRelease is BenchmarkHoldRelease's part of section 5: the parked SYNs
// released to a small backlog, paced against one batch.
func (d *doc) holdRelease(b *strings.Builder) {
	fmt.Fprintf(b, "### The release to a server with a listen backlog of 5: paced against one batch\n\n")
	if len(d.release) == 0 {
		fmt.Fprintf(b, "`BenchmarkHoldRelease` (`test/bench/hold_bench_test.go`) reported no results in this run (not selected, skipped or failed: see the bench log).\n\n")
		return
	}
	fmt.Fprintf(b, "`BenchmarkHoldRelease` (`test/bench/hold_bench_test.go`): the same swap of a server with a listen backlog of 5 that serves one "+
		"connection at a time (the test app's `-backlog=5 -serial`, the shape of busybox httpd or Python's `http.server`), a fresh pod per repetition, "+
		"the parked SYNs released *paced* to the new listener's accept queue (the default) or in *one batch* (the release before pacing), taking turns. "+
		"*Late*: connections whose handshake waited past the release + 50 ms (a SYN the kernel dropped for a full accept queue comes back a second later), "+
		"summed. *Slowest*: the slowest handshake of a repetition, median and worst. Target: paced, no failure and none late.\n\n")
	fmt.Fprintf(b, "| Backend | Failed, paced | Late, paced | Slowest, paced (median / worst) | Failed, one batch | Late, one batch | Slowest, one batch (median / worst) | Repetitions each | Target |\n")
	fmt.Fprintf(b, "|---|--:|--:|--:|--:|--:|--:|--:|---|\n")
	for _, gb := range d.release {
		m := gb.Metrics
		ms := func(k string) string { return fmtNs(m[k] * 1e6) }
		verdict := "**PASS**"
		if m["paced-failed"] > 0 || m["paced-late"] > 0 {
			verdict = "**FAIL**"
		}
		fmt.Fprintf(b, "| %s | %.0f | %.0f | %s / %s | %.0f | %.0f | %s / %s | %.0f | %s |\n", strings.TrimPrefix(gb.Name, "BenchmarkHoldRelease/"),
			m["paced-failed"], m["paced-late"], ms("paced-slowest-ms"), ms("paced-worst-ms"),
			m["batch-failed"], m["batch-late"], ms("batch-slowest-ms"), ms("batch-worst-ms"), m["reps"], verdict)
	}
	b.WriteString("\n")
}
