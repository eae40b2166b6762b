package harness

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// instanceDirPrefix starts the base name of every instance directory.
const instanceDirPrefix = "ipd"

// Containerd is a private containerd started by StartContainerd.
type Containerd struct {
	Backend Backend
	// Dir holds everything of this instance: config.toml, root/, state/, the
	// socket, net.d/, certs.d/, runc/, cni-ipam/, containerd.log. It is short so
	// that socket paths stay below the 108-byte limit.
	Dir string
	// Socket is the CRI/containerd gRPC socket; Endpoint is "unix://"+Socket.
	Socket   string
	Endpoint string
	// ConfigPath and LogPath are Dir/config.toml and Dir/containerd.log.
	ConfigPath string
	LogPath    string
	// Bridge, Subnet and NetworkName describe the instance's CNI network;
	// Subnet6 is its IPv6 range (WithIPv6), empty for IPv4 only.
	Subnet6     string
	dualStack   bool
	Bridge      string
	Subnet      string
	NetworkName string
	// StreamPort is the port of the CRI streaming server (exec, attach,
	// port-forward) on 127.0.0.1.
	StreamPort int
	// Registry is the registry this instance mirrors; Images its test images.
	Registry *Registry
	Images   Images
	// PID is the pid of the running containerd, 0 while stopped.
	PID int
	// Runsc reports that handler runsc (gVisor) is registered: a 2.x
	// backend with gVisor installed (RequireRunsc).
	Runsc bool
	// Mirrors are registry hosts (e.g. "registry.k8s.io") that this instance
	// resolves to Registry (WithMirrors).
	Mirrors []string

	tb   testing.TB
	slot *slot

	mu          sync.Mutex
	run         *daemonRun // nil while stopped
	everStarted bool

	closeOnce sync.Once
	closeErr  error
}

// StartContainerd starts a private containerd of backend b that pulls from reg
// (which gets the test images pushed) and uses Images.Pause as sandbox image.
// tb.Cleanup tears it down: see Close.
func StartContainerd(tb testing.TB, b Backend, reg *Registry, opts ...Option) *Containerd {
	tb.Helper()
	RequireRoot(tb)
	Require(tb, string(b), b.Available(), fmt.Sprintf("%s or its containerd-shim-runc-v2 not found; run hack/install-deps.sh", ContainerdBinary(b)))
	Require(tb, "runc", lookPathOr("runc", "") != "", "runc not in PATH; run hack/install-deps.sh")
	for _, p := range []string{"bridge", "host-local", "portmap", "loopback"} {
		Require(tb, "CNI plugin "+p, isExecutable("/usr/lib/cni/"+p), "install containernetworking-plugins (hack/install-deps.sh)")
	}
	if reg == nil {
		tb.Fatal("StartContainerd: a registry is required (StartRegistry)")
	}
	images := reg.PushTestImages(tb)

	dir, err := os.MkdirTemp(shortTempDir(), instanceDirPrefix)
	if err != nil {
		tb.Fatalf("containerd: %v", err)
	}
	c := &Containerd{
		Backend:    b,
		Dir:        dir,
		Socket:     filepath.Join(dir, "c.sock"),
		ConfigPath: filepath.Join(dir, "config.toml"),
		LogPath:    filepath.Join(dir, "containerd.log"),
		Registry:   reg,
		Images:     images,
		tb:         tb,
	}
	for _, o := range opts {
		o(c)
	}
	c.Endpoint = "unix://" + c.Socket
	// gVisor's shim speaks shim bootstrap protocol v2, which 1.6 cannot read.
	c.Runsc = b == Containerd2 && RunscAvailable()

	c.slot, err = acquireSlot(tb, dir)
	if err != nil {
		_ = os.RemoveAll(dir)
		tb.Fatalf("containerd: %v", err)
	}
	// Cleanups run last-in first-out: the slot (bridge name, subnet) is given
	// back only after Close, and after whatever the test checked past Close.
	tb.Cleanup(c.slot.release)
	tb.Cleanup(func() {
		if err := c.Close(); err != nil {
			tb.Errorf("containerd %s cleanup: %v", c.Dir, err)
		}
	})
	liveInstances.Add(1)
	c.Bridge, c.Subnet, c.NetworkName = bridgeName(c.slot.n), subnet(c.slot.n), networkName(c.slot.n)
	if c.dualStack {
		c.Subnet6 = subnet6(c.slot.n)
	}
	if c.StreamPort, err = freePort(); err != nil {
		tb.Fatalf("containerd: %v", err)
	}
	if err := c.writeConfig(); err != nil {
		tb.Fatalf("containerd: write config: %v", err)
	}
	if err := c.Start(); err != nil {
		tb.Fatalf("start %s: %v\n%s", b, err, c.LogTail(40))
	}
	tb.Logf("%s running: pid %d, endpoint %s, bridge %s %s", b, c.PID, c.Endpoint, c.Bridge, c.Subnet)
	return c
}

