package report

import (
	"bufio"
	"io"
	"regexp"
	"strconv"
	"strings"
)

// GoBench is one result line of `go test -bench` output.
type GoBench struct {
	Name    string             // without the -GOMAXPROCS suffix, e.g. "BenchmarkResize/containerd-2.4/cri"
	Procs   int                // GOMAXPROCS suffix, 0 if absent
	N       int64              // iterations
	Metrics map[string]float64 // unit → value, e.g. "ns/op" → 1234
}

var benchLine = regexp.MustCompile(`^(Benchmark\S+?)(?:-(\d+))?\s+(\d+)\s+(.+)$`)

// ParseGoBench reads the result lines of `go test -bench` output; other lines
// (logs, PASS, ok) are skipped.
func ParseGoBench(r io.Reader) ([]GoBench, error) {
	var out []GoBench
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		m := benchLine.FindStringSubmatch(strings.TrimSpace(sc.Text()))
		if m == nil {
			continue
		}
		n, err := strconv.ParseInt(m[3], 10, 64)
		if err != nil {
			continue
		}
		f := strings.Fields(m[4])
		if len(f) < 2 || len(f)%2 != 0 {
			continue
		}
		gb := GoBench{Name: m[1], N: n, Metrics: map[string]float64{}}
		if m[2] != "" {
			gb.Procs, _ = strconv.Atoi(m[2])
		}
		ok := true
		for i := 0; i < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				ok = false
				break
			}
			gb.Metrics[f[i+1]] = v
		}
		if ok {
			out = append(out, gb)
		}
	}
	return out, sc.Err()
}
