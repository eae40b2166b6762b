// Package node boots a real modern node — Debian 12 under QEMU (TCG), systemd
// as PID 1, cgroup v2, containerd with SystemdCgroup = true and kubelet with
// the systemd cgroup driver — installs inplaced in it the way the README's
// "Install on a node" says, and runs the guest suites (test/node/guest, the
// cgroup v2 tests of pkg/resources) there. Their `go test -v` output comes
// back on a serial port and is printed here, prefixed "guest| "; a failed
// guest test fails TestNode.
//
// The guest's kubelet is a registered Node of a real control plane (etcd,
// kube-apiserver, kube-controller-manager and kube-scheduler v1.37.2,
// harness.StartControlPlane and StartControllers) that this test starts on
// the host's loopback for each boot. The fleet suite (TestFleet: the chart's
// install, upgrade and uninstall, with helm and two image tags in the
// payload) runs first, on kubelet still on containerd; run.sh installs
// inplaced by hand for the other suites after it. The guest's only network is QEMU user
// networking with restrict=on: no route to the host or the outside, except
// one forward, 10.0.2.100:6443 in the guest to the API server's port, relayed
// by this test binary itself (TestMain, INPLACED_NODE_FORWARD). The node's and
// an admin kubeconfig reach the guest in the payload.
//
// Every suite's output is checked, not only its exit code: each top-level
// test the suite's binary lists for its pattern must report "--- PASS"; a
// skip (a top-level test or a subtest) fails TestNode under CI=true, which is
// passed into the guest, where harness.Require fails instead of skipping.
//
// It runs only when INPLACED_NODE=1 (`make test-node`); it needs root, QEMU
// and the tools of hack/install-deps.sh, and skips without them (fails with
// CI=true). The guest image is built once by hack/vm/build-image.sh and
// cached; each boot runs on a throw-away qcow2 overlay. Nothing is mounted on
// the host: the payload reaches the guest over 9p, and QEMU, started here, is
// killed here if it is still running at the end (the relays end with it).
//
// Environment: INPLACED_NODE_BACKENDS (default "2.4 1.6": one boot each),
// INPLACED_NODE_RUN (a -test.run pattern for the guest suites),
// INPLACED_NODE_LOG_DIR (where the guest's output and console are kept;
// default a temp dir), INPLACED_NODE_TIMEOUT (per boot, default 30m).
package node

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/inplaced/inplaced/test/harness"
)

const (
	// guestAPI is where the guest reaches the API server: QEMU's user
	// network forwards it (guestfwd) to a relay on the host.
	guestAPI = "10.0.2.100:6443"
	// guestK3s is where the guest reaches the k3s server of the k3s fleet
	// suite, at the port the server listens on here.
	guestK3s = "10.0.2.100"
	// apiServerName is a DNS SAN of the API server's serving certificate
	// (harness.StartControlPlane), the kubeconfigs' tls-server-name: the
	// guest dials an address the certificate does not name.
	apiServerName = "kubernetes"
	// nodeName is the guest kubelet's --hostname-override: its Node.
	nodeName = "node"
	// resourcesRun is the pkg/resources tests run in the guest: the real
	// cgroup v2 files and systemd driver.
	resourcesRun = "^(TestRealCgroupV2|TestRealSystemdDriver)$"
	// forwardEnv makes this test binary a one-connection relay (TestMain):
	// QEMU runs it for each guest connection to guestAPI, stdin/stdout the
	// connection, and it dials the address in the file the variable names.
	forwardEnv = "INPLACED_NODE_FORWARD"
)

func TestMain(m *testing.M) {
	if f := os.Getenv(forwardEnv); f != "" {
		os.Exit(forward(f))
	}
	os.Exit(m.Run())
}

