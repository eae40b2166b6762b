package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/test/bench/report"
	"github.com/inplaced/inplaced/test/harness"
)

const (
	// loadPods is how many static pods kubelet runs during the window (the
	// load the report.TargetLoad* bounds are judged under).
	loadPods = 60
	// loadNamespace is the static pods' namespace.
	loadNamespace = "load"
	// loadSampleEvery: /proc of the processes is read this often;
	// loadScrapeEvery: inplaced's /metrics is scraped this often.
	loadSampleEvery = 5 * time.Second
	loadScrapeEvery = 15 * time.Second
	// loadSettle is the wait between the last pod ready and the window.
	loadSettle = 30 * time.Second
	// loadEnvMinutes sets the window's length in minutes (default 10).
	loadEnvMinutes = "INPLACED_BENCH_LOAD_MINUTES"
	// loadEnvFloorMinutes sets the floor window's length in minutes
	// (default 5; 0: no floor window).
	loadEnvFloorMinutes = "INPLACED_BENCH_LOAD_FLOOR_MINUTES"
	// loadReconnect bounds the wait for kubelet's first connection through
	// the floor relay once it listens.
	loadReconnect = 2 * time.Minute
	// loadUnavailable is how kubelet logs a CRI call that could not reach
	// the runtime (a gRPC status error's text).
	loadUnavailable = "code = Unavailable"
	// loadEnvDoc names the markdown file the benchmark writes
	// (hack/bench.sh: docs/benchmarks-kubelet-load.md).
	loadEnvDoc = "INPLACED_BENCH_LOAD_DOC"
	// kubelet's own defaults for the two frequencies the harness shortens.
	loadSyncFrequency      = time.Minute
	loadFileCheckFrequency = 20 * time.Second
)

// loadWindow is the measured window: $INPLACED_BENCH_LOAD_MINUTES minutes
// (a decimal number), default 10.
func loadWindow() time.Duration {
	if w := loadMinutes(loadEnvMinutes); w > 0 {
		return w
	}
	return 10 * time.Minute
}

// loadFloorWindow is the floor window: $INPLACED_BENCH_LOAD_FLOOR_MINUTES
// minutes, default 5; 0 measures none.
func loadFloorWindow() time.Duration {
	if w := loadMinutes(loadEnvFloorMinutes); w >= 0 {
		return w
	}
	return 5 * time.Minute
}

// loadMinutes is $name as a decimal number of minutes, -1 when unset or
// not a number ≥ 0.
func loadMinutes(name string) time.Duration {
	if m, err := strconv.ParseFloat(os.Getenv(name), 64); err == nil && m >= 0 {
		return time.Duration(m * float64(time.Minute))
	}
	return -1
}

