package takeover

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"golang.org/x/sys/unix"

	"github.com/inplaced/inplaced/test/harness"
)

// The rig of the root tests: runc containers in one network namespace with
// a veth pair to the test's, built from bundles made here (the test app,
// the probe), and an agent.

// binaries are the static programs the containers run, built once.
type binaries struct{ app1, app2, probe string }

var (
	buildOnce sync.Once
	built     binaries
	buildErr  error
	buildDir  string
)

func buildBinaries(t *testing.T) binaries {
	t.Helper()
	buildOnce.Do(func() {
		root, err := harness.ModuleRoot()
		if err != nil {
			buildErr = err
			return
		}
		if buildDir, buildErr = os.MkdirTemp("", "takeover-bin-"); buildErr != nil {
			return
		}
		built = binaries{app1: filepath.Join(buildDir, "app-v1"), app2: filepath.Join(buildDir, "app-v2"), probe: filepath.Join(buildDir, "probe")}
		for _, b := range []struct{ out, pkg, version string }{
			{built.app1, "./test/images/app", "v1"}, {built.app2, "./test/images/app", "v2"}, {built.probe, "./pkg/takeover/testdata/probe", ""},
		} {
			cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w -X main.version="+b.version, "-o", b.out, b.pkg)
			cmd.Dir, cmd.Env = root, append(os.Environ(), "CGO_ENABLED=0")
			if out, err := cmd.CombinedOutput(); err != nil {
				buildErr = fmt.Errorf("go build %s: %w\n%s", b.pkg, err, out)
				return
			}
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return built
}

// requireRig skips (fails under CI=true) without root, runc and ip.
func requireRig(t *testing.T) {
	t.Helper()
	harness.Require(t, "root", os.Geteuid() == 0, "runc containers, a network namespace and the agent's pidfd_getfd need root")
	_, err := exec.LookPath("runc")
	harness.Require(t, "runc", err == nil, "install runc (1.1 or later, built with libseccomp 2.5 or later)")
	_, err = exec.LookPath("ip")
	harness.Require(t, "ip", err == nil, "install iproute2")
	_, err = kernelSizes()
	harness.Require(t, "seccomp user notification", err == nil, fmt.Sprint(err))
}

// rig is one test's network namespace, runc state and bundles.
type rig struct {
	t        *testing.T
	bin      binaries
	dir      string // bundles, the agent's socket
	runcRoot string
	netns    string // name under /var/run/netns
	podIP    string
	cgroup   string // the containers' cgroup parent
	socket   string
}

func newRig(t *testing.T) *rig {
	t.Helper()
	requireRig(t)
	r := &rig{t: t, bin: buildBinaries(t)}
	// A name no other test (or a run killed before its cleanup) uses.
	n := rand.IntN(200) + 20
	for i := 0; i < 50 && exists(fmt.Sprintf("/var/run/netns/inpltk%d", n), fmt.Sprintf("/sys/class/net/ith%d", n)); i++ {
		n = rand.IntN(200) + 20
	}
	r.netns, r.podIP = fmt.Sprintf("inpltk%d", n), fmt.Sprintf("10.251.%d.2", n)
	host := fmt.Sprintf("ith%d", n)
	var err error
	if r.dir, err = os.MkdirTemp("", "takeover-"); err != nil {
		t.Fatal(err)
	}
	r.runcRoot = filepath.Join(r.dir, "runc")
	r.socket = filepath.Join(r.dir, "agent.sock")
	r.cgroup = "/inplaced-takeover-test-" + strconv.Itoa(n)
	t.Cleanup(func() { r.cleanup(host) })
	r.ip("netns", "add", r.netns)
	r.ip("link", "add", host, "type", "veth", "peer", "name", "eth0", "netns", r.netns)
	r.ip("addr", "add", fmt.Sprintf("10.251.%d.1/30", n), "dev", host)
	r.ip("link", "set", host, "up")
	r.ip("-n", r.netns, "addr", "add", r.podIP+"/30", "dev", "eth0")
	r.ip("-n", r.netns, "link", "set", "eth0", "up")
	r.ip("-n", r.netns, "link", "set", "lo", "up")
	return r
}

func exists(paths ...string) bool {
	for _, p := range paths {
		if _, err := os.Lstat(p); err == nil {
			return true
		}
	}
	return false
}

func (r *rig) ip(args ...string) {
	r.t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		r.t.Fatalf("ip %v: %v: %s", args, err, out)
	}
}

// cleanup removes the containers (killing what is left), the namespace,
// the cgroups and the files, whatever state the test left them in.
func (r *rig) cleanup(host string) {
	if ents, err := os.ReadDir(r.runcRoot); err == nil {
		for _, e := range ents {
			_ = exec.Command("runc", "--root", r.runcRoot, "delete", "--force", e.Name()).Run()
		}
	}
	_ = exec.Command("ip", "link", "del", host).Run()
	_ = exec.Command("ip", "netns", "del", r.netns).Run()
	if dirs, _ := filepath.Glob("/sys/fs/cgroup/*" + r.cgroup); len(dirs) > 0 {
		for _, d := range dirs {
			_ = os.Remove(d)
		}
	}
	_ = os.Remove("/sys/fs/cgroup" + r.cgroup)
	if err := os.RemoveAll(r.dir); err != nil {
		r.t.Logf("cleanup: %v", err)
	}
}

// container is one runc container of the rig.
type container struct {
	r      *rig
	id     string
	bundle string
	pid    int
}

// probeDir is where the probe reads commands, inside the container.
const probeDir = "/ctl"

// spec is runc's default spec with the rig's namespace, cgroup, args,
// capabilities and seccomp profile (nil: none).
func (r *rig) spec(id string, args []string, caps []string, profile []byte) (*specs.Spec, error) {
	tmp, err := os.MkdirTemp(r.dir, "spec-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	cmd := exec.Command("runc", "spec")
	cmd.Dir = tmp
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("runc spec: %w: %s", err, out)
	}
	b, err := os.ReadFile(filepath.Join(tmp, "config.json"))
	if err != nil {
		return nil, err
	}
	var s specs.Spec
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, err
	}
	s.Process.Terminal, s.Process.Args, s.Hostname = false, args, id
	s.Process.Capabilities = &specs.LinuxCapabilities{Bounding: caps, Effective: caps, Permitted: caps}
	s.Root.Readonly = false
	s.Linux.CgroupsPath = r.cgroup + "/" + id
	for i, ns := range s.Linux.Namespaces {
		if ns.Type == specs.NetworkNamespace {
			s.Linux.Namespaces[i].Path = "/var/run/netns/" + r.netns
		}
	}
	if profile != nil {
		s.Linux.Seccomp = &specs.LinuxSeccomp{}
		if err := json.Unmarshal(profile, s.Linux.Seccomp); err != nil {
			return nil, fmt.Errorf("profile: %w", err)
		}
	}
	return &s, nil
}

// defaultCaps is runc's default set, CAP_NET_BIND_SERVICE included.
var defaultCaps = []string{"CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"}

// run creates and starts a container (runc create connects to the agent
// when the profile names it).
func (r *rig) run(id string, args, caps []string, profile []byte) *container {
	r.t.Helper()
	c := &container{r: r, id: id, bundle: filepath.Join(r.dir, id)}
	if err := c.makeBundle(args, caps, profile); err != nil {
		r.t.Fatalf("bundle %s: %v", id, err)
	}
	logf, err := os.Create(filepath.Join(c.bundle, "output.log"))
	if err != nil {
		r.t.Fatal(err)
	}
	defer logf.Close()
	pidFile := filepath.Join(c.bundle, "pid")
	create := exec.Command("runc", "--root", r.runcRoot, "create", "--bundle", c.bundle, "--pid-file", pidFile, id)
	create.Stdout, create.Stderr = logf, logf
	if err := create.Run(); err != nil {
		r.t.Fatalf("runc create %s: %v\n%s", id, err, c.output())
	}
	if out, err := exec.Command("runc", "--root", r.runcRoot, "start", id).CombinedOutput(); err != nil {
		r.t.Fatalf("runc start %s: %v: %s\n%s", id, err, out, c.output())
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		r.t.Fatal(err)
	}
	if c.pid, err = strconv.Atoi(strings.TrimSpace(string(b))); err != nil {
		r.t.Fatal(err)
	}
	return c
}

func (c *container) makeBundle(args, caps []string, profile []byte) error {
	rootfs := filepath.Join(c.bundle, "rootfs")
	for _, d := range []string{"bin", "tmp", strings.TrimPrefix(probeDir, "/")} {
		if err := os.MkdirAll(filepath.Join(rootfs, d), 0o755); err != nil {
			return err
		}
	}
	for dst, src := range map[string]string{"app-v1": c.r.bin.app1, "app-v2": c.r.bin.app2, "probe": c.r.bin.probe, "bin/busybox": "/bin/busybox"} {
		if err := copyFile(src, filepath.Join(rootfs, dst)); err != nil {
			return err
		}
	}
	s, err := c.r.spec(c.id, args, caps, profile)
	if err != nil {
		return err
	}
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(c.bundle, "config.json"), b, 0o644)
}

