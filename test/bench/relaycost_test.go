package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/test/bench/report"
)

// relayCostMinRounds: a 16-caller round is a few milliseconds; the floor's
// drift between windows needs many of them (see criMinRounds).
const relayCostMinRounds = 48

// Relay processes BenchmarkRelayCost measures beside the Go floor.
const (
	relayCostRouter = "relay: HTTP/2 router (as served)"
	relayCostGRPC   = "relay: grpc-go server + client"
)

// BenchmarkRelayCost measures what relaying one call costs a process of
// its own, against an in-memory CRI backend (no containerd, no root): the
// Go byte relay (the floor), pkg/relay as inplaced serves it (the HTTP/2
// router) and pkg/relay served through grpc-go's server (every call through
// grpc-go's server and client, as before the router; today its intercepted
// path). Batches alternate; each process's CPU time per call
// (/proc/<pid>/stat) is the robust figure on a loaded machine, latency is
// reported with the cell's conditions. INPLACED_RELAY_COST_VALGRIND=1 also
// runs each relay under `valgrind --tool=callgrind` for instructions per
// call.
func BenchmarkRelayCost(b *testing.B) {
	dir := b.TempDir()
	fake := &relayBackend{list: relayContainers(100)}
	backendSrv := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(backendSrv, fake)
	backendSock := filepath.Join(dir, "backend.sock")
	relayServe(b, backendSock, backendSrv)
	bins := relayCostBuild(b, dir)
	type path struct {
		variant string
		pid     int
		client  runtimeapi.RuntimeServiceClient
		cgOut   string // callgrind's output file, under valgrind
	}
	paths := []path{{variant: "direct", client: relayDial(b, backendSock)}}
	minSamples := 3000
	if relayCostValgrind() {
		minSamples = 500
	}
	for _, p := range []struct {
		variant, bin string
		args         []string
	}{
		{report.GoFloor, bins["floorrelay"], nil},
		{relayCostRouter, bins["relayproc"], []string{"-mode", "router"}},
		{relayCostGRPC, bins["relayproc"], []string{"-mode", "grpc"}},
	} {
		sock := filepath.Join(dir, fmt.Sprintf("p%d.sock", len(paths)))
		pid := relayCostStart(b, sock, backendSock, p.bin, p.args...)
		paths = append(paths, path{p.variant, pid, relayDial(b, sock), sock + ".callgrind"})
	}
	for _, m := range []struct {
		name string
		do   func(context.Context, runtimeapi.RuntimeServiceClient) error
	}{
		{"Version", func(ctx context.Context, c runtimeapi.RuntimeServiceClient) error {
			_, err := c.Version(ctx, &runtimeapi.VersionRequest{})
			return err
		}},
		{"ListContainers", func(ctx context.Context, c runtimeapi.RuntimeServiceClient) error {
			_, err := c.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
			return err
		}},
	} {
		for _, callers := range []int{1, 16} {
			b.Run(fmt.Sprintf("%s/callers=%d", m.name, callers), func(b *testing.B) {
				ctx := context.Background()
				// As BenchmarkCRI: 32 calls per batch at 1 caller, 8 per
				// caller at 16, and at least relayCostMinRounds rounds.
				batch := max(32/callers, 8)
				samples := make([][]time.Duration, len(paths))
				rounds := make([][][]time.Duration, len(paths))
				cpu := make([]time.Duration, len(paths))
				run := func(i int, record bool) {
					var c0 time.Duration
					if paths[i].pid > 0 {
						c0, _ = procCPU(paths[i].pid)
					}
					// callers goroutines share the path's one connection (as
					// kubelet's calls do), batch calls each.
					s := make([]time.Duration, callers*batch)
					var wg sync.WaitGroup
					var failed atomic.Value
					for c := range callers {
						wg.Go(func() {
							for k := range batch {
								t0 := time.Now()
								if err := m.do(ctx, paths[i].client); err != nil {
									failed.Store(err)
									return
								}
								s[c*batch+k] = time.Since(t0)
							}
						})
					}
					wg.Wait()
					if err, _ := failed.Load().(error); err != nil {
						b.Fatalf("%s: %v", paths[i].variant, err)
					}
					if !record {
						return
					}
					if paths[i].pid > 0 {
						c1, _ := procCPU(paths[i].pid)
						cpu[i] += c1 - c0
					}
					samples[i] = append(samples[i], s...)
					rounds[i] = append(rounds[i], s)
				}
				for i := range paths {
					run(i, false)
				}
				if relayCostValgrind() {
					for _, p := range paths[1:] {
						callgrindControl(b, "-z", p.pid)
					}
				}
				counters := make([]*perfCounter, len(paths))
				if !relayCostValgrind() {
					for i, p := range paths[1:] {
						counters[i+1] = startPerfStat(b, p.pid)
					}
				}
				load := startLoadSampler()
				round := 0
				one := func() {
					for k := range paths {
						run((round+k)%len(paths), true)
					}
					round++
				}
				for b.Loop() {
					one()
				}
				for round < relayCostMinRounds || len(samples[0]) < minSamples {
					one()
				}
				cond := load.finish()
				syscalls := make([]float64, len(paths))
				switches := make([]float64, len(paths))
				for i, c := range counters {
					if sc, sw, ok := c.stop(b); ok {
						syscalls[i], switches[i] = float64(sc)/float64(len(samples[i])), float64(sw)/float64(len(samples[i]))
					}
				}
				instr := make([]int64, len(paths))
				if relayCostValgrind() {
					for i, p := range paths[1:] {
						instr[i+1] = callgrindDump(b, p.pid, p.cgOut)
					}
				}
				direct := report.Summarize(samples[0])
				for i, p := range paths[1:] {
					i++
					l := &report.Latency{Backend: report.InProcessBackend, Method: m.name, Concurrency: callers, Rounds: round, Variant: p.variant,
						Phase: "relay cost", Direct: direct, Proxy: report.Summarize(samples[i]), Conditions: cond, WindowP50: windowP50s(rounds[i]),
						ProxyCPUPerCall: int64(cpu[i]) / int64(len(samples[i])), ProxyInstrPerCall: instr[i] / int64(len(samples[i]))}
					if relayCostValgrind() {
						l.ProxyCPUPerCall = 0 // valgrind's own
					}
					mustAppend(b, report.Record{Latency: l})
					b.Logf("%-34s %-14s p50 %6.1f µs (direct %6.1f), added %6.1f µs, CPU/call %6.1f µs, syscalls/call %.1f, switches/call %.1f, instructions/call %d", p.variant, m.name,
						float64(l.Proxy.P50)/1e3, float64(direct.P50)/1e3, float64(l.Proxy.P50-direct.P50)/1e3, float64(l.ProxyCPUPerCall)/1e3, syscalls[i], switches[i], l.ProxyInstrPerCall)
				}
				b.Logf("conditions: %+v", *cond)
			})
		}
	}
}