// BenchmarkKubeletLoad measures what a node pays for inplaced: a real
// kubelet (standalone, static pods: no API server needed) runs 60 pods of
// one container through inplaced in front of containerd, and once they are
// all ready the benchmark watches for $INPLACED_BENCH_LOAD_MINUTES minutes
// (default 10) while kubelet does only its own work — relist, status,
// periodic sync, stats. Every 5 s it reads inplaced's, containerd's (the
// daemon; its shims apart), and kubelet's CPU time, inplaced's RSS, threads
// and open fds; every 15 s it scrapes inplaced's /metrics for
// go_goroutines. Verdicts (report.KubeletLoadVerdicts): inplaced's CPU ≤
// 10 % of containerd's over the window, its RSS ≤ 30 MiB, no goroutine or
// fd growth from minute 2 to the last minute.
//
// Then the floor windows (measureLoadFloor), for reference: inplaced is
// stopped, the Go byte relay (test/bench/floorrelay) takes its socket,
// kubelet reconnects, and $INPLACED_BENCH_LOAD_FLOOR_MINUTES minutes
// (default 5; 0: none) are sampled the same way; then socat (a C byte
// relay) in its place, the same way — the cheapest processes there can be
// on that path, against containerd's CPU under the same calls.
//
// It starts a kubelet: run it under `flock /run/inplaced-kubelet-e2e.lock`
// on a shared machine. With $INPLACED_BENCH_LOAD_DOC set it writes that
// markdown file (docs/benchmarks-kubelet-load.md from hack/bench.sh); the
// windows also go to $INPLACED_BENCH_RESULTS (report.Record.KubeletLoad).
func BenchmarkKubeletLoad(b *testing.B) {
	harness.KubeletPrerequisites(b)
	window, floorWindow := loadWindow(), loadFloorWindow()
	if window < 2*time.Minute {
		b.Fatalf("$%s: the window must be at least 2 minutes (minute 2 is compared with the last), not %s", loadEnvMinutes, window)
	}
	var floorBin string
	if floorWindow > 0 {
		if floorWindow < loadSampleEvery {
			b.Fatalf("$%s: the floor window must hold a sample (every %s), not %s", loadEnvFloorMinutes, loadSampleEvery, floorWindow)
		}
		// Before any window: a build fails early and its CPU is in none.
		floorBin = buildFloorRelay(b, b.TempDir())
	}
	host, _ := os.Hostname()
	run := report.KubeletLoadRun{Host: host, CPUModel: kubeProcField("/proc/cpuinfo", "model name"), Kernel: kubeKernel(),
		GoVersion: runtime.Version(), NProc: runtime.NumCPU(), KubeletVersion: harness.KubeletVersion,
		Commit: kubeCommit(), Command: "go test ./test/bench/ " + strings.Join(kubeTestFlags(), " "), Started: time.Now()}
	// The whole run's load, every second (BenchmarkKubePatch's sampler).
	loads := &kubeRun{}
	stop, sampled := make(chan struct{}), make(chan struct{})
	go func() { loads.sample(stop); close(sampled) }()
	var stopOnce sync.Once
	stopSampling := func() { stopOnce.Do(func() { close(stop); <-sampled }) }
	defer stopSampling()
	benchBackends(b, func(b *testing.B, c *harness.Containerd) {
		k, version := measureKubeletLoad(b, c, window, floorWindow, floorBin)
		run.Backends = append(run.Backends, fmt.Sprintf("`%s`: %s", c.Backend, version))
		run.Loads = append(run.Loads, k)
		mustAppend(b, report.Record{KubeletLoad: k})
		var vs []string
		for _, v := range report.KubeletLoadVerdicts(k) {
			vs = append(vs, fmt.Sprintf("%s: %s: %s", v.Target, v.Measured, v.Result))
		}
		b.Logf("verdicts:\n%s", strings.Join(vs, "\n"))
		b.ReportMetric(k.CPURatio(), "inplaced/containerd-cpu")
		b.ReportMetric(float64(k.MaxRSSKiB())/1024, "rss-MiB")
		for _, f := range k.Floors {
			b.ReportMetric(f.CPURatio(), strings.ReplaceAll(strings.TrimPrefix(f.Relay, "floor: "), " ", "-")+"/containerd-cpu")
		}
	})
	run.Finished = time.Now()
	stopSampling()
	loads.mu.Lock()
	run.Load = loads.load
	loads.mu.Unlock()
	path := os.Getenv(loadEnvDoc)
	if path == "" || len(run.Loads) == 0 {
		return
	}
	if b.Failed() {
		// A broken run never replaces the measured document.
		path = strings.TrimSuffix(path, ".md") + ".failed.md"
	}
	var buf strings.Builder
	if err := report.RenderKubeletLoad(&buf, run, loadEnvDoc); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(buf.String()), 0o644); err != nil {
		b.Errorf("write %s: %v", path, err)
		return
	}
	b.Logf("wrote %s", path)
}

