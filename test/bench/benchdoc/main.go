// Command benchdoc writes docs/benchmarks.md from one `make bench` run: the
// JSON records the benchmarks in test/bench wrote, the `go test -bench`
// output, the load averages sampled during the run, and this machine's facts.
//
//	benchdoc -results R.jsonl -bench-output bench.txt -load load.txt \
//	  -started RFC3339 -finished RFC3339 -commit SHA -out docs/benchmarks.md
package main

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/inplaced/inplaced/test/bench/report"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "benchdoc:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		results  = flag.String("results", "", "JSON-lines results written by the benchmarks ($INPLACED_BENCH_RESULTS)")
		benchOut = flag.String("bench-output", "", "`go test -bench` output")
		loadFile = flag.String("load", "", "/proc/loadavg lines sampled during the run")
		started  = flag.String("started", "", "start of the run (RFC 3339)")
		finished = flag.String("finished", "", "end of the run (RFC 3339)")
		commit   = flag.String("commit", "", "git commit the run measured")
		command  = flag.String("command", "", "the go test command line")
		quiet    = flag.String("quiet", "", "how the wait for a quiet machine before the run ended")
		resize   = flag.String("resize-file", "test/bench/resize_bench_test.go", "the resize benchmark's file (its presence is reported)")
		out      = flag.String("out", "docs/benchmarks.md", "markdown file to write")
		loadOut  = flag.String("kubelet-load-out", "", "with BenchmarkKubeletLoad's records in the results, also write its document here "+
			"(the benchmark writes it itself during a run: this renders it again, e.g. after a change to its wording)")
	)
	flag.Parse()
	in := report.Input{Machine: machine()}
	in.Machine.Commit, in.Machine.Command, in.Machine.QuietWait = *commit, *command, *quiet
	var err error
	if in.Machine.Started, err = parseTime(*started); err != nil {
		return err
	}
	if in.Machine.Finished, err = parseTime(*finished); err != nil {
		return err
	}
	if *results != "" {
		if in.Records, err = report.Load(*results); err != nil {
			return err
		}
	}
	if *benchOut != "" {
		f, err := os.Open(*benchOut)
		if err != nil {
			return err
		}
		in.GoBench, err = report.ParseGoBench(f)
		f.Close()
		if err != nil {
			return err
		}
	}
	if *loadFile != "" {
		if in.Machine.Load, err = loads(*loadFile); err != nil {
			return err
		}
	}
	if _, err := os.Stat(*resize); err == nil {
		in.ResizeFile = true
	}
	var buf bytes.Buffer
	if err := report.Render(&buf, in); err != nil {
		return err
	}
	if err := os.WriteFile(*out, buf.Bytes(), 0o644); err != nil {
		return err
	}
	if *loadOut != "" {
		return kubeletLoadDoc(in, *loadOut)
	}
	return nil
}

// kubeletLoadDoc writes BenchmarkKubeletLoad's document from the run's
// records, if it has any: the run's facts are hack/bench.sh's (its start,
// end, command and load samples) and this machine's.
func kubeletLoadDoc(in report.Input, path string) error {
	m := in.Machine
	r := report.KubeletLoadRun{CPUModel: m.CPUModel, Kernel: m.Kernel, GoVersion: m.GoVersion, NProc: m.NProc,
		Commit: m.Commit, Command: m.Command, Started: m.Started, Finished: m.Finished, Load: m.Load,
		Rendered: "again from the run's results file by `BENCH_DOC_ONLY=1 hack/bench.sh` (test/bench/benchdoc); " +
			"the run's start, end, command and load samples (every 5 s) are hack/bench.sh's"}
	r.Host, _ = os.Hostname()
	backends := map[string]*report.Backend{}
	for _, rec := range in.Records {
		if rec.Backend != nil {
			backends[rec.Backend.Backend] = rec.Backend
		}
		if k := rec.KubeletLoad; k != nil {
			r.Loads = append(r.Loads, k)
			if be := backends[k.Backend]; be != nil {
				r.Backends = append(r.Backends, fmt.Sprintf("`%s`: %s %s", be.Backend, be.RuntimeName, be.RuntimeVersion))
			}
			r.KubeletVersion, _, _ = strings.Cut(k.Kubelet, ",")
		}
	}
	if len(r.Loads) == 0 {
		return nil
	}
	var buf bytes.Buffer
	if err := report.RenderKubeletLoad(&buf, r, "INPLACED_BENCH_LOAD_DOC"); err != nil {
		return err
	}
	return os.WriteFile(path, buf.Bytes(), 0o644)
}

func parseTime(s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	return time.Parse(time.RFC3339, s)
}

// machine reads the CPU model, memory, kernel and OS of this machine.
func machine() report.Machine {
	m := report.Machine{NProc: runtime.NumCPU(), GoVersion: runtime.Version()}
	m.CPUModel = procField("/proc/cpuinfo", "model name")
	if kb, err := strconv.ParseInt(strings.Fields(procField("/proc/meminfo", "MemTotal") + " 0")[0], 10, 64); err == nil && kb > 0 {
		m.MemTotal = fmt.Sprintf("%.1f GiB", float64(kb)/(1<<20))
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/etc/os-release"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "PRETTY_NAME="); ok {
				m.OS = strings.Trim(v, `"`)
			}
		}
	}
	return m
}

// procField returns the value of the first "key : value" line of a /proc file.
func procField(path, key string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// loads returns the 1-minute load averages of /proc/loadavg lines.
func loads(path string) ([]float64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []float64
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if v, err := strconv.ParseFloat(f[0], 64); err == nil {
			out = append(out, v)
		}
	}
	return out, nil
}