func copyFile(src, dst string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, 0o755)
}

func (c *container) output() string {
	b, _ := os.ReadFile(filepath.Join(c.bundle, "output.log"))
	return string(b)
}

// kill sends sig to the container's init.
func (c *container) kill(sig string) {
	c.r.t.Helper()
	if out, err := exec.Command("runc", "--root", c.r.runcRoot, "kill", c.id, sig).CombinedOutput(); err != nil {
		c.r.t.Fatalf("runc kill %s %s: %v: %s", c.id, sig, err, out)
	}
}

// waitExit waits until the init is gone or a zombie (which can stay one
// for a while before the host's init reaps it).
func (c *container) waitExit(timeout time.Duration) {
	c.r.t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", c.pid))
		if err != nil {
			return
		}
		if _, rest, ok := strings.Cut(string(b), ") "); ok && strings.HasPrefix(rest, "Z") {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	c.r.t.Fatalf("container %s (pid %d) still running after %s\n%s", c.id, c.pid, timeout, c.output())
}

// exec runs args in the container (runc exec: a process of its own, with
// a filter of its own when the container has a profile).
func (c *container) exec(args ...string) ([]byte, error) {
	return exec.Command("runc", append([]string{"--root", c.r.runcRoot, "exec", c.id}, args...)...).CombinedOutput()
}

var cmdSeq int

// probe asks the container's probe to run cmd and waits for the result.
func (c *container) probe(cmd command, timeout time.Duration) result {
	c.r.t.Helper()
	cmdSeq++
	id := strconv.Itoa(cmdSeq)
	dir := filepath.Join(c.bundle, "rootfs", probeDir)
	b, _ := json.Marshal(cmd)
	if err := os.WriteFile(filepath.Join(dir, ".cmd-"+id), b, 0o644); err != nil {
		c.r.t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, ".cmd-"+id), filepath.Join(dir, "cmd-"+id+".json")); err != nil {
		c.r.t.Fatal(err)
	}
	res := filepath.Join(dir, "res-"+id+".json")
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if b, err := os.ReadFile(res); err == nil {
			var r result
			if err := json.Unmarshal(b, &r); err != nil {
				c.r.t.Fatal(err)
			}
			return r
		}
		time.Sleep(5 * time.Millisecond)
	}
	c.r.t.Fatalf("probe %+v in %s: no result after %s\n%s", cmd, c.id, timeout, c.output())
	return result{}
}