// forward relays the connection on fd 0 (QEMU's end of a guest TCP
// connection) to the address in file, both ways. It writes nothing: stdout
// and stderr are the connection too. It ends when both directions have; when
// one has, the other gets 30 s (QEMU starts it through glib's intermediate
// child, so it cannot tie its life to QEMU's; when QEMU exits, its side of
// the connection ends and so does this relay).
func forward(file string) int {
	guest, err := net.FileConn(os.NewFile(0, "guest"))
	if err != nil {
		return 1
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return 1
	}
	api, err := net.DialTimeout("tcp", strings.TrimSpace(string(b)), 10*time.Second)
	if err != nil {
		return 1
	}
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		if c, ok := dst.(interface{ CloseWrite() error }); ok {
			_ = c.CloseWrite()
		} else {
			_ = dst.Close()
		}
		done <- struct{}{}
	}
	go pipe(api, guest)
	go pipe(guest, api)
	<-done
	select {
	case <-done:
	case <-time.After(30 * time.Second):
	}
	return 0
}

func TestNode(t *testing.T) {
	if os.Getenv("INPLACED_NODE") != "1" {
		t.Skip("the node guest runs with INPLACED_NODE=1 (make test-node)")
	}
	harness.RequireRoot(t)
	_, err := os.Stat("/dev/kvm") // not used (TCG); only a hint in the log
	t.Logf("QEMU TCG (software emulation; /dev/kvm present: %v, but KVM does not boot a stock kernel on these machines)", err == nil)
	root, err := harness.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	harness.Require(t, "hack/install-deps.sh tools", fileExists(harness.KubeletPath()) && fileExists(harness.CrictlPath()),
		"run INPLACED_WITH_KUBELET=1 hack/install-deps.sh")
	harness.ControlPlanePrerequisites(t)
	harness.ControllersPrerequisites(t)

	start := time.Now()
	image := buildImage(t, root)
	t.Logf("guest image %s ready in %s", image, time.Since(start).Round(time.Second))
	_, err = exec.LookPath("qemu-system-x86_64")
	harness.Require(t, "qemu-system-x86_64", err == nil, "apt-get install qemu-system-x86 (hack/vm/build-image.sh does)")

	start = time.Now()
	payload := makePayload(t, root)
	t.Logf("payload (inplaced, guest suites, install files) in %s", time.Since(start).Round(time.Second))
	// What each suite must report PASS for: its binary's own list.
	guestTests, fleet, k3s := splitFleet(listTests(t, filepath.Join(payload, "bin", "guest.test"), listPattern(runPattern())))
	resourcesTests := listTests(t, filepath.Join(payload, "bin", "resources.test"), resourcesRun)
	t.Logf("expected to pass in the guest: %s; %s (fleet suites first: kubeadm %v, k3s %v)", strings.Join(resourcesTests, " "), strings.Join(guestTests, " "), fleet, k3s)
	if fleet || k3s {
		start = time.Now()
		fleetPayload(t, root, filepath.Join(payload, "fleet"))
		t.Logf("fleet payload (helm, the chart, images %v) in %s", fleetTags, time.Since(start).Round(time.Second))
	}
	if k3s {
		k3sPayload(t, filepath.Join(payload, "k3s"))
	}

	logDir := os.Getenv("INPLACED_NODE_LOG_DIR")
	if logDir == "" {
		logDir = t.TempDir()
	}
	timeout := 30 * time.Minute
	if s := os.Getenv("INPLACED_NODE_TIMEOUT"); s != "" {
		if timeout, err = time.ParseDuration(s); err != nil {
			t.Fatalf("INPLACED_NODE_TIMEOUT: %v", err)
		}
	}
	backends := strings.Fields(os.Getenv("INPLACED_NODE_BACKENDS"))
	if len(backends) == 0 {
		backends = []string{"2.4", "1.6"}
	}
	for _, b := range backends {
		t.Run("containerd-"+b, func(t *testing.T) {
			expect := []expectedSuite{{name: "resources-v2", tests: resourcesTests}}
			if fleet {
				expect = append(expect, expectedSuite{name: "fleet-containerd-" + b, tests: []string{fleetTest}})
			}
			if k3s {
				expect = append(expect, expectedSuite{name: "fleet-k3s-containerd-" + b, tests: []string{fleetK3sTest}})
			}
			if len(guestTests) > 0 {
				expect = append(expect, expectedSuite{name: "guest-containerd-" + b, tests: guestTests})
			}
			// A guest whose heartbeat stops has stopped as a whole (the
			// emulator or its kernel, not a test: a hung test times out
			// inside the guest and says so). That is retried once, on a
			// fresh overlay and control plane; a second stall fails.
			if !boot(t, image, payload, logDir, b, timeout, expect) {
				return
			}
			t.Logf("containerd %s: the guest stalled (above: its console and heartbeat); booting it once more", b)
			if boot(t, image, payload, logDir, b, timeout, expect) {
				t.Errorf("containerd %s: the guest stalled twice", b)
			}
		})
	}
}

