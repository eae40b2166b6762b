package report

import (
	"fmt"
	"slices"
	"strings"
)

// Benchmark hygiene: every latency cell carries the conditions it was
// measured under, and a verdict drawn from a cell measured under load is
// reported as unreliable instead of as a pass or a fail.
//
// The machine's own load average cannot say that alone: the benchmark
// itself keeps about one CPU busy (the caller, the relay and containerd
// hand one call along), more at 16 callers. What distorts a comparison is
// *other* work competing for the CPUs, so the rule is taken on the CPU
// time that processes outside the benchmark used during the cell
// (Conditions.ForeignCPU, in CPUs: the same unit as a load average), and on
// the floors themselves: a relay that only copies bytes costs the same in
// every round on a quiet machine, so a floor whose p50 moved by more than
// MaxFloorDrift between the rounds of a cell says that the machine changed
// under the measurement.
//
// On a virtual machine the host's other guests compete too, and no
// process inside the guest shows it: the time the hypervisor ran something
// else while a vCPU wanted to run is /proc/stat's steal column. A cell
// during which more than MaxSteal of the machine's CPU time was stolen is
// not judged either: a stolen wake-up delays one path and not the other.
const (
	// MaxForeignLoadPerCPU is the most CPU other work may use, per CPU of
	// the machine, for a cell to count: 1 on 2 CPUs.
	MaxForeignLoadPerCPU = 0.5
	// MaxFloorDrift bounds how far a floor's p50 may move between the
	// windows of one cell ((max − min) ÷ min of the windows' p50s).
	MaxFloorDrift = 0.30
	// DriftWindows is how many consecutive windows of rounds a cell's
	// samples are split into to measure drift.
	DriftWindows = 4
	// MaxSteal is the largest share of the machine's CPU time the
	// hypervisor may have stolen during a cell for it to count.
	MaxSteal = 0.05
)

// Conditions is how busy the machine was while one cell was measured. All
// paths of a cell share them: their batches alternate.
type Conditions struct {
	NProc int `json:"nproc"`
	// Load1Start and Load1Max are the 1-minute load average when the cell
	// began and the highest sampled during it (the benchmark's own work
	// included).
	Load1Start float64 `json:"load1_start"`
	Load1Max   float64 `json:"load1_max"`
	// RunQueueMean and RunQueueMax are /proc/stat procs_running sampled
	// during the cell (runnable tasks on the whole machine, the benchmark's
	// and the sampler's included).
	RunQueueMean float64 `json:"run_queue_mean"`
	RunQueueMax  int     `json:"run_queue_max"`
	// ForeignCPU is the CPU time, in CPUs, that processes outside the
	// benchmark (the test binary, the containerd and proxies it started)
	// used during the cell: machine busy time (/proc/stat) minus the
	// benchmark's own (/proc/<pid>/stat). -1 when unknown.
	ForeignCPU float64 `json:"foreign_cpu"`
	// Steal is the share of the machine's CPU time (all of /proc/stat's
	// "cpu" line) that was steal during the cell: time a vCPU wanted to
	// run while the hypervisor ran something else. nil when not recorded
	// (a results file from before it was, or no /proc/stat).
	Steal *float64 `json:"steal,omitempty"`
}

// fmtMoved is the Drift of windowed p50s in a table cell: "–" when there
// are not two windows.
func fmtMoved(p50s []int64) string {
	if len(p50s) < 2 {
		return "–"
	}
	return fmt.Sprintf("%.0f%%", Drift(p50s)*100)
}

// Drift is how far windowed p50s moved: (max − min) ÷ min; 0 for fewer
// than two windows.
func Drift(p50s []int64) float64 {
	if len(p50s) < 2 {
		return 0
	}
	lo, hi := slices.Min(p50s), slices.Max(p50s)
	if lo <= 0 {
		return 0
	}
	return float64(hi-lo) / float64(lo)
}

// Unreliable says why the cells, measured together for one verdict, cannot
// support it, or "" when they can. A cell without Conditions (a results
// file from before the hygiene check) is unreliable: nothing says how
// quiet the machine was.
func Unreliable(cells ...*Latency) string {
	var why []string
	add := func(s string) {
		if !slices.Contains(why, s) {
			why = append(why, s)
		}
	}
	for _, l := range cells {
		if l == nil {
			continue
		}
		for _, s := range conditionsReasons(l.Conditions) {
			add(s)
		}
		if IsFloor(l.Variant) {
			if d := Drift(l.WindowP50); d > MaxFloorDrift {
				why := fmt.Sprintf("%s moved %.0f%% between rounds", strings.TrimPrefix(l.Variant, "floor: "), d*100)
				if len(l.DirectWindowP50) > 1 {
					why += fmt.Sprintf(" (direct %s)", fmtMoved(l.DirectWindowP50))
				}
				add(why)
			}
		}
	}
	return strings.Join(why, "; ")
}

