package takeover

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
)

// TestRuncBindCost measures what the trap costs a bind, as the app sees
// it (the bind syscall's duration in the probe), INPLACED_TAKEOVER_BINDS
// times each (1000 by default): no filter (IP and unix), passed before any swap is
// registered, passed for a port the old container does not hold (the
// agent looks at the old container's sockets), passed for a unix socket,
// and handed over.
func TestRuncBindCost(t *testing.T) {
	n := 1000
	if v, err := strconv.Atoi(os.Getenv("INPLACED_TAKEOVER_BINDS")); err == nil && v > 0 {
		n = v
	}
	r := newRig(t)
	a, evs := r.startAgentLogging(zap.NewNop())
	old := r.run("old", []string{"/app-v1", "-listen", ":8080"}, defaultCaps, nil)
	r.waitServing(8080, "v1", 10*time.Second)
	nc := r.run("new", []string{"/probe"}, defaultCaps, r.profile("swap-1", defaultCaps))
	timeout := time.Duration(n) * 20 * time.Millisecond

	var rows []costRow
	for _, c := range []struct{ name, cmd string }{
		{"no filter (a process of the old container)", fmt.Sprintf(`{"op":"bind","port":9190,"n":%d}`, n)},
		{"no filter: a unix socket", fmt.Sprintf(`{"op":"bind-unix","path":"/tmp/cost.sock","n":%d}`, n)},
	} {
		out, err := old.exec("/probe", "-run", c.cmd)
		if err != nil {
			t.Fatalf("runc exec: %v: %s", err, out)
		}
		rows = append(rows, costRow{c.name, lastResult(t, out)})
	}
	rows = append(rows, costRow{"passed: no swap registered", nc.probe(command{Op: "bind", Port: 9191, N: n}, timeout)})
	if err := a.Register(Old{Swap: "swap-1", Pid: old.pid}); err != nil {
		t.Fatal(err)
	}
	rows = append(rows,
		costRow{"passed: a port the old container does not hold", nc.probe(command{Op: "bind", Port: 9192, N: n}, timeout)},
		costRow{"passed: a unix socket", nc.probe(command{Op: "bind-unix", Path: "/tmp/cost.sock", N: n}, timeout)},
		costRow{"handed over", nc.probe(command{Op: "bind", Port: 8080, N: n}, timeout)},
	)
	var b strings.Builder
	fmt.Fprintf(&b, "bind() as the app sees it, %d each (µs):\n%-50s %8s %8s %8s %8s %8s\n", n, "", "p50", "p90", "p99", "max", "mean")
	for _, row := range rows {
		if row.res.OK != n {
			t.Errorf("%s: %d of %d binds succeeded: %s", row.name, row.res.OK, n, row.res.Error)
		}
		b.WriteString(row.String() + "\n")
	}
	var agent []int64
	for _, e := range evs.snapshot() {
		if e.Kind == HandedOver {
			agent = append(agent, e.Took.Nanoseconds())
		}
	}
	if len(agent) != n {
		t.Errorf("%d handovers, want %d", len(agent), n)
	}
	b.WriteString(costRow{"handed over, in the agent (notification to answer)", result{Ns: agent}}.String())
	t.Log(b.String())
}

type costRow struct {
	name string
	res  result
}

func (c costRow) String() string {
	ns := slices.Clone(c.res.Ns)
	if len(ns) == 0 {
		return fmt.Sprintf("%-50s no binds", c.name)
	}
	slices.Sort(ns)
	var sum int64
	for _, v := range ns {
		sum += v
	}
	q := func(p float64) float64 { return float64(ns[int(p*float64(len(ns)-1))]) / 1e3 }
	return fmt.Sprintf("%-50s %8.1f %8.1f %8.1f %8.1f %8.1f", c.name, q(0.5), q(0.9), q(0.99), q(1), float64(sum)/float64(len(ns))/1e3)
}