func relayCostBuild(b testing.TB, dir string) map[string]string {
	b.Helper()
	out := map[string]string{}
	for _, name := range []string{"floorrelay", "relayproc"} {
		bin := filepath.Join(dir, name)
		if o, err := exec.Command("go", "build", "-o", bin, "./"+name).CombinedOutput(); err != nil {
			b.Fatalf("go build ./test/bench/%s: %v\n%s", name, err, o)
		}
		out[name] = bin
	}
	return out
}

// relayCostStart runs bin LISTEN BACKEND (flags first) and waits for its
// socket.
func relayCostStart(b testing.TB, sock, backend, bin string, flags ...string) int {
	b.Helper()
	// A CPU profile's SIGPROF ticks crash valgrind: callgrind's output is the profile there.
	if dir := os.Getenv("INPLACED_RELAY_COST_KEEP"); dir != "" && strings.HasSuffix(bin, "relayproc") && !relayCostValgrind() {
		flags = append(flags, "-cpuprofile", filepath.Join(dir, filepath.Base(sock)+".pprof"))
	}
	argv := append(append([]string{bin}, flags...), sock, backend)
	if relayCostValgrind() {
		argv = append([]string{"valgrind", "--tool=callgrind", "--callgrind-out-file=" + sock + ".callgrind"}, argv...)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	if relayCostValgrind() {
		// Callgrind trips over the Go runtime's preemption signals. Only
		// there: the relay as inplaced runs it preempts asynchronously.
		cmd.Env = append(os.Environ(), "GODEBUG=asyncpreemptoff=1")
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		_ = cmd.Wait()
	})
	deadline := time.Now().Add(60 * time.Second)
	for {
		if _, err := os.Stat(sock); err == nil {
			return cmd.Process.Pid
		}
		if time.Now().After(deadline) {
			b.Fatalf("%s did not appear", sock)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func relayCostValgrind() bool { return os.Getenv("INPLACED_RELAY_COST_VALGRIND") != "" }

func callgrindControl(b *testing.B, op string, pid int) {
	b.Helper()
	if out, err := exec.Command("callgrind_control", op, strconv.Itoa(pid)).CombinedOutput(); err != nil {
		b.Fatalf("callgrind_control %s %d: %v\n%s", op, pid, err, out)
	}
}

// callgrindDump dumps pid's counters (since the last zeroing) and returns
// the instructions they hold.
func callgrindDump(b *testing.B, pid int, out string) int64 {
	b.Helper()
	callgrindControl(b, "-d", pid)
	files, _ := filepath.Glob(out + ".*")
	var newest string
	var newestN int
	for _, f := range files {
		if n, err := strconv.Atoi(f[strings.LastIndexByte(f, '.')+1:]); err == nil && n > newestN {
			newest, newestN = f, n
		}
	}
	if keep := os.Getenv("INPLACED_RELAY_COST_KEEP"); keep != "" { // for callgrind_annotate
		_ = exec.Command("cp", newest, filepath.Join(keep, filepath.Base(newest))).Run()
	}
	data, err := os.ReadFile(newest)
	if err != nil {
		b.Fatalf("callgrind dump of %d: %v", pid, err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "summary: "); ok {
			n, _ := strconv.ParseInt(strings.Fields(v)[0], 10, 64)
			return n
		}
	}
	b.Fatalf("%s: no summary line", newest)
	return 0
}