// measureKubeletLoad runs the pods and the window on containerd c, then
// the floor window if floorWindow > 0 (floorBin: the built floorrelay),
// then tears kubelet, the relay or inplaced and containerd down and checks
// they left nothing.
func measureKubeletLoad(b *testing.B, c *harness.Containerd, window, floorWindow time.Duration, floorBin string) (*report.KubeletLoad, string) {
	b.Helper()
	direct := c.CRI(b)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	v, err := direct.Runtime.Version(ctx, &runtimeapi.VersionRequest{})
	if err != nil {
		b.Fatalf("Version: %v", err)
	}
	// On the node before kubelet asks: the window is about calls, not pulls.
	for _, img := range []string{c.Images.Pause, c.Images.App1} {
		if _, err := direct.Image.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: img}}); err != nil {
			b.Fatalf("PullImage %s: %v", img, err)
		}
	}

	metricsAddr := loadFreeAddr(b)
	px := harness.StartInplaced(b, c.Endpoint)
	if err := px.Stop(); err != nil {
		b.Fatal(err)
	}
	// As a node runs it (the harness starts it at debug level), with its
	// metrics on for go_goroutines.
	px.ExtraArgs = []string{"--log-level", "info", "--metrics-listen", metricsAddr}
	if err := px.Start(); err != nil {
		b.Fatalf("restart inplaced at info level: %v\n%s", err, px.LogTail(20))
	}
	scr := &loadScraper{url: "http://" + metricsAddr + "/metrics", client: &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 1}}}

	kl := harness.StartKubelet(b, harness.KubeletOptions{RuntimeEndpoint: px.Endpoint, BackendEndpoint: c.Endpoint,
		SyncFrequency: loadSyncFrequency, FileCheckFrequency: loadFileCheckFrequency})
	res := &report.KubeletLoad{Backend: string(c.Backend), Pods: loadPods, Image: "App1",
		Kubelet: fmt.Sprintf("%s, syncFrequency %s, fileCheckFrequency %s (kubelet's defaults), the rest as `test/harness` configures it",
			harness.KubeletVersion, loadSyncFrequency, loadFileCheckFrequency),
		Inplaced: strings.Join(px.ExtraArgs, " "), SettleNs: int64(loadSettle),
		SampleEveryNs: int64(loadSampleEvery), ScrapeEveryNs: int64(loadScrapeEvery)}
	if fi, err := os.Stat(filepath.Join(harness.BinDir(b), "inplaced")); err == nil {
		res.BinaryBytes = fi.Size()
	}

	began := time.Now()
	for i := range loadPods {
		kl.WritePod(b, harness.StaticPod{Name: fmt.Sprintf("load-%02d", i), Namespace: loadNamespace,
			Containers: []harness.StaticContainer{{Name: "app", Image: c.Images.App1}}})
	}
	if _, err := loadWaitPods(kl, 15*time.Minute); err != nil {
		b.Fatalf("%d pods: %v\nkubelet log:\n%s", loadPods, err, kl.LogTail(40))
	}
	res.PodsReadyNs = int64(time.Since(began))
	b.Logf("%d pods running and ready after %s", loadPods, time.Since(began).Round(time.Second))
	time.Sleep(loadSettle)

	pids := map[string]int{"inplaced": px.PID(), "containerd": c.PID, "kubelet": kl.PID()}
	shims := loadShims(c.Socket)
	res.Shims = len(shims)
	cpu0 := loadCPUSince(b, pids, nil)
	shims0 := loadShimsCPU(shims, nil)
	m0, err := scr.scrape()
	if err != nil {
		b.Fatalf("scrape inplaced's metrics: %v", err)
	}
	res.Started = time.Now()
	sampler := startLoadSampler()
	b.Logf("window of %s: inplaced pid %d, containerd pid %d, %d shims, kubelet pid %d", window, pids["inplaced"], pids["containerd"],
		len(shims), pids["kubelet"])

	t0 := res.Started
	lastScrape := t0
	loadTick(t0, window, func(i int, at time.Duration) {
		s := report.LoadSample{AtNs: int64(at), Goroutines: -1}
		cpu := loadCPUSince(b, pids, cpu0)
		s.InplacedCPUNs = int64(cpu["inplaced"])
		s.ContainerdCPUNs = int64(cpu["containerd"])
		s.KubeletCPUNs = int64(cpu["kubelet"])
		for _, t := range loadShimsCPU(shims, shims0) {
			s.ShimsCPUNs += int64(t)
		}
		st, err := loadStatus(pids["inplaced"])
		if err != nil {
			b.Fatal(err)
		}
		s.RSSKiB, s.RSSAnonKiB, s.RSSFileKiB, s.Threads, res.VmHWMKiB = st["VmRSS"], st["RssAnon"], st["RssFile"], int(st["Threads"]), st["VmHWM"]
		if s.FDs, err = loadFDs(pids["inplaced"], ""); err != nil {
			b.Fatal(err)
		}
		s.Load1, _ = load1()
		if time.Since(lastScrape) >= loadScrapeEvery-loadSampleEvery/2 {
			m, err := scr.scrape()
			if err != nil {
				b.Fatalf("scrape inplaced's metrics: %v", err)
			}
			s.Goroutines, s.HeapInuseKiB, lastScrape = m.goroutines, m.heapInuseKiB, time.Now()
		}
		res.Samples = append(res.Samples, s)
		if i%12 == 0 {
			b.Logf("%s: inplaced CPU %s, containerd %s, RSS %d KiB, fds %d, goroutines %d, load %.1f",
				time.Duration(s.AtNs).Round(time.Second), time.Duration(s.InplacedCPUNs), time.Duration(s.ContainerdCPUNs), s.RSSKiB, s.FDs, s.Goroutines, s.Load1)
		}
	})
	res.Conditions = sampler.finish()
	res.WindowNs = int64(time.Since(t0))
	m1, err := scr.scrape()
	if err != nil {
		b.Fatalf("scrape inplaced's metrics: %v", err)
	}
	res.Calls = map[string]int64{}
	for m, n := range m1.calls {
		if d := n - m0.calls[m]; d > 0 {
			res.Calls[m] = d
		}
	}
	res.Scrapes = scr.n - 1 // the one before the window is not in it

	res.PodsRunning, res.Restarts = loadPodsState(b, kl)
	if res.PodsRunning != loadPods {
		b.Errorf("%d of %d pods running and ready at the window's end", res.PodsRunning, loadPods)
	}
	if n := len(loadShims(c.Socket)); n != len(shims) {
		b.Logf("%d shims at the window's end, %d at its start (the shims column counts those of the start)", n, len(shims))
	}

	// What one scrape costs inplaced, to say how much of its CPU the
	// window's scrapes were.
	before, _ := procCPU(pids["inplaced"])
	for range 100 {
		if _, err := scr.scrape(); err != nil {
			b.Fatalf("scrape: %v", err)
		}
	}
	after, _ := procCPU(pids["inplaced"])
	res.ScrapeCPUNs = int64(after-before) / 100

	if strings.Contains(px.LogTail(1<<30), "panic:") {
		b.Errorf("inplaced panicked:\n%s", px.LogTail(40))
	}
	scr.client.CloseIdleConnections()
	var relay *floorProc
	if floorWindow > 0 {
		stop := px.Stop
		for _, floor := range loadFloors(b, floorBin) {
			var f *report.LoadFloor
			f, relay = measureLoadFloor(b, floor, stop, floorWindow, px, c, kl, res.Restarts)
			res.Floors = append(res.Floors, f)
			prev := relay
			stop = func() error { prev.stop(); return nil }
		}
	}
	// Teardown, checked: kubelet and its pods (through the floor relay when
	// it took inplaced's socket), then the relay and inplaced, then
	// containerd.
	if err := kl.Close(); err != nil {
		b.Errorf("kubelet close: %v", err)
	}
	if l := kl.Leftovers(); len(l) > 0 {
		b.Errorf("kubelet left behind: %v", l)
	}
	if relay != nil {
		relay.stop()
		if err := os.Remove(px.Socket); err != nil && !errors.Is(err, fs.ErrNotExist) {
			b.Errorf("remove the floor relay's socket: %v", err)
		}
	}
	if err := px.Stop(); err != nil {
		b.Errorf("stop inplaced: %v", err)
	}
	if err := c.Close(); err != nil {
		b.Errorf("containerd close: %v", err)
	}
	if l := c.Leftovers(); len(l) > 0 {
		b.Errorf("containerd left behind: %v", l)
	}
	return res, v.RuntimeName + " " + v.RuntimeVersion
}