// UnreliableConditions says why a measurement taken under c cannot support
// a verdict, or "" when it can: other work's CPU above MaxForeignLoadPerCPU
// of the machine, steal above MaxSteal, or either not known. Unreliable
// applies it to every cell; BenchmarkKubeletLoad to its windows.
func UnreliableConditions(c *Conditions) string {
	return strings.Join(conditionsReasons(c), "; ")
}

// conditionsReasons are UnreliableConditions' reasons, one by one.
func conditionsReasons(c *Conditions) []string {
	if c == nil {
		return []string{"load not recorded"}
	}
	var why []string
	switch {
	case c.ForeignCPU < 0:
		why = append(why, "load from other work unknown")
	case c.ForeignCPU > MaxForeignLoadPerCPU*float64(max(c.NProc, 1)):
		why = append(why, fmt.Sprintf("other work used %.1f of %d CPUs", c.ForeignCPU, c.NProc))
	}
	switch {
	case c.Steal == nil:
		why = append(why, "steal not recorded")
	case *c.Steal > MaxSteal:
		why = append(why, fmt.Sprintf("the hypervisor stole %.1f%% of the CPU time", *c.Steal*100))
	}
	return why
}

// judged is a verdict that says so when its cells were measured under load.
func judged(ok bool, cells ...*Latency) string {
	if why := Unreliable(cells...); why != "" {
		return "unreliable (" + why + ")"
	}
	return verdict(ok)
}

// GoFloor is the Variant of the Go byte relay (test/bench/floorrelay), the
// floor the per-call targets compare inplaced with.
const GoFloor = "floor: Go byte relay"

// SocatFloor is the Variant of socat relaying between the two sockets
// with a 1 MiB transfer block: a C byte relay, the cheapest process there
// can be on the path.
const SocatFloor = "floor: socat -b 1 MiB"

// The per-call targets: inplaced against the Go byte relay measured in the
// same rounds.
const (
	// TargetAddedVsGoFloor bounds inplaced's added p50 against the Go
	// floor's added p50, per call and number of callers.
	TargetAddedVsGoFloor = 2.0
	// TargetCPUVsGoFloor bounds inplaced's CPU per relayed call against the
	// Go floor's.
	TargetCPUVsGoFloor = 1.5
)

// cellsAt returns the cells of variant at conc callers.
func cellsAt(ls []*Latency, variant string, conc int) []*Latency {
	var out []*Latency
	for _, l := range ls {
		if l.Variant == variant && l.Concurrency == conc {
			out = append(out, l)
		}
	}
	return out
}

// vsFloor pairs an inplaced cell with the Go floor's cell of the same
// rounds.
type vsFloor struct{ px, floor *Latency }

func (d *doc) goFloorPairs(be string, conc int) []vsFloor {
	var out []vsFloor
	for _, l := range cellsAt(d.latencies[be], "", conc) {
		for _, f := range cellsAt(d.variants[be], GoFloor, conc) {
			if f.Method == l.Method {
				out = append(out, vsFloor{l, f})
			}
		}
	}
	return out
}

func (p vsFloor) addedRatio() float64 {
	fa := p.floor.Proxy.P50 - p.floor.Direct.P50
	return ratio(float64(p.px.Proxy.P50-p.px.Direct.P50), float64(max(fa, 1)))
}

func (p vsFloor) cpuRatio() float64 {
	return ratio(float64(p.px.ProxyCPUPerCall), float64(p.floor.ProxyCPUPerCall))
}

