package bench

import (
	"bytes"
	"os"
	"path/filepath"
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
	busy0    int64 // machine busy jiffies
	own0     map[int]time.Duration
	ownStart bool
}

func startLoadSampler() *loadSampler {
	s := &loadSampler{stop: make(chan struct{}), t0: time.Now()}
	s.cond.NProc = runtime.NumCPU()
	s.cond.Load1Start, _ = load1()
	s.cond.Load1Max = s.cond.Load1Start
	var err error
	s.busy0, err = machineBusy()
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
	busy1, err := machineBusy()
	if s.ownStart && err == nil {
		elapsed := time.Since(s.t0)
		var own time.Duration
		for pid, t1 := range ownCPU() {
			own += t1 - s.own0[pid] // a process started during the cell counts from 0
		}
		machine := time.Duration(busy1-s.busy0) * 10 * time.Millisecond
		c.ForeignCPU = max(float64(machine-own)/float64(elapsed), 0)
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

// machineBusy is the machine's non-idle CPU time in clock ticks (USER_HZ,
// 100 on Linux): /proc/stat "cpu" minus idle and iowait. Guest time is
// already in user and steal is not the machine's own work, so both are
// left out.
func machineBusy() (int64, error) {
	lines, err := statLines()
	if err != nil {
		return 0, err
	}
	f := strings.Fields(lines[0])
	if len(f) < 8 || f[0] != "cpu" {
		return 0, os.ErrInvalid
	}
	var busy int64
	for i, v := range f[1:8] { // user nice system idle iowait irq softirq
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, err
		}
		if i != 3 && i != 4 {
			busy += n
		}
	}
	return busy, nil
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
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) > 1 {
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
	if c.NProc < 1 || c.ForeignCPU < 0 || c.RunQueueMax < 1 {
		t.Fatalf("conditions %+v", c)
	}
	t.Logf("conditions %+v", c)
	if got := windowP50s([][]time.Duration{{1}, {2}, {3}, {4}, {5}, {6}, {7}, {8}}); len(got) != report.DriftWindows || got[0] != 1 || got[3] != 7 {
		t.Fatalf("windowP50s = %v", got)
	}
}
