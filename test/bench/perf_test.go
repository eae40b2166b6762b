package bench

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/inplaced/inplaced/test/bench/report"
)

// procCPU returns the CPU time pid's threads have used, to the nanosecond:
// the sum of each thread's run time in /proc/<pid>/task/*/schedstat (the
// scheduler's own account). /proc/<pid>/stat's utime and stime are counted
// in 10 ms ticks, sampled: a cell of 16 callers costs a relay a few tens of
// milliseconds in all, a handful of ticks, too coarse to compare two relays
// by. A thread that exited takes its time with it; the Go runtime keeps
// its threads, and the tick count is the fallback.
func procCPU(pid int) (time.Duration, error) {
	tasks, err := os.ReadDir(filepath.Join("/proc", strconv.Itoa(pid), "task"))
	if err != nil {
		return 0, err
	}
	var sum time.Duration
	for _, t := range tasks {
		data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "task", t.Name(), "schedstat"))
		if err != nil {
			continue // the thread exited meanwhile
		}
		f := strings.Fields(string(data))
		if len(f) == 0 {
			continue
		}
		ns, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/task/%s/schedstat: %q", pid, t.Name(), data)
		}
		sum += time.Duration(ns)
	}
	if sum == 0 { // no schedstat (CONFIG_SCHED_INFO off): the ticks
		return procTicks(pid)
	}
	return sum, nil
}

// procStat is /proc/<pid>/stat's fields from field 3 (state) on: the
// command name before them may hold spaces and parentheses, so they are
// counted after its last ')'. Field n of proc(5) is f[n-3].
func procStat(pid int) ([]string, error) {
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return nil, err
	}
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return nil, fmt.Errorf("/proc/%d/stat: no ')'", pid)
	}
	return strings.Fields(string(data[i+1:])), nil
}

// statTicks sums fields (proc(5) numbering) of pid's stat, CPU times in
// USER_HZ ticks, which Linux fixes at 100 per second.
func statTicks(pid int, fields ...int) (time.Duration, error) {
	f, err := procStat(pid)
	if err != nil {
		return 0, err
	}
	var ticks int64
	for _, n := range fields {
		if n-3 >= len(f) {
			return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f)+2)
		}
		v, err := strconv.ParseInt(f[n-3], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/stat: field %d %q", pid, n, f[n-3])
		}
		ticks += v
	}
	return time.Duration(ticks) * 10 * time.Millisecond, nil
}

// procTicks returns the CPU time (user + system: fields 14 and 15) pid has
// used from /proc/<pid>/stat.
func procTicks(pid int) (time.Duration, error) { return statTicks(pid, 14, 15) }

// perfRecorder samples one process with `perf record` while it runs.
type perfRecorder struct {
	cmd  *exec.Cmd
	path string
	done chan error
}

// startPerf samples pid with perf's cpu-clock event until stop. It returns
// nil (and logs why) when perf is not installed or $INPLACED_BENCH_PERF=0.
func startPerf(b *testing.B, pid int) *perfRecorder {
	b.Helper()
	if os.Getenv("INPLACED_BENCH_PERF") == "0" {
		return nil
	}
	bin, err := exec.LookPath("perf")
	if err != nil {
		b.Logf("perf not installed: no profile of inplaced (apt-get install linux-perf)")
		return nil
	}
	p := &perfRecorder{path: filepath.Join(b.TempDir(), "perf.data"), done: make(chan error, 1)}
	p.cmd = exec.Command(bin, "record", "-q", "-e", "cpu-clock", "-F", "1999", "-p", strconv.Itoa(pid), "-o", p.path)
	var stderr bytes.Buffer
	p.cmd.Stderr = &stderr
	if err := p.cmd.Start(); err != nil {
		b.Logf("perf record: %v", err)
		return nil
	}
	go func() {
		err := p.cmd.Wait()
		if err != nil {
			err = fmt.Errorf("%w: %s", err, strings.TrimSpace(stderr.String()))
		}
		p.done <- err
	}()
	time.Sleep(200 * time.Millisecond) // perf attaches
	return p
}

var (
	perfLine    = regexp.MustCompile(`^\s*([\d.]+)%\s+(\S+)\s+\[[.kgu]\]\s+(.+?)\s*$`)
	perfSamples = regexp.MustCompile(`^# Samples: (\d+)([KM]?)`)
)

