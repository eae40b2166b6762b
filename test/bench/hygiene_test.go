package bench

import (
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/inplaced/inplaced/test/bench/report"
)

// loadSampler records how busy the machine is while one cell is measured
// (report.Conditions): the load average and run queue every 100 ms, and
// the CPU time used outside the benchmark's own processes over the cell.
type loadSampler struct {
	stop     chan struct{}
	done     sync.WaitGroup
	mu       sync.Mutex
	cond     report.Conditions
	rqSum    float64
	rqN      int
	t0       time.Time
	cpu0     machineTicks
	own0     map[int]time.Duration
	ownStart bool
}

func startLoadSampler() *loadSampler {
	s := &loadSampler{stop: make(chan struct{}), t0: time.Now()}
	s.cond.NProc = runtime.NumCPU()
	s.cond.Load1Start, _ = load1()
	s.cond.Load1Max = s.cond.Load1Start
	var err error
	s.cpu0, err = machineCPU()
	s.own0 = ownCPU()
	s.ownStart = err == nil
	s.done.Add(1)
	go func() {
		defer s.done.Done()
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-s.stop:
				return
			case <-t.C:
			}
			l, _ := load1()
			rq, _ := runQueue()
			s.mu.Lock()
			s.cond.Load1Max = max(s.cond.Load1Max, l)
			s.cond.RunQueueMax = max(s.cond.RunQueueMax, rq)
			s.rqSum += float64(rq)
			s.rqN++
			s.mu.Unlock()
		}
	}()
	return s
}

// finish stops sampling and returns the cell's conditions.
func (s *loadSampler) finish() *report.Conditions {
	close(s.stop)
	s.done.Wait()
	c := s.cond
	if s.rqN > 0 {
		c.RunQueueMean = s.rqSum / float64(s.rqN)
	}
	c.ForeignCPU = -1
	cpu1, err := machineCPU()
	if s.ownStart && err == nil {
		elapsed := time.Since(s.t0)
		var own time.Duration
		for pid, t1 := range ownCPU() {
			own += t1 - s.own0[pid] // a process started during the cell counts from 0
		}
		machine := time.Duration(cpu1.busy-s.cpu0.busy) * 10 * time.Millisecond
		c.ForeignCPU = max(float64(machine-own)/float64(elapsed), 0)
		c.Steal = cpu1.stealSince(s.cpu0)
	}
	return &c
}

func load1() (float64, error) {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0, err
	}
	return strconv.ParseFloat(strings.Fields(string(b))[0], 64)
}

// statLines reads /proc/stat.
func statLines() ([]string, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return nil, err
	}
	return strings.Split(string(b), "\n"), nil
}

// runQueue is procs_running: runnable tasks on the machine, this sampler
// included.
func runQueue() (int, error) {
	lines, err := statLines()
	if err != nil {
		return 0, err
	}
	for _, l := range lines {
		if v, ok := strings.CutPrefix(l, "procs_running "); ok {
			return strconv.Atoi(strings.TrimSpace(v))
		}
	}
	return 0, os.ErrNotExist
}

// machineTicks is the machine's CPU time from /proc/stat's "cpu" line, in
// clock ticks (USER_HZ, 100 on Linux).
type machineTicks struct {
	// busy is the non-idle time: all but idle, iowait and steal. Guest
	// time is already in user, and steal is not the machine's own work.
	busy int64
	// steal is the time a vCPU wanted to run while the hypervisor ran
	// something else (the 8th value).
	steal int64
	// total is all of it: user nice system idle iowait irq softirq steal.
	total int64
}

// stealSince is the share of the machine's CPU time since t0 that was
// steal; nil when no time passed.
func (t machineTicks) stealSince(t0 machineTicks) *float64 {
	if t.total <= t0.total {
		return nil
	}
	return new(float64(t.steal-t0.steal) / float64(t.total-t0.total))
}

func machineCPU() (machineTicks, error) {
	lines, err := statLines()
	if err != nil {
		return machineTicks{}, err
	}
	return parseCPULine(lines[0])
}

// parseCPULine reads /proc/stat's "cpu" line. Kernels before 2.6.11 have
// no steal column: it then counts as none.
func parseCPULine(line string) (machineTicks, error) {
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return machineTicks{}, os.ErrInvalid
	}
	var t machineTicks
	for i, v := range f[1:min(len(f), 9)] { // user nice system idle iowait irq softirq steal
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return machineTicks{}, err
		}
		t.total += n
		switch i {
		case 3, 4: // idle, iowait
		case 7:
			t.steal = n
		default:
			t.busy += n
		}
	}
	return t, nil
}

// ownCPU is the CPU time of this test binary and of every process below it
// (containerd, the proxies, the floors), by pid.
func ownCPU() map[int]time.Duration {
	self := os.Getpid()
	parent := map[int]int{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		f, err := procStat(pid)
		if err == nil && len(f) > 1 {
			parent[pid], _ = strconv.Atoi(f[1])
		}
	}
	mine := func(pid int) bool {
		for n := 0; pid > 1 && n < 64; n++ {
			if pid == self {
				return true
			}
			pid = parent[pid]
		}
		return false
	}
	out := map[int]time.Duration{}
	for pid := range parent {
		if mine(pid) {
			if t, err := procCPU(pid); err == nil {
				out[pid] = t
			}
		}
	}
	return out
}

// windowP50s splits per-round samples into report.DriftWindows consecutive
// windows of rounds and returns each window's p50.
func windowP50s(rounds [][]time.Duration) []int64 {
	n := report.DriftWindows
	if len(rounds) < n {
		return nil
	}
	var out []int64
	for w := range n {
		var s []time.Duration
		for _, r := range rounds[w*len(rounds)/n : (w+1)*len(rounds)/n] {
			s = append(s, r...)
		}
		out = append(out, report.Summarize(s).P50)
	}
	return out
}

// TestLoadSampler: the sampler reads this machine's counters and counts
// the test's own CPU as its own, not as other work.
func TestLoadSampler(t *testing.T) {
	s := startLoadSampler()
	deadline := time.Now().Add(400 * time.Millisecond)
	for time.Now().Before(deadline) { // keep one CPU busy: the benchmark's own work
	}
	c := s.finish()
	if c.NProc < 1 || c.ForeignCPU < 0 || c.RunQueueMax < 1 || c.Steal == nil {
		t.Fatalf("conditions %+v", c)
	}
	// user nice system idle iowait irq softirq steal guest guest_nice
	if m, err := parseCPULine("cpu  100 1 20 500 7 0 3 40 9 0"); err != nil || m.busy != 124 || m.steal != 40 || m.total != 671 {
		t.Fatalf("parseCPULine = %+v, %v", m, err)
	}
	t.Logf("conditions %+v, steal %.2f%%", c, *c.Steal*100)
	if got := windowP50s([][]time.Duration{{1}, {2}, {3}, {4}, {5}, {6}, {7}, {8}}); len(got) != report.DriftWindows || got[0] != 1 || got[3] != 7 {
		t.Fatalf("windowP50s = %v", got)
	}
}