// loadFloor is a byte relay a floor window puts in inplaced's place.
type loadFloor struct {
	name string // report.GoFloor, report.SocatFloor
	argv func(sock, backendSock string) []string
}

// loadFloors are the floor windows' relays, in the order they run: the Go
// byte relay floorBin, then socat when installed (a C relay: what no Go
// process can undercut; one forked child per connection, all of them
// counted).
func loadFloors(tb testing.TB, floorBin string) []loadFloor {
	out := []loadFloor{{report.GoFloor, func(sock, backendSock string) []string { return []string{floorBin, sock, backendSock} }}}
	socat, err := exec.LookPath("socat")
	if err != nil {
		tb.Logf("socat not installed: the Go floor only")
		return out
	}
	// -b: a 1 MiB transfer block, so a large ListContainers answer passes
	// in few reads (the default of 8 KiB costs it more).
	return append(out, loadFloor{report.SocatFloor, func(sock, backendSock string) []string {
		return []string{socat, "-b", "1048576", "UNIX-LISTEN:" + sock + ",fork,mode=600", "UNIX-CONNECT:" + backendSock}
	}})
}

// measureLoadFloor is one floor window: stop stopped what served
// px.Socket (inplaced, or the floor window before), and floor's relay
// serves it in front of containerd c, kubelet kl reconnecting through it
// by itself, then window sampled as inplaced's was. restarts0 are the
// container restarts kubelet reported at the end of inplaced's window. It
// returns with the relay still serving kubelet: the caller stops it.
func measureLoadFloor(b *testing.B, floor loadFloor, stop func() error, window time.Duration, px *harness.Inplaced, c *harness.Containerd,
	kl *harness.Kubelet, restarts0 int) (*report.LoadFloor, *floorProc) {
	b.Helper()
	relay, reconnect, err := loadSwitchToFloor(b, stop, px.Socket, floor.name, floor.argv(px.Socket, c.Socket))
	if err != nil {
		b.Fatalf("%v\nkubelet log:\n%s", err, kl.LogTail(40))
	}
	f := &report.LoadFloor{Relay: floor.name, SettleNs: int64(loadSettle), ReconnectNs: int64(reconnect)}
	b.Logf("floor: kubelet connected through %s (pid %d) %s after it listened", floor.name, relay.pid(),
		time.Duration(f.ReconnectNs).Round(time.Millisecond))
	time.Sleep(loadSettle)

	pids := map[string]int{"containerd": c.PID, "kubelet": kl.PID()}
	unavailable0 := len(kl.LogGrep(loadUnavailable))
	read0, readErr := relay.rchar()
	cpu0 := loadCPUSince(b, pids, nil)
	relay0, err := relay.cpu()
	if err != nil {
		b.Fatal(err)
	}
	f.Started = time.Now()
	sampler := startLoadSampler()
	b.Logf("floor window of %s", window)
	loadTick(f.Started, window, func(i int, at time.Duration) {
		cpu := loadCPUSince(b, pids, cpu0)
		relayCPU, err := relay.cpu()
		if err != nil {
			b.Fatal(err)
		}
		rss, err := relay.rssKiB()
		if err != nil {
			b.Fatal(err)
		}
		s := report.FloorSample{AtNs: int64(at), RelayCPUNs: int64(relayCPU - relay0), ContainerdCPUNs: int64(cpu["containerd"]),
			KubeletCPUNs: int64(cpu["kubelet"]), RelayRSSKiB: rss}
		f.Samples = append(f.Samples, s)
		if i%12 == 0 {
			b.Logf("floor %s: relay CPU %s, containerd %s, relay RSS %d KiB", at.Round(time.Second),
				time.Duration(s.RelayCPUNs), time.Duration(s.ContainerdCPUNs), s.RelayRSSKiB)
		}
	})
	f.Conditions = sampler.finish()
	f.WindowNs = int64(time.Since(f.Started))
	if read1, err := relay.rchar(); err == nil && readErr == nil {
		if f.RelayReadBytes = read1 - read0; f.RelayReadBytes <= 0 {
			b.Errorf("%s read nothing during its window: kubelet's calls did not go through it", floor.name)
		}
	} else {
		b.Logf("%s's /proc/<pid>/io: %v %v", floor.name, readErr, err)
	}

	// kubelet's calls reached containerd through the relay all along.
	unavailable := kl.LogGrep(loadUnavailable)
	f.Unavailable = len(unavailable) - unavailable0
	if f.Unavailable > 0 {
		b.Errorf("kubelet logged %d %q errors during the %s window: its calls did not all reach containerd through the relay; the last:\n%s",
			f.Unavailable, loadUnavailable, floor.name, unavailable[len(unavailable)-1])
	}
	var restarts int
	f.PodsRunning, restarts = loadPodsState(b, kl)
	f.Restarts = restarts - restarts0
	if f.PodsRunning != loadPods {
		b.Errorf("%d of %d pods running and ready at the end of the %s window", f.PodsRunning, loadPods, floor.name)
	}
	if n, err := relay.sockets(); err != nil || n < 3 {
		b.Errorf("kubelet no longer connected through %s at the window's end (%d sockets, %v)", floor.name, n, err)
	}
	return f, relay
}