// vsFloorRows are the rows of the per-call targets (against the Go floor)
// of backend be.
func (d *doc) vsFloorRows(be string) []targetRow {
	var rows []targetRow
	for _, conc := range []int{1, 16} {
		pairs := d.goFloorPairs(be, conc)
		if len(pairs) == 0 {
			continue
		}
		var cells []*Latency
		pass, cpuPass, cpuN := 0, 0, 0
		var worst, worstCPU vsFloor
		for _, p := range pairs {
			cells = append(cells, p.px, p.floor)
			if p.addedRatio() <= TargetAddedVsGoFloor {
				pass++
			}
			if worst.px == nil || p.addedRatio() > worst.addedRatio() {
				worst = p
			}
			if p.px.ProxyCPUPerCall > 0 && p.floor.ProxyCPUPerCall > 0 {
				cpuN++
				if p.cpuRatio() <= TargetCPUVsGoFloor {
					cpuPass++
				}
				if worstCPU.px == nil || p.cpuRatio() > worstCPU.cpuRatio() {
					worstCPU = p
				}
			}
		}
		rows = append(rows, targetRow{backend: be, cells: cells,
			target: fmt.Sprintf("p50 added ≤ %.0f× the Go floor's added p50, every call, %s", TargetAddedVsGoFloor, callers(conc)),
			measured: fmt.Sprintf("%d of %d calls within; largest: %s %s (+%s vs +%s)", pass, len(pairs), worst.px.Method,
				fmtRatio(worst.addedRatio()), fmtDur(worst.px.Proxy.P50-worst.px.Direct.P50), fmtDur(worst.floor.Proxy.P50-worst.floor.Direct.P50)),
			ok: pass == len(pairs)})
		if cpuN > 0 {
			rows = append(rows, targetRow{backend: be, cells: cells,
				target: fmt.Sprintf("CPU per relayed call ≤ %.1f× the Go floor's, every call, %s", TargetCPUVsGoFloor, callers(conc)),
				measured: fmt.Sprintf("%d of %d calls within; largest: %s %s (%s vs %s)", cpuPass, cpuN, worstCPU.px.Method,
					fmtRatio(worstCPU.cpuRatio()), fmtDur(worstCPU.px.ProxyCPUPerCall), fmtDur(worstCPU.floor.ProxyCPUPerCall)),
				ok: cpuPass == cpuN})
		}
	}
	return rows
}

// fmtConditions is a cell's conditions in a table cell.
func fmtConditions(c *Conditions) string {
	if c == nil {
		return "not recorded"
	}
	other := "other work ?"
	if c.ForeignCPU >= 0 {
		other = fmt.Sprintf("other work %.2f CPU", c.ForeignCPU)
	}
	steal := "steal ?"
	if c.Steal != nil {
		steal = fmt.Sprintf("steal %.1f%%", *c.Steal*100)
	}
	return fmt.Sprintf("%s; %s; load %.1f→%.1f; run queue %.1f (max %d)", other, steal, c.Load1Start, c.Load1Max, c.RunQueueMean, c.RunQueueMax)
}

// vsFloorTable is section 1's per-call comparison of inplaced with the Go
// floor, with each cell's verdicts.
func (d *doc) vsFloorTable(b *strings.Builder, be string) {
	var pairs []vsFloor
	for _, conc := range []int{1, 16} {
		pairs = append(pairs, d.goFloorPairs(be, conc)...)
	}
	if len(pairs) == 0 {
		return
	}
	fmt.Fprintf(b, "inplaced against the Go byte relay in the same rounds (targets: added p50 ≤ %.0f× the floor's, CPU per call ≤ %.1f× the floor's):\n\n",
		TargetAddedVsGoFloor, TargetCPUVsGoFloor)
	fmt.Fprintf(b, "| Call | Callers | inplaced added p50 | Go floor added p50 | Ratio | inplaced CPU per call | Go floor CPU per call | Ratio | Go floor moved | Direct moved | Verdict |\n")
	fmt.Fprintf(b, "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|\n")
	for _, p := range pairs {
		v := fmt.Sprintf("added %s", judged(p.addedRatio() <= TargetAddedVsGoFloor, p.px, p.floor))
		cpuR := "–"
		if p.px.ProxyCPUPerCall > 0 && p.floor.ProxyCPUPerCall > 0 {
			cpuR = fmtRatio(p.cpuRatio())
			v += fmt.Sprintf("; CPU %s", judged(p.cpuRatio() <= TargetCPUVsGoFloor, p.px, p.floor))
		}
		fmt.Fprintf(b, "| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", p.px.Method, p.px.Concurrency,
			fmtDur(p.px.Proxy.P50-p.px.Direct.P50), fmtDur(p.floor.Proxy.P50-p.floor.Direct.P50), fmtRatio(p.addedRatio()),
			fmtDur(p.px.ProxyCPUPerCall), fmtDur(p.floor.ProxyCPUPerCall), cpuR, fmtMoved(p.floor.WindowP50), fmtMoved(p.floor.DirectWindowP50), v)
	}
	b.WriteString("\n")
}