// command and result are the probe's (testdata/probe).
type command struct {
	Op       string `json:"op"`
	Family   int    `json:"family"`
	Port     int    `json:"port"`
	N        int    `json:"n"`
	Blocking bool   `json:"blocking"`
	Keep     bool   `json:"keep"`
	Inherit  bool   `json:"inherit"`
	Path     string `json:"path"`
}

type result struct {
	OK    int     `json:"ok"`
	Errno int     `json:"errno"`
	Error string  `json:"error"`
	Ns    []int64 `json:"ns"`
	Inode uint64  `json:"inode"`
	Fd    int     `json:"fd"`
}

func (r result) errno() syscall.Errno { return syscall.Errno(r.Errno) }

// waitServing waits until GET /version on the pod's port answers want.
func (r *rig) waitServing(port int, want string, timeout time.Duration) {
	r.t.Helper()
	url := fmt.Sprintf("http://%s:%d/version", r.podIP, port)
	// A new connection each time: the processes sharing a socket take
	// turns at accepting, a kept-alive connection would stay with one.
	cl := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		resp, err := cl.Get(url)
		if err == nil {
			b := new(bytes.Buffer)
			_, _ = b.ReadFrom(resp.Body)
			resp.Body.Close()
			if last = strings.TrimSpace(b.String()); last == want {
				return
			}
		} else {
			last = err.Error()
		}
		time.Sleep(20 * time.Millisecond)
	}
	r.t.Fatalf("%s: want %q, last %q", url, want, last)
}