// loadSwitchToFloor puts a byte relay (argv, named name) in place of what
// serves sock: stop stops that, the relay listens on sock, and the client
// that used sock (kubelet) must connect through it by itself within
// loadReconnect. It returns the relay, still running, and how long the
// client took from the relay's listening.
func loadSwitchToFloor(tb testing.TB, stop func() error, sock, name string, argv []string) (*floorProc, time.Duration, error) {
	tb.Helper()
	if err := stop(); err != nil {
		return nil, 0, fmt.Errorf("stop what served %s: %w", sock, err)
	}
	// inplaced removes its socket as it exits; one that a killed inplaced
	// or relay left would end runFloor's wait before the relay listens.
	if err := os.Remove(sock); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, 0, err
	}
	relay := runFloor(tb, name, sock, argv...)
	listening := time.Now()
	// The client's first connection shows as two more sockets of the
	// relay's beside its listener: the client's side, and the backend's it
	// dialled (socat's are in the child it forked).
	for {
		n, err := relay.sockets()
		if err != nil {
			return relay, 0, fmt.Errorf("%s: %w", name, err)
		}
		if n >= 3 {
			return relay, time.Since(listening), nil
		}
		if time.Since(listening) > loadReconnect {
			return relay, 0, fmt.Errorf("no client connected through %s on %s within %s", name, sock, loadReconnect)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// loadTick calls sample every loadSampleEvery after t0 until window has
// passed, each at its scheduled time (the reads take a few ms more), so
// that minute n holds the samples at (n−1) min < at ≤ n min; i counts them
// from 1.
func loadTick(t0 time.Time, window time.Duration, sample func(i int, at time.Duration)) {
	for i := 1; ; i++ {
		next := t0.Add(time.Duration(i) * loadSampleEvery)
		if next.Sub(t0) > window {
			return
		}
		time.Sleep(time.Until(next))
		sample(i, next.Sub(t0))
	}
}

// loadCPUSince is each named process's CPU time less base's (nil: as it
// is); a process that is not running fails the benchmark.
func loadCPUSince(b *testing.B, pids map[string]int, base map[string]time.Duration) map[string]time.Duration {
	b.Helper()
	out := map[string]time.Duration{}
	for n, p := range pids {
		if p == 0 {
			b.Fatalf("%s is not running", n)
		}
		t, err := procCPU(p)
		if err != nil {
			b.Fatalf("%s (pid %d) gone: %v", n, p, err)
		}
		out[n] = t - base[n]
	}
	return out
}

// loadPodsState counts kubelet's pods of loadNamespace running and ready,
// and their containers' restarts.
func loadPodsState(b *testing.B, kl *harness.Kubelet) (running, restarts int) {
	b.Helper()
	pods, err := kl.Pods(context.Background())
	if err != nil {
		b.Fatalf("kubelet's pods: %v", err)
	}
	for i := range pods {
		if pods[i].Metadata.Namespace != loadNamespace {
			continue
		}
		if harness.Running("app")(&pods[i]) == nil {
			running++
		}
		for _, cs := range pods[i].Status.ContainerStatuses {
			restarts += int(cs.RestartCount)
		}
	}
	return running, restarts
}

// loadWaitPods waits until kubelet runs loadPods pods of loadNamespace,
// every container running and ready.
func loadWaitPods(kl *harness.Kubelet, timeout time.Duration) (int, error) {
	deadline := time.Now().Add(timeout)
	var ready int
	var last error
	for {
		if err := kl.ExitError(); err != nil {
			return ready, fmt.Errorf("kubelet exited: %v", err)
		}
		pods, err := kl.Pods(context.Background())
		if err == nil {
			ready, last = 0, nil
			for i := range pods {
				if pods[i].Metadata.Namespace != loadNamespace {
					continue
				}
				if err := harness.Running("app")(&pods[i]); err != nil {
					last = fmt.Errorf("%s: %v", pods[i].Metadata.Name, err)
					continue
				}
				ready++
			}
			if ready == loadPods {
				return ready, nil
			}
		} else {
			last = err
		}
		if time.Now().After(deadline) {
			return ready, fmt.Errorf("%d ready after %s; last: %v", ready, timeout, last)
		}
		time.Sleep(2 * time.Second)
	}
}

// loadScraper reads inplaced's /metrics over one kept-alive connection
// (so that the scrapes add no fd or goroutine that comes and goes).
type loadScraper struct {
	url    string
	client *http.Client
	n      int
}

// loadMetrics is what one scrape read.
type loadMetrics struct {
	calls        map[string]int64 // inplaced_cri_requests_total by method, all codes
	goroutines   int              // go_goroutines
	heapInuseKiB int64            // go_memstats_heap_inuse_bytes
}

func (s *loadScraper) scrape() (loadMetrics, error) {
	m := loadMetrics{calls: map[string]int64{}, goroutines: -1}
	resp, err := s.client.Get(s.url)
	if err != nil {
		return m, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return m, fmt.Errorf("GET %s: %s", s.url, resp.Status)
	}
	s.n++
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		name, _, _ := strings.Cut(line, " ")
		name, _, _ = strings.Cut(name, "{")
		if name != "go_goroutines" && name != "go_memstats_heap_inuse_bytes" && name != "inplaced_cri_requests_total" {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			return m, fmt.Errorf("%s: %q", s.url, line)
		}
		switch name {
		case "go_goroutines":
			m.goroutines = int(v)
		case "go_memstats_heap_inuse_bytes":
			m.heapInuseKiB = int64(v) >> 10
		default:
			method := loadLabel(line, "method")
			if method == "" {
				return m, fmt.Errorf("%s: no method in %q", s.url, line)
			}
			m.calls[method] += int64(v)
		}
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	if err := sc.Err(); err != nil {
		return m, err
	}
	if m.goroutines < 0 {
		return m, fmt.Errorf("no go_goroutines in %s", s.url)
	}
	return m, nil
}

// loadLabel is label name's value in a Prometheus text-format line.
func loadLabel(line, name string) string {
	_, rest, ok := strings.Cut(line, name+`="`)
	if !ok {
		return ""
	}
	v, _, _ := strings.Cut(rest, `"`)
	return v
}

// loadFreeAddr is a free 127.0.0.1 port for inplaced's metrics.
func loadFreeAddr(b *testing.B) string {
	b.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// loadShims are the pids of the shims of the containerd at socket: their
// command line names it (-address).
func loadShims(socket string) []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if !strings.Contains(filepath.Base(args[0]), "containerd-shim") {
			continue
		}
		for i, a := range args {
			if a == "-address" && i+1 < len(args) && args[i+1] == socket {
				out = append(out, pid)
				break
			}
		}
	}
	return out
}

// loadShimsCPU is each shim's CPU time, less base's (a shim gone since is
// left out).
func loadShimsCPU(pids []int, base map[int]time.Duration) map[int]time.Duration {
	out := map[int]time.Duration{}
	for _, p := range pids {
		if t, err := procCPU(p); err == nil {
			out[p] = t - base[p]
		}
	}
	return out
}

// loadStatus reads the numeric fields of /proc/<pid>/status (sizes in
// KiB): VmRSS, VmHWM, RssAnon, RssFile, Threads, ...
func loadStatus(pid int) (map[string]int64, error) {
	out, err := loadProcNumbers(pid, "status")
	if err == nil && out["VmRSS"] == 0 {
		err = fmt.Errorf("no VmRSS in /proc/%d/status", pid)
	}
	return out, err
}

// loadProcNumbers reads the "key: number ..." lines of /proc/<pid>/<file>
// (status, io).
func loadProcNumbers(pid int, file string) (map[string]int64, error) {
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), file))
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for _, line := range strings.Split(string(data), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if f := strings.Fields(v); ok && len(f) > 0 {
			if n, err := strconv.ParseInt(f[0], 10, 64); err == nil {
				out[k] = n
			}
		}
	}
	return out, nil
}