// buildImage runs hack/vm/build-image.sh (cached) and returns the image dir.
func buildImage(t *testing.T, root string) string {
	t.Helper()
	cmd := exec.Command(filepath.Join(root, "hack/vm/build-image.sh"))
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("hack/vm/build-image.sh: %v", err)
	}
	dir := strings.TrimSpace(lastLine(string(out)))
	for _, f := range []string{"root.img", "vmlinuz", "initrd.img"} {
		if !fileExists(filepath.Join(dir, f)) {
			t.Fatalf("image dir %q has no %s", dir, f)
		}
	}
	return dir
}

// makePayload assembles what the guest gets on /mnt/payload:
//
//	run.sh, fixture/     the guest's script and node configuration (test/node/guest/fixture)
//	install/             what the README installs: the binaries of make build,
//	                     config.yaml, inplaced.service and .socket, the kubelet drop-in and
//	                     config snippet, crictl.yaml
//	bin/                 guest.test and resources.test (go test -c), app-v1/v2 (test/images/app)
//	env                  written per boot: BACKEND, RUN, RESOURCES_RUN, CI
//	kube/                written per boot, once the control plane runs:
//	                     kubelet.conf, admin.conf, then ready
//	out/                 written by the guest
func makePayload(t *testing.T, root string) string {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{"fixture", "install", "bin", "out"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	fixture := filepath.Join(root, "test/node/guest/fixture")
	entries, err := os.ReadDir(fixture)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		copyFile(t, filepath.Join(fixture, e.Name()), filepath.Join(dir, "fixture", e.Name()))
	}
	copyFile(t, filepath.Join(fixture, "run.sh"), filepath.Join(dir, "run.sh"))
	for src, dst := range map[string]string{
		"deploy/inplaced/config.yaml":        "config.yaml",
		"systemd/inplaced.service":           "inplaced.service",
		"systemd/inplaced.socket":            "inplaced.socket",
		"deploy/kubelet/10-inplaced.conf":    "10-inplaced.conf",
		"deploy/kubelet/kubelet-config.yaml": "kubelet-config.yaml",
		"deploy/crictl/crictl.yaml":          "crictl.yaml",
	} {
		copyFile(t, filepath.Join(root, src), filepath.Join(dir, "install", dst))
	}

	// The binaries of `make build` (INPLACED_BIN, exported by the Makefile),
	// or built here the same way.
	bin := os.Getenv("INPLACED_BIN")
	for _, b := range []string{"inplaced", "inplacectl"} {
		if bin != "" && fileExists(filepath.Join(bin, b)) {
			copyFile(t, filepath.Join(bin, b), filepath.Join(dir, "install", b))
			continue
		}
		goCmd(t, root, "build", "-o", filepath.Join(dir, "install", b), "./cmd/"+b)
	}
	goCmd(t, root, "test", "-c", "-o", filepath.Join(dir, "bin", "guest.test"), "./test/node/guest")
	goCmd(t, root, "test", "-c", "-o", filepath.Join(dir, "bin", "resources.test"), "./pkg/resources")
	for _, v := range []string{"v1", "v2"} {
		goCmd(t, root, "build", "-trimpath", "-ldflags", "-s -w -X main.version="+v, "-o", filepath.Join(dir, "bin", "app-"+v), "./test/images/app")
	}
	return dir
}