// RequireRunsc skips tb (or fails it under CI=true) unless handler runsc
// (gVisor) is registered in c.
func (c *Containerd) RequireRunsc(tb testing.TB) {
	tb.Helper()
	Require(tb, "runtime handler runsc", c.Runsc, fmt.Sprintf(
		"needs backend %s and gVisor in %s (runsc, containerd-shim-runsc-v1); run hack/install-deps.sh", Containerd2, GVisorBinDir()))
}

// Option configures StartContainerd.
type Option func(*Containerd)

// WithIPv6 gives pods an IPv6 address too (Subnet6), beside the IPv4 one.
func WithIPv6() Option { return func(c *Containerd) { c.dualStack = true } }

// WithMirrors makes containerd pull images of these registry hosts from the
// harness registry (same repository paths): e.g. CritestRegistryHosts.
func WithMirrors(hosts ...string) Option {
	return func(c *Containerd) { c.Mirrors = append(c.Mirrors, hosts...) }
}

// shortTempDir keeps unix socket paths short: $INPLACED_TEST_TMPDIR or /tmp.
func shortTempDir() string {
	if d := os.Getenv("INPLACED_TEST_TMPDIR"); d != "" {
		return d
	}
	return "/tmp"
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// Start (re)starts containerd with the instance's config and dirs and waits
// until CRI reports the runtime and network ready. Running containers and
// their shims survive a Stop/Start.
func (c *Containerd) Start() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.run != nil {
		return errors.New("containerd is already running")
	}
	logf, err := os.OpenFile(c.LogPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	fmt.Fprintf(logf, "==== harness: starting %s at %s\n", ContainerdBinary(c.Backend), time.Now().Format(time.RFC3339Nano))

	bin := ContainerdBinary(c.Backend)
	cmd := exec.Command(bin, "--config", c.ConfigPath)
	cmd.Dir = c.Dir
	cmd.Stdout, cmd.Stderr = logf, logf
	// The backend's own shims come first in PATH.
	path := filepath.Dir(bin)
	if c.Runsc {
		path += ":" + GVisorBinDir()
	}
	cmd.Env = append(filteredEnv("PATH"), "PATH="+path+":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	// Own process group: a ^C to go test does not reach it before cleanup.
	// Pdeathsig: it dies with the test process if that crashes.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := startLocked(cmd); err != nil {
		return fmt.Errorf("start %s: %w", bin, err)
	}
	// The waiter never takes c.mu: Start and stop wait for it while holding it.
	run := &daemonRun{cmd: cmd, exited: make(chan struct{})}
	go func() {
		run.err = cmd.Wait()
		close(run.exited)
	}()
	if err := c.waitReady(run, 60*time.Second); err != nil {
		_ = cmd.Process.Kill()
		<-run.exited
		return err
	}
	c.run, c.PID, c.everStarted = run, cmd.Process.Pid, true
	return nil
}

// daemonRun is one run of the containerd process.
type daemonRun struct {
	cmd    *exec.Cmd
	exited chan struct{} // closed once cmd.Wait returned; err is set then
	err    error
}

func filteredEnv(drop ...string) []string {
	var out []string
	for _, kv := range os.Environ() {
		keep := true
		for _, d := range drop {
			if strings.HasPrefix(kv, d+"=") {
				keep = false
			}
		}
		if keep {
			out = append(out, kv)
		}
	}
	return out
}

// waitReady polls CRI Status until RuntimeReady and NetworkReady.
func (c *Containerd) waitReady(run *daemonRun, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		select {
		case <-run.exited:
			return fmt.Errorf("containerd exited during start: %v", run.err)
		default:
		}
		if _, err := os.Stat(c.Socket); err == nil {
			last = c.criReady()
			if last == nil {
				return nil
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("containerd not ready after %s: %v", timeout, last)
}

func (c *Containerd) criReady() error {
	cli, err := dialCRI(c.Endpoint)
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	resp, err := cli.Runtime.Status(ctx, &runtimeapi.StatusRequest{})
	if err != nil {
		return err
	}
	for _, cond := range resp.GetStatus().GetConditions() {
		if !requiredCondition(cond.GetType()) {
			continue
		}
		if !cond.GetStatus() {
			return fmt.Errorf("%s: %s %s", cond.GetType(), cond.GetReason(), cond.GetMessage())
		}
	}
	return nil
}

// Running reports whether containerd runs.
func (c *Containerd) Running() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.run != nil
}

// Stop sends SIGTERM to containerd and waits for it to exit (SIGKILL after
// 15 s). Shims and containers keep running.
func (c *Containerd) Stop() error { return c.stop(syscall.SIGTERM, 15*time.Second) }

// Kill sends SIGKILL to containerd (a crash) and waits for it to exit.
func (c *Containerd) Kill() error { return c.stop(syscall.SIGKILL, 5*time.Second) }

// Restart is Stop then Start.
func (c *Containerd) Restart() error {
	if err := c.Stop(); err != nil {
		return err
	}
	return c.Start()
}

func (c *Containerd) stop(sig syscall.Signal, grace time.Duration) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	run := c.run
	if run == nil {
		return nil
	}
	_ = run.cmd.Process.Signal(sig)
	select {
	case <-run.exited:
	case <-time.After(grace):
		_ = run.cmd.Process.Kill()
		<-run.exited
	}
	c.run, c.PID = nil, 0
	if f, err := os.OpenFile(c.LogPath, os.O_WRONLY|os.O_APPEND, 0); err == nil {
		fmt.Fprintf(f, "==== harness: containerd stopped with %s at %s\n", sig, time.Now().Format(time.RFC3339Nano))
		f.Close()
	}
	return nil
}

// LogTail returns the last n lines of containerd's log.
func (c *Containerd) LogTail(n int) string {
	data, err := os.ReadFile(c.LogPath)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// liveInstances counts the instances of this process not closed yet: the last
// one to close removes the cgroup parents handed out by CgroupParent.
var liveInstances counter

type counter struct {
	mu sync.Mutex
	n  int
}

func (c *counter) Add(d int) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n += d
	return c.n
}

// Close tears the instance down; tb.Cleanup calls it, and tests that want to
// check the teardown call it first (it runs once):
//  1. through CRI, stop and remove every pod sandbox (CNI DEL tears down veths,
//     netns and portmap rules), starting containerd again if it was stopped;
//  2. SIGTERM containerd;
//  3. SIGKILL what is left of the processes with Dir in their command line
//     (shims, runc) and their descendants (containers), and remove the files
//     killed shims leave (their socket, libcni's loopback cache);
//  4. unmount everything below Dir; delete the bridge; remove libcni's cache
//     files of the network, the pod cgroups handed out by CgroupParent (by the
//     last instance of the process), and Dir.
//
// The instance's slot (bridge name, subnet) stays taken until the test's
// cleanups run, so a test can check the bridge is gone after Close.
func (c *Containerd) Close() error {
	c.closeOnce.Do(func() { c.closeErr = c.close() })
	return c.closeErr
}

func (c *Containerd) close() error {
	var errs []error
	if !c.Running() && c.everStarted {
		if err := c.Start(); err != nil {
			c.tb.Logf("containerd %s: restart for teardown failed: %v", c.Dir, err)
		}
	}
	if c.Running() {
		if err := c.removeAllPods(); err != nil {
			errs = append(errs, err)
		}
	}
	if c.tb.Failed() {
		c.tb.Logf("containerd %s log (last 60 lines):\n%s", c.Backend, c.LogTail(60))
		saveArtifacts(c.tb, "-"+string(c.Backend)+"-"+filepath.Base(c.Dir), c.LogPath, c.ConfigPath)
	}
	if err := c.Stop(); err != nil {
		errs = append(errs, err)
	}
	if err := killInstanceProcs(c.Dir, 15*time.Second); err != nil {
		errs = append(errs, err)
	}
	if err := deleteLink(c.Bridge); err != nil {
		errs = append(errs, err)
	}
	removeCNICache(c.NetworkName)
	if liveInstances.Add(-1) == 0 {
		if err := removeCgroupParents(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := unmountUnder(c.Dir); err != nil {
		errs = append(errs, err)
	} else if err := os.RemoveAll(c.Dir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// removeAllPods stops and removes every pod sandbox (and any container
// outside one) through CRI.
func (c *Containerd) removeAllPods() error {
	cli, err := dialCRI(c.Endpoint)
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var errs []error
	pods, err := cli.Runtime.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return fmt.Errorf("list pod sandboxes: %w", err)
	}
	for _, p := range pods.GetItems() {
		// Retried as kubelet does: containerd 1.6 under load sometimes answers
		// a first StopPodSandbox with "ttrpc: closed".
		if err := retry(ctx, func() error {
			_, err := cli.Runtime.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: p.GetId()})
			return err
		}); err != nil {
			errs = append(errs, fmt.Errorf("stop pod %s: %w", p.GetId(), err))
		}
		if err := retry(ctx, func() error {
			_, err := cli.Runtime.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: p.GetId()})
			return err
		}); err != nil {
			errs = append(errs, fmt.Errorf("remove pod %s: %w", p.GetId(), err))
		}
	}
	ctrs, err := cli.Runtime.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("list containers: %w", err))...)
	}
	for _, ct := range ctrs.GetContainers() {
		_, _ = cli.Runtime.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: ct.GetId(), Timeout: 1})
		if _, err := cli.Runtime.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: ct.GetId()}); err != nil {
			errs = append(errs, fmt.Errorf("remove container %s: %w", ct.GetId(), err))
		}
	}
	return errors.Join(errs...)
}