// socketInodes lists the inodes of the sockets a process holds.
func socketInodes(pid int) map[uint64]bool {
	out := map[uint64]bool{}
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		var st unix.Stat_t
		if unix.Stat(filepath.Join(dir, e.Name()), &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFSOCK {
			out[st.Ino] = true
		}
	}
	return out
}

// events collects an agent's events.
type events struct {
	mu  sync.Mutex
	all []Event
}

func (e *events) add(ev Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.all = append(e.all, ev)
}

func (e *events) snapshot() []Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]Event(nil), e.all...)
}

// wait returns the first event matching, waiting up to timeout.
func (e *events) wait(t *testing.T, what string, timeout time.Duration, match func(Event) bool) Event {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		for _, ev := range e.snapshot() {
			if match(ev) {
				return ev
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s event in %s; events: %s", what, timeout, describe(e.snapshot()))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func describe(evs []Event) string {
	var b strings.Builder
	for _, ev := range evs {
		fmt.Fprintf(&b, "\n  %s %s pid %d fd %d %s %s %v", ev.At.Format("15:04:05.000"), ev.Kind, ev.Pid, ev.Fd, ev.Addr, ev.Reason, ev.Err)
	}
	return b.String()
}

// startAgent starts an agent on the rig's socket, closed at cleanup.
func (r *rig) startAgent() (*Agent, *events) {
	r.t.Helper()
	return r.startAgentLogging(zaptest.NewLogger(r.t))
}

func (r *rig) startAgentLogging(log *zap.Logger) (*Agent, *events) {
	r.t.Helper()
	evs := &events{}
	a, err := Listen(Config{Socket: r.socket, OnEvent: evs.add, Logger: log})
	if err != nil {
		r.t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- a.Serve() }()
	r.t.Cleanup(func() {
		if err := a.Close(); err != nil {
			r.t.Errorf("agent close: %v", err)
		}
		if err := <-served; err != nil {
			r.t.Errorf("agent serve: %v", err)
		}
	})
	return a, evs
}

// profile is the new containers' profile: RuntimeDefault with the trap.
func (r *rig) profile(swap string, caps []string) []byte {
	r.t.Helper()
	b, err := Profile(RuntimeDefault(caps), r.socket, swap)
	if err != nil {
		r.t.Fatal(err)
	}
	return b
}