// listTests is what `bin -test.list pattern` lists: the top-level tests a
// suite run with that pattern must report PASS for.
func listTests(t *testing.T, bin, pattern string) []string {
	t.Helper()
	out, err := exec.Command(bin, "-test.list", pattern).Output()
	if err != nil {
		t.Fatalf("%s -test.list %q: %v", filepath.Base(bin), pattern, err)
	}
	var tests []string
	for _, l := range strings.Fields(string(out)) {
		if strings.HasPrefix(l, "Test") {
			tests = append(tests, l)
		}
	}
	if len(tests) == 0 {
		t.Fatalf("%s -test.list %q lists no test", filepath.Base(bin), pattern)
	}
	return tests
}

// listPattern is the top-level part of a -test.run pattern ("." for all).
func listPattern(run string) string {
	if run == "" {
		return "."
	}
	top, _, _ := strings.Cut(run, "/")
	return top
}

var (
	suiteStartRe = regexp.MustCompile(`^\[node\] suite (\S+) start`)
	suiteRe      = regexp.MustCompile(`^\[node\] suite (\S+) exit (\d+)`)
	bootRe       = regexp.MustCompile(`^\[node\] booted.*guest uptime ([0-9.]+)s`)
	passRe       = regexp.MustCompile(`^--- PASS: (\S+)`)
	skipRe       = regexp.MustCompile(`^\s*--- SKIP: (\S+)`)
	failRe       = regexp.MustCompile(`^\s*--- FAIL: (\S+)`)
)

// expectedSuite is a guest suite and the top-level tests it must pass.
type expectedSuite struct {
	name  string
	tests []string
}

// suiteResult is what a guest suite reported: its exit code, and from its
// `go test -v` lines the top-level tests that passed and every test or
// subtest that skipped or failed.
type suiteResult struct {
	exit            string
	passed          map[string]bool
	skipped, failed []string
}