// stop ends the recording (SIGINT, as perf expects) and summarises it.
func (p *perfRecorder) stop(b *testing.B, backend string) *report.Profile {
	b.Helper()
	if p == nil {
		return nil
	}
	_ = p.cmd.Process.Signal(syscall.SIGINT)
	select {
	case err := <-p.done:
		if err != nil && !strings.Contains(err.Error(), "interrupt") {
			b.Logf("perf record: %v", err)
		}
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		b.Logf("perf record did not stop")
		return nil
	}
	out, err := exec.Command("perf", "report", "-i", p.path, "--stdio", "--no-children", "--sort", "dso,sym",
		"-g", "none", "--percent-limit", "0").Output()
	if err != nil {
		b.Logf("perf report: %v", err)
		return nil
	}
	prof := &report.Profile{Backend: backend}
	groups := map[string]float64{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if m := perfSamples.FindStringSubmatch(line); m != nil {
			n, _ := strconv.ParseInt(m[1], 10, 64)
			switch m[2] {
			case "K":
				n *= 1e3
			case "M":
				n *= 1e6
			}
			prof.Samples = n
			continue
		}
		m := perfLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		pct, _ := strconv.ParseFloat(m[1], 64)
		groups[report.ProfileGroup(m[2], m[3])] += pct
		if len(prof.Top) < 25 {
			prof.Top = append(prof.Top, report.ProfileEntry{Name: m[3], Percent: pct})
		}
	}
	for g, pct := range groups {
		prof.Groups = append(prof.Groups, report.ProfileEntry{Name: g, Percent: pct})
	}
	slices.SortFunc(prof.Groups, func(a, b report.ProfileEntry) int {
		switch {
		case a.Percent > b.Percent:
			return -1
		case a.Percent < b.Percent:
			return 1
		}
		return strings.Compare(a.Name, b.Name)
	})
	return prof
}

// perfCounter counts inplaced's system calls and context switches with
// `perf stat -p` while it runs.
type perfCounter struct {
	cmd    *exec.Cmd
	stderr bytes.Buffer
	done   chan error
}

// startPerfStat returns nil when perf is missing or disabled.
func startPerfStat(b *testing.B, pid int) *perfCounter {
	b.Helper()
	if os.Getenv("INPLACED_BENCH_PERF") == "0" {
		return nil
	}
	bin, err := exec.LookPath("perf")
	if err != nil {
		return nil
	}
	c := &perfCounter{done: make(chan error, 1)}
	c.cmd = exec.Command(bin, "stat", "-x", ",", "-e", "raw_syscalls:sys_enter,context-switches", "-p", strconv.Itoa(pid))
	c.cmd.Stderr = &c.stderr
	if err := c.cmd.Start(); err != nil {
		b.Logf("perf stat: %v", err)
		return nil
	}
	go func() { c.done <- c.cmd.Wait() }()
	time.Sleep(100 * time.Millisecond) // perf attaches
	return c
}

// stop returns the system calls and context switches counted.
func (c *perfCounter) stop(b *testing.B) (syscalls, switches int64, ok bool) {
	b.Helper()
	if c == nil {
		return 0, 0, false
	}
	_ = c.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-c.done:
	case <-time.After(10 * time.Second):
		_ = c.cmd.Process.Kill()
		return 0, 0, false
	}
	// -x , lines: value,unit,event,...
	var gotSys, gotSw bool
	for _, line := range strings.Split(c.stderr.String(), "\n") {
		f := strings.Split(line, ",")
		if len(f) < 3 {
			continue
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			continue
		}
		switch f[2] {
		case "raw_syscalls:sys_enter":
			syscalls, gotSys = n, true
		case "context-switches":
			switches, gotSw = n, true
		}
	}
	if !gotSys || !gotSw {
		b.Logf("perf stat output not understood: %s", c.stderr.String())
	}
	return syscalls, switches, gotSys && gotSw
}

// TestProcCPU: procCPU counts this process's CPU to well under a tick, and
// counts all of its threads.
func TestProcCPU(t *testing.T) {
	pid := os.Getpid()
	before, err := procCPU(pid)
	if err != nil {
		t.Fatal(err)
	}
	const burn = 30 * time.Millisecond
	var wg sync.WaitGroup
	for range 2 { // on two goroutines: two threads when the machine has two CPUs
		wg.Go(func() {
			for deadline := time.Now().Add(burn); time.Now().Before(deadline); {
			}
		})
	}
	wg.Wait()
	after, err := procCPU(pid)
	if err != nil {
		t.Fatal(err)
	}
	// At least one burn (the goroutines may have shared a CPU), not more
	// than both and the runtime's own work.
	if got := after - before; got < burn*9/10 || got > 2*burn+50*time.Millisecond {
		t.Fatalf("procCPU counted %v for a %v burn on 2 goroutines", got, burn)
	}
}
