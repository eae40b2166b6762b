// Package node boots a real modern node — Debian 12 under QEMU (TCG), systemd
// as PID 1, cgroup v2, containerd with SystemdCgroup = true and kubelet with
// the systemd cgroup driver — installs inplaced in it the way the README's
// "Install on a node" says, and runs the guest suites (test/node/guest, the
// cgroup v2 tests of pkg/resources) there. Their `go test -v` output comes
// back on a serial port and is printed here, prefixed "guest| "; a failed
// guest test fails TestNode.
//
// It runs only when INPLACED_NODE=1 (`make test-node`); it needs root, QEMU
// and the tools of hack/install-deps.sh, and skips without them (fails with
// CI=true). The guest image is built once by hack/vm/build-image.sh and
// cached; each boot runs on a throw-away qcow2 overlay. Nothing is mounted on
// the host: the payload reaches the guest over 9p, and QEMU, started here, is
// killed here if it is still running at the end.
//
// Environment: INPLACED_NODE_BACKENDS (default "2.4 1.6": one boot each),
// INPLACED_NODE_RUN (a -test.run pattern for the guest suites),
// INPLACED_NODE_LOG_DIR (where the guest's output and console are kept;
// default a temp dir), INPLACED_NODE_TIMEOUT (per boot, default 20m).
package node

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/inplaced/inplaced/test/harness"
)

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

	start := time.Now()
	image := buildImage(t, root)
	t.Logf("guest image %s ready in %s", image, time.Since(start).Round(time.Second))
	_, err = exec.LookPath("qemu-system-x86_64")
	harness.Require(t, "qemu-system-x86_64", err == nil, "apt-get install qemu-system-x86 (hack/vm/build-image.sh does)")

	start = time.Now()
	payload := makePayload(t, root)
	t.Logf("payload (inplaced, guest suites, install files) in %s", time.Since(start).Round(time.Second))

	logDir := os.Getenv("INPLACED_NODE_LOG_DIR")
	if logDir == "" {
		logDir = t.TempDir()
	}
	timeout := 20 * time.Minute
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
			boot(t, image, payload, logDir, b, timeout)
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
//	                     config.yaml, inplaced.service, the kubelet drop-in and
//	                     config snippet, crictl.yaml
//	bin/                 guest.test and resources.test (go test -c), app-v1/v2 (test/images/app)
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

var (
	suiteRe = regexp.MustCompile(`^\[node\] suite (\S+) exit (\d+)`)
	bootRe  = regexp.MustCompile(`^\[node\] booted.*guest uptime ([0-9.]+)s`)
)

// boot runs the guest once with containerd backend and fails t for every
// guest suite that failed (or never reported).
func boot(t *testing.T, image, payload, logDir, backend string, timeout time.Duration) {
	env := fmt.Sprintf("BACKEND=%s\nRUN='%s'\n", backend, runPattern(backend))
	if err := os.WriteFile(filepath.Join(payload, "env"), []byte(env), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(payload, "out")
	_ = os.RemoveAll(out)
	if err := os.Mkdir(out, 0o777); err != nil {
		t.Fatal(err)
	}
	overlay := filepath.Join(t.TempDir(), "root.qcow2")
	if b, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", "-b", filepath.Join(image, "root.img"), "-F", "raw", overlay).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img create: %v\n%s", err, b)
	}
	console := filepath.Join(logDir, "node-"+backend+"-console.log")
	guestLog, err := os.Create(filepath.Join(logDir, "node-"+backend+".log"))
	if err != nil {
		t.Fatal(err)
	}
	defer guestLog.Close()

	cmd := exec.Command("qemu-system-x86_64",
		"-accel", "tcg,thread=multi", "-cpu", "max", "-smp", "2", "-m", "3072",
		"-display", "none", "-monitor", "none", "-no-reboot", "-nic", "none",
		"-kernel", filepath.Join(image, "vmlinuz"), "-initrd", filepath.Join(image, "initrd.img"),
		"-append", "console=ttyS0 root=/dev/vda rw inplaced.node=1 loglevel=4 systemd.show_status=error",
		"-drive", "file="+overlay+",if=virtio,format=qcow2",
		"-virtfs", "local,path="+payload+",mount_tag=payload,security_model=passthrough,id=payload",
		"-serial", "file:"+console, // ttyS0: kernel and systemd
		"-serial", "stdio", // ttyS1: run.sh and the suites
	)
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
	lines := make(chan string)
	go func() {
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
	}()
	defer func() {
		// QEMU is ours: whatever happened, it does not outlive the test.
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			<-exited
		}
	}()
	go func() { exited <- cmd.Wait() }()

	results := map[string]string{}
	var done bool
	deadline := time.After(timeout)
	for lines != nil {
		select {
		case line, ok := <-lines:
			if !ok {
				lines = nil
				continue
			}
			fmt.Fprintln(guestLog, line)
			fmt.Printf("guest| %s\n", line)
			if m := suiteRe.FindStringSubmatch(line); m != nil {
				results[m[1]] = m[2]
			}
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
				t.Errorf("guest did not finish within %s: killing QEMU; console: %s", timeout, console)
			}
			_ = cmd.Process.Kill()
			go func(c <-chan string) {
				for range c { // let the reader reach EOF
				}
			}(lines)
			lines = nil
		}
	}
	err = <-exited
	exited <- err // for the deferred check
	t.Logf("guest ran %s (QEMU exit: %v); output in %s, console in %s", time.Since(start).Round(time.Second), err, guestLog.Name(), console)
	if len(results) == 0 || !done {
		t.Errorf("the guest reported no result (done=%v); last console lines:\n%s", done, tail(console, 40))
	}
	for suite, code := range results {
		if code != "0" {
			t.Errorf("guest suite %s exited %s", suite, code)
		} else {
			t.Logf("guest suite %s passed", suite)
		}
	}
	if b, err := os.ReadFile(filepath.Join(out, "security.txt")); err == nil {
		t.Logf("systemd-analyze security inplaced (containerd %s):\n%s", backend, tailString(string(b), 3))
		_ = os.WriteFile(filepath.Join(logDir, "node-security.txt"), b, 0o644)
	}
}

// runPattern is the -test.run pattern of the guest suites: all of them on
// both backends unless INPLACED_NODE_RUN says otherwise.
func runPattern(string) string { return os.Getenv("INPLACED_NODE_RUN") }

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