// boot runs the guest once with containerd backend, its kubelet registered
// to a control plane started here meanwhile, and fails t for every guest
// suite that failed, skipped (under CI=true) or did not report. It reports a
// stall instead, and judges nothing, when the guest's heartbeat (a line on
// ttyS2 every heartbeatEvery, from run.sh) stopped for stallAfter: then the
// guest as a whole stopped running, and its suites' silence says nothing
// about them.
func boot(t *testing.T, image, payload, logDir, backend string, timeout time.Duration, expect []expectedSuite) (stalled bool) {
	fleet := slices.ContainsFunc(expect, func(e expectedSuite) bool { return strings.HasPrefix(e.name, "fleet-containerd-") })
	k3s := slices.ContainsFunc(expect, func(e expectedSuite) bool { return strings.HasPrefix(e.name, "fleet-k3s-") })
	env := fmt.Sprintf("BACKEND=%s\nRUN='%s'\nRESOURCES_RUN='%s'\nCI='%s'\nFLEET=%v\nFLEET_RUN='^%s$'\nK3S=%v\nK3S_RUN='^%s$'\nFLEET_SKIP='^(%s|%s)$'\n",
		backend, runPattern(), resourcesRun, os.Getenv("CI"), fleet, fleetTest, k3s, fleetK3sTest, fleetTest, fleetK3sTest)
	if err := os.WriteFile(filepath.Join(payload, "env"), []byte(env), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(payload, "out")
	kube := filepath.Join(payload, "kube")
	for _, d := range []string{out, kube} {
		_ = os.RemoveAll(d)
		if err := os.Mkdir(d, 0o777); err != nil {
			t.Fatal(err)
		}
	}
	overlay := filepath.Join(t.TempDir(), "root.qcow2")
	if b, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", "-b", filepath.Join(image, "root.img"), "-F", "raw", overlay).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img create: %v\n%s", err, b)
	}
	console := filepath.Join(logDir, "node-"+backend+"-console.log")
	heartbeat := filepath.Join(logDir, "node-"+backend+"-heartbeat.log")
	guestLog, err := os.Create(filepath.Join(logDir, "node-"+backend+".log"))
	if err != nil {
		t.Fatal(err)
	}
	defer guestLog.Close()

	// The guest's one way out: guestAPI, relayed by this binary to the API
	// server's address, written to fwdFile once it is known.
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	fwdFile := filepath.Join(t.TempDir(), "apiserver")
	netdev := "user,id=net0,restrict=on,guestfwd=tcp:" + guestAPI + "-cmd:" + strings.ReplaceAll(shellQuote(self), ",", ",,")
	// The k3s agent's way to its server: guestK3s:port, the same port on
	// both sides (the server advertises it to its agents).
	k3sPort := 0
	k3sFwdFile := filepath.Join(t.TempDir(), "k3s")
	if k3s {
		if k3sPort, err = harness.FreePortPair(); err != nil {
			t.Fatal(err)
		}
		relay := shellQuote("/usr/bin/env") + " " + shellQuote(forwardEnv+"="+k3sFwdFile) + " " + shellQuote(self)
		netdev += ",guestfwd=tcp:" + guestK3s + ":" + strconv.Itoa(k3sPort) + "-cmd:" + strings.ReplaceAll(relay, ",", ",,")
	}
	cmd := exec.Command("qemu-system-x86_64",
		"-accel", "tcg,thread=multi", "-cpu", "max", "-smp", "2", "-m", "3072",
		"-display", "none", "-monitor", "none", "-no-reboot",
		"-netdev", netdev, "-device", "virtio-net-pci,netdev=net0,romfile=",
		"-kernel", filepath.Join(image, "vmlinuz"), "-initrd", filepath.Join(image, "initrd.img"),
		"-append", "console=ttyS0 root=/dev/vda rw inplaced.node=1 loglevel=4 systemd.show_status=error",
		"-drive", "file="+overlay+",if=virtio,format=qcow2",
		"-virtfs", "local,path="+payload+",mount_tag=payload,security_model=passthrough,id=payload",
		"-serial", "file:"+console, // ttyS0: kernel and systemd
		"-serial", "stdio", // ttyS1: run.sh and the suites
		"-serial", "file:"+heartbeat, // ttyS2: run.sh's heartbeat
	)
	cmd.Env = append(os.Environ(), forwardEnv+"="+fwdFile)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatalf("start qemu: %v", err)
	}
	exited := make(chan error, 1)
	lines := make(chan string, 1024)
	go func(lines chan<- string) { // its own variable: the loop below sets lines to nil
		r := bufio.NewReader(stdout)
		for {
			line, err := r.ReadString('\n')
			if line != "" {
				lines <- strings.TrimRight(line, "\r\n")
			}
			if err != nil {
				close(lines)
				return
			}
		}
	}(lines)
	defer func() {
		// QEMU is ours: whatever happened, it does not outlive the test.
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			<-exited
		}
	}()
	go func() { exited <- cmd.Wait() }()

	// While the guest boots: the control plane, and what the guest needs of
	// it (run.sh waits for kube/ready). Its cleanup runs after QEMU's kill.
	cp := harness.StartControlPlane(t)
	if err := os.WriteFile(fwdFile, []byte("127.0.0.1:"+strconv.Itoa(cp.APIServerPort)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	guestKubeconfig(t, cp.NodeKubeconfig(t, nodeName), filepath.Join(kube, "kubelet.conf"))
	guestKubeconfig(t, cp.AdminKubeconfig, filepath.Join(kube, "admin.conf"))
	if err := os.WriteFile(filepath.Join(kube, "ready"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("control plane for the guest up %s after QEMU's start: the guest reaches %s at %s", time.Since(start).Round(time.Second), cp.URL, guestAPI)
	// The DaemonSet and the Jobs of the fleet suite are rolled out by the
	// real controllers; they start while the guest boots.
	ctl := cp.StartControllers(t)
	if err := ctl.WaitHealthy(2 * time.Minute); err != nil {
		t.Fatalf("kube-controller-manager, kube-scheduler: %v\n%s", err, ctl.LogTails(30))
	}
	t.Logf("kube-controller-manager and kube-scheduler healthy %s after QEMU's start", time.Since(start).Round(time.Second))
	if k3s {
		k3sControlPlane(t, kube, k3sFwdFile, k3sPort)
		t.Logf("k3s server (no agent) for the guest's k3s-agent up %s after QEMU's start", time.Since(start).Round(time.Second))
	}

	results := suiteParser{}
	var done bool
	deadline := time.After(timeout)
	beat := newHeartbeatWatch(heartbeat, time.Now())
	tick := time.NewTicker(heartbeatEvery)
	defer tick.Stop()
	kill := func() {
		_ = cmd.Process.Kill()
		go func(c <-chan string) {
			for range c { // let the reader reach EOF
			}
		}(lines)
		lines = nil
	}
	for lines != nil {
		select {
		case now := <-tick.C:
			if done || !beat.stalled(now) {
				continue
			}
			stalled = true
			t.Logf("the guest's heartbeat stopped %s ago (after %s): killing QEMU\nlast heartbeats:\n%s\nlast console lines (%s):\n%s",
				now.Sub(beat.last).Round(time.Second), time.Since(start).Round(time.Second), tail(heartbeat, 5), console, tail(console, 40))
			kill()
		case line, ok := <-lines:
			if !ok {
				lines = nil
				continue
			}
			fmt.Fprintln(guestLog, line)
			fmt.Printf("guest| %s\n", line)
			results.line(line)
			if m := bootRe.FindStringSubmatch(line); m != nil {
				t.Logf("guest booted: run.sh started %s after QEMU (guest uptime %ss)", time.Since(start).Round(time.Second), m[1])
			}
			if strings.HasPrefix(line, "[node] done") && !done {
				done = true
				// The guest powers itself off now; if it hangs on the way
				// down, that is no failure of the suites.
				deadline = time.After(90 * time.Second)
			}
		case <-deadline:
			if done {
				t.Logf("the guest did not power off within 90 s of its last suite: killing QEMU")
			} else {
				t.Errorf("guest did not finish within %s: killing QEMU; console: %s; last heartbeats:\n%s", timeout, console, tail(heartbeat, 5))
			}
			kill()
		}
	}
	err = <-exited
	exited <- err // for the deferred check
	t.Logf("guest ran %s (QEMU exit: %v); output in %s, console in %s", time.Since(start).Round(time.Second), err, guestLog.Name(), console)
	if stalled {
		return true
	}
	if len(results.suites) == 0 || !done {
		t.Errorf("the guest reported no result (done=%v); last console lines:\n%s", done, tail(console, 40))
	}
	errs, logs := judgeSuites(results.suites, expect, harness.CI())
	for _, l := range logs {
		t.Log(l)
	}
	for _, e := range errs {
		t.Error(e)
	}
	if b, err := os.ReadFile(filepath.Join(out, "security.txt")); err == nil {
		t.Logf("systemd-analyze security inplaced (containerd %s):\n%s", backend, tailString(string(b), 3))
		_ = os.WriteFile(filepath.Join(logDir, "node-security.txt"), b, 0o644)
	}
	checkNode(t, cp, backend)
	return false
}

const (
	// heartbeatEvery is how often run.sh writes its heartbeat (keep equal
	// to its sleep) and how often the host looks.
	heartbeatEvery = 10 * time.Second
	// stallAfter without a new heartbeat is a stalled guest: many times
	// the period, for a guest emulated (TCG) on a loaded machine. The first
	// heartbeat gets as long again on top, for the boot.
	stallAfter = 2 * time.Minute
)

// heartbeatWatch follows the size of the heartbeat file: it grows by a line
// every heartbeatEvery while the guest runs.
type heartbeatWatch struct {
	path string
	size int64
	last time.Time // when it last grew (or the boot started, with a boot's grace)
}

func newHeartbeatWatch(path string, start time.Time) *heartbeatWatch {
	return &heartbeatWatch{path: path, last: start.Add(stallAfter)}
}

// stalled reports whether the file has not grown for stallAfter by now.
func (w *heartbeatWatch) stalled(now time.Time) bool {
	if fi, err := os.Stat(w.path); err == nil && fi.Size() != w.size {
		w.size, w.last = fi.Size(), now
		return false
	}
	return now.Sub(w.last) > stallAfter
}

// suiteParser collects the suites' results from the guest's output lines.
type suiteParser struct {
	suites map[string]*suiteResult
	cur    *suiteResult
}

func (p *suiteParser) line(line string) {
	if p.suites == nil {
		p.suites = map[string]*suiteResult{}
	}
	if m := suiteStartRe.FindStringSubmatch(line); m != nil {
		p.cur = &suiteResult{passed: map[string]bool{}}
		p.suites[m[1]] = p.cur
		return
	}
	if m := suiteRe.FindStringSubmatch(line); m != nil {
		if p.suites[m[1]] == nil {
			p.suites[m[1]] = &suiteResult{passed: map[string]bool{}}
		}
		p.suites[m[1]].exit = m[2]
		p.cur = nil
		return
	}
	if p.cur == nil {
		return
	}
	if m := passRe.FindStringSubmatch(line); m != nil {
		p.cur.passed[m[1]] = true
	}
	if m := skipRe.FindStringSubmatch(line); m != nil {
		p.cur.skipped = append(p.cur.skipped, m[1])
	}
	if m := failRe.FindStringSubmatch(line); m != nil {
		p.cur.failed = append(p.cur.failed, m[1])
	}
}

// judgeSuites returns an error for a suite that did not report, exited
// non-zero, or did not report PASS for one of its expected top-level tests,
// for any other guest step that failed, and for each skip when ci (a skip is
// only logged otherwise).
func judgeSuites(results map[string]*suiteResult, expect []expectedSuite, ci bool) (errs, logs []string) {
	names := slices.Sorted(maps.Keys(results))
	for _, name := range names {
		if r := results[name]; r.exit != "0" && !slices.ContainsFunc(expect, func(e expectedSuite) bool { return e.name == name }) {
			errs = append(errs, fmt.Sprintf("guest step %s exited %q", name, r.exit))
		}
	}
	for _, e := range expect {
		r := results[e.name]
		if r == nil {
			errs = append(errs, fmt.Sprintf("guest suite %s did not report", e.name))
			continue
		}
		if r.exit != "0" {
			errs = append(errs, fmt.Sprintf("guest suite %s exited %q (failed: %s)", e.name, r.exit, strings.Join(r.failed, " ")))
		}
		var passed []string
		for _, test := range e.tests {
			switch {
			case r.passed[test]:
				passed = append(passed, test)
			case slices.Contains(r.skipped, test):
				// below: a failure under CI, logged otherwise
			default:
				errs = append(errs, fmt.Sprintf("guest suite %s: %s did not report PASS", e.name, test))
			}
		}
		for _, s := range r.skipped {
			if ci {
				errs = append(errs, fmt.Sprintf("guest suite %s: %s skipped (CI=true: a skip in the guest is a failure)", e.name, s))
			} else {
				logs = append(logs, fmt.Sprintf("guest suite %s: %s skipped", e.name, s))
			}
		}
		if len(passed) == len(e.tests) {
			logs = append(logs, fmt.Sprintf("guest suite %s passed: %s", e.name, strings.Join(passed, " ")))
		}
	}
	return errs, logs
}

// checkNode looks at the guest's Node through the API from the host: it
// registered, with the kubelet and the containerd of this boot.
func checkNode(t *testing.T, cp *harness.ControlPlane, backend string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n, err := cp.Admin.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		t.Errorf("the guest's Node %q in the API: %v", nodeName, err)
		return
	}
	i := n.Status.NodeInfo
	t.Logf("Node %s (registered %s): kubelet %s, runtime %s, %s, kernel %s, addresses %v", n.Name,
		n.CreationTimestamp.Format(time.TimeOnly), i.KubeletVersion, i.ContainerRuntimeVersion, i.OSImage, i.KernelVersion, n.Status.Addresses)
	if !strings.HasPrefix(strings.TrimPrefix(i.ContainerRuntimeVersion, "containerd://v"), backend+".") &&
		!strings.HasPrefix(strings.TrimPrefix(i.ContainerRuntimeVersion, "containerd://"), backend+".") {
		t.Errorf("Node %s reports runtime %q: not the containerd %s this boot is for", n.Name, i.ContainerRuntimeVersion, backend)
	}
}

// guestKubeconfig writes the kubeconfig at src for the guest to dst: the
// server is guestAPI, verified as apiServerName.
func guestKubeconfig(t *testing.T, src, dst string) {
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cfg.Clusters {
		c.Server = "https://" + guestAPI
		c.TLSServerName = apiServerName
	}
	if err := clientcmd.WriteToFile(*cfg, dst); err != nil {
		t.Fatal(err)
	}
}

// k3sControlPlane starts the k3s server the guest's k3s-agent joins, points
// the guest's forward at it and gives the guest what it needs in kube/:
// k3s-server (the URL), k3s-token, k3s-admin.conf (the admin kubeconfig at
// the guest's address), then k3s-ready.
func k3sControlPlane(t *testing.T, kube, fwdFile string, port int) {
	t.Helper()
	k := harness.StartK3sControlPlane(t, guestK3s, port)
	if err := os.WriteFile(fwdFile, []byte("127.0.0.1:"+strconv.Itoa(port)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	url := "https://" + guestK3s + ":" + strconv.Itoa(port)
	cfg, err := clientcmd.LoadFromFile(k.AdminKubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cfg.Clusters {
		c.Server = url
	}
	if err := clientcmd.WriteToFile(*cfg, filepath.Join(kube, "k3s-admin.conf")); err != nil {
		t.Fatal(err)
	}
	// k3s-ready last: run.sh starts k3s-agent once it is there.
	for _, f := range [][2]string{{"k3s-server", url + "\n"}, {"k3s-token", k.Token + "\n"}, {"k3s-ready", ""}} {
		if err := os.WriteFile(filepath.Join(kube, f[0]), []byte(f[1]), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// shellQuote quotes s for a POSIX shell when it needs it: libslirp splits a
// guestfwd command with g_shell_parse_argv (older versions: at spaces).
func shellQuote(s string) string {
	if regexp.MustCompile(`^[A-Za-z0-9/._+-]+$`).MatchString(s) {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// runPattern is the -test.run pattern of the guest suite: all of it on both
// backends unless INPLACED_NODE_RUN says otherwise.
func runPattern() string { return os.Getenv("INPLACED_NODE_RUN") }

func goCmd(t *testing.T, root string, args ...string) {
	t.Helper()
	cmd := exec.Command("go", args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		t.Fatal(err)
	}
	outF, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, fi.Mode().Perm())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(outF, in); err != nil {
		t.Fatal(err)
	}
	if err := outF.Close(); err != nil {
		t.Fatal(err)
	}
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

func lastLine(s string) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	return l[len(l)-1]
}

func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	return tailString(string(b), n)
}

func tailString(s string, n int) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}