// retry runs f up to 3 times, 1 s apart, until it succeeds.
func retry(ctx context.Context, f func() error) error {
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		if err = f(); err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(time.Second):
		}
	}
	return err
}

// saveArtifacts copies files to $INPLACED_ARTIFACTS, if set, into a folder
// named after the test (slashes and spaces made underscores) and suffix:
// e.g. "<test>-kubelet-<dir>". Failures are ignored: the artifacts are a help,
// the test has already failed.
func saveArtifacts(tb testing.TB, suffix string, files ...string) {
	dst := os.Getenv("INPLACED_ARTIFACTS")
	if dst == "" {
		return
	}
	name := strings.NewReplacer("/", "_", " ", "_").Replace(tb.Name()) + suffix
	dir := filepath.Join(dst, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return
	}
	for _, f := range files {
		_ = copyFile(f, filepath.Join(dir, filepath.Base(f)))
	}
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// Leftovers describes what of the instance is still on the machine: processes
// with Dir in their command line (and descendants), mounts below Dir, the
// bridge, Dir itself. Empty after a successful Close.
func (c *Containerd) Leftovers() []string {
	var out []string
	for _, p := range procsOf(c.Dir) {
		out = append(out, fmt.Sprintf("process %d: %s", p.pid, p.cmdline))
	}
	for _, m := range mountsUnder(c.Dir) {
		out = append(out, "mount "+m)
	}
	if c.Bridge != "" && linkExists(c.Bridge) {
		out = append(out, "link "+c.Bridge)
	}
	if _, err := os.Stat(c.Dir); err == nil {
		out = append(out, "dir "+c.Dir)
	}
	return out
}

// startLocked starts cmd from a goroutine locked to an OS thread that never
// exits: Pdeathsig fires when the *thread* that forked the child exits, and Go
// may end threads of locked goroutines.
func startLocked(cmd *exec.Cmd) error {
	spawnerOnce.Do(func() {
		spawnReqs = make(chan spawnReq)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread lives as long as the process
			for r := range spawnReqs {
				r.done <- r.cmd.Start()
			}
		}()
	})
	done := make(chan error, 1)
	spawnReqs <- spawnReq{cmd: cmd, done: done}
	return <-done
}

type spawnReq struct {
	cmd  *exec.Cmd
	done chan error
}

var (
	spawnerOnce sync.Once
	spawnReqs   chan spawnReq
)