// conditionsNote says how the cells' conditions are measured and judged.
func conditionsNote(b *strings.Builder) {
	fmt.Fprintf(b, "*Conditions* (every cell): *other work* is the CPU time, in CPUs, that processes outside the benchmark used during the cell "+
		"(machine busy time from `/proc/stat` minus the CPU time of the test binary and the processes it started); *load* is the 1-minute load "+
		"average at the cell's start and its highest during it, *run queue* `/proc/stat` `procs_running` sampled every 100 ms — both "+
		"include the benchmark's own work, about one CPU at 1 caller; *steal* is the share of the machine's CPU time that `/proc/stat` counts as "+
		"steal during the cell (this is a virtual machine: time a vCPU wanted to run while the hypervisor ran another guest, which no process "+
		"inside the machine shows). A verdict is **unreliable** when other work used more than %.0f%% of the "+
		"CPUs (1 on 2 CPUs) during one of its cells, when steal exceeded %.0f%% of the machine's CPU time during one of its cells (a stolen "+
		"wake-up delays one path and not the other), or when a floor's p50 moved by more than %.0f%% between the %d windows of its cell's rounds: "+
		"a byte relay costs the same in every round on a quiet machine. *Direct moved* is how far the direct path's p50 moved across the same "+
		"windows, shown beside the floors' to tell the two causes apart — it is not part of the rule: a direct path that moved as much as the floor "+
		"says the machine changed under the cell (every path saw it); a floor that moved while direct stayed put says its own process was "+
		"scheduled unevenly.\n\n", MaxForeignLoadPerCPU*100, MaxSteal*100, MaxFloorDrift*100, DriftWindows)
}

// BaselinePrefix starts the Variant of another build of inplaced measured in
// the same rounds (hack/bench.sh BASELINE=commit): "baseline: <commit>".
const BaselinePrefix = "baseline: "

// TargetVsBaseline bounds inplaced's p50 and CPU per call against the
// baseline build's in the same rounds: a relay change may not make the
// pass-through more than 10% worse.
const TargetVsBaseline = 1.10

// vsBaselineRows compare inplaced with the baseline build of backend be,
// call by call, at each number of callers.
func (d *doc) vsBaselineRows(be string) []targetRow {
	var rows []targetRow
	for _, v := range variantNames(d.variants[be]) {
		if !strings.HasPrefix(v, BaselinePrefix) {
			continue
		}
		label := strings.TrimPrefix(v, BaselinePrefix)
		for _, conc := range []int{1, 16} {
			var pairs []vsFloor // the same pairing: inplaced's cell and the baseline's
			for _, l := range cellsAt(d.latencies[be], "", conc) {
				for _, o := range cellsAt(d.variants[be], v, conc) {
					if o.Method == l.Method {
						pairs = append(pairs, vsFloor{l, o})
					}
				}
			}
			if len(pairs) == 0 {
				continue
			}
			var cells []*Latency
			pass, cpuPass, cpuN := 0, 0, 0
			var worst, worstCPU vsFloor
			p50 := func(p vsFloor) float64 { return ratio(float64(p.px.Proxy.P50), float64(p.floor.Proxy.P50)) }
			for _, p := range pairs {
				cells = append(cells, p.px, p.floor)
				if p50(p) <= TargetVsBaseline {
					pass++
				}
				if worst.px == nil || p50(p) > p50(worst) {
					worst = p
				}
				if p.px.ProxyCPUPerCall > 0 && p.floor.ProxyCPUPerCall > 0 {
					cpuN++
					if p.cpuRatio() <= TargetVsBaseline {
						cpuPass++
					}
					if worstCPU.px == nil || p.cpuRatio() > worstCPU.cpuRatio() {
						worstCPU = p
					}
				}
			}
			rows = append(rows, targetRow{backend: be, cells: cells,
				target: fmt.Sprintf("p50 ≤ %.2f× inplaced at %s (same rounds), every call, %s", TargetVsBaseline, label, callers(conc)),
				measured: fmt.Sprintf("%d of %d calls within; largest: %s %s (%s vs %s)", pass, len(pairs), worst.px.Method,
					fmtRatio(p50(worst)), fmtDur(worst.px.Proxy.P50), fmtDur(worst.floor.Proxy.P50)),
				ok: pass == len(pairs)})
			if cpuN > 0 {
				rows = append(rows, targetRow{backend: be, cells: cells,
					target: fmt.Sprintf("CPU per relayed call ≤ %.2f× inplaced at %s's, every call, %s", TargetVsBaseline, label, callers(conc)),
					measured: fmt.Sprintf("%d of %d calls within; largest: %s %s (%s vs %s)", cpuPass, cpuN, worstCPU.px.Method,
						fmtRatio(worstCPU.cpuRatio()), fmtDur(worstCPU.px.ProxyCPUPerCall), fmtDur(worstCPU.floor.ProxyCPUPerCall)),
					ok: cpuPass == cpuN})
			}
		}
	}
	return rows
}