// loadFDs counts pid's open file descriptors whose target starts with
// prefix ("socket:" for its sockets; "" for all of them).
func loadFDs(pid int, prefix string) (int, error) {
	dir := filepath.Join("/proc", strconv.Itoa(pid), "fd")
	ents, err := os.ReadDir(dir)
	if prefix == "" {
		return len(ents), err
	}
	n := 0
	for _, e := range ents {
		if l, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil && strings.HasPrefix(l, prefix) {
			n++
		}
	}
	return n, err
}

// TestLoadSwitchToFloor is BenchmarkKubeletLoad's switch to its floor
// window without kubelet or containerd: a gRPC client (kubelet's part)
// calls through a relay on one socket (inplaced's part) to an in-memory
// CRI server (containerd's). The relay is killed, leaving its socket file;
// loadSwitchToFloor puts the floor relay on that socket, the client's
// calls must flow again by themselves, and what the benchmark reads of the
// relay (its sockets, /proc/<pid>/io) must say so.
func TestLoadSwitchToFloor(t *testing.T) {
	dir := t.TempDir()
	backendSock := filepath.Join(dir, "backend.sock")
	lis, err := net.Listen("unix", backendSock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(srv, &relayBackend{})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	bin := buildFloorRelay(t, dir)
	for i, floor := range loadFloors(t, bin) {
		sock := filepath.Join(dir, fmt.Sprintf("i%d.sock", i))
		t.Run(floor.name, func(t *testing.T) { testLoadSwitchToFloor(t, sock, backendSock, bin, floor) })
	}
}

func testLoadSwitchToFloor(t *testing.T, sock, backendSock, bin string, floor loadFloor) {
	before := runFloor(t, "before", sock, bin, sock, backendSock)

	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	client := runtimeapi.NewRuntimeServiceClient(conn)
	call := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := client.Version(ctx, &runtimeapi.VersionRequest{})
		return err
	}
	if err := call(); err != nil {
		t.Fatal(err)
	}
	// As kubelet relists: a call every 100 ms, answered or not.
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
				_ = call()
			}
		}
	}()
	relay, took, err := loadSwitchToFloor(t, func() error { before.stop(); return nil }, sock, floor.name, floor.argv(sock, backendSock))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the client connected through the floor relay %s after it listened", took)
	read0, err := relay.rchar()
	if err != nil {
		t.Fatal(err)
	}
	cpu0, err := relay.cpu()
	if err != nil {
		t.Fatal(err)
	}
	for range 20 {
		if err := call(); err != nil {
			t.Fatalf("through the floor relay: %v", err)
		}
	}
	if cpu1, err := relay.cpu(); err != nil || cpu1 <= cpu0 {
		t.Errorf("the relay's CPU time %s → %s (%v): its relaying process is not counted", cpu0, cpu1, err)
	}
	close(stop)
	<-done
	read1, err := relay.rchar()
	if err != nil || read1 <= read0 {
		t.Errorf("the relay's rchar %d → %d (%v): the calls did not go through it", read0, read1, err)
	}
	if n, err := relay.sockets(); err != nil || n < 3 {
		t.Errorf("%d sockets (%v), want the listener and a connection each way", n, err)
	}
	pid := relay.pid()
	relay.stop()
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("the relay (pid %d) is still there after stop: %v", pid, err)
	}
	if c := relay.children(); len(c) > 0 {
		t.Errorf("the relay's children %v are still there after stop", c)
	}
}
