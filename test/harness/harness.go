// Package harness runs a real CRI stack for inplaced's end-to-end tests,
// benchmarks and conformance runs: an in-process OCI registry on loopback with
// test images built from busybox-static and test/images/app, and private
// containerd instances (Debian's 1.6 and 2.4 from the Go module proxy), each with
// its own root, state, socket, CNI bridge and subnet; a real kubelet, standalone
// or registered as a Node to a real control plane (etcd and kube-apiserver on
// loopback, StartControlPlane).
//
// Everything a helper starts is stopped and removed through tb.Cleanup, and only
// what it started: processes are found by the instance's own directory in their
// command line (and their descendants), mounts by that directory in
// /proc/self/mountinfo, the bridge by its per-instance name.
//
// Tools come from hack/install-deps.sh (see ToolsDir). Without root or without
// the tools the helpers skip the test; with CI=true they fail it instead.
package harness

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Pinned versions of the tools installed by hack/install-deps.sh.
const (
	ContainerdVersion = "v2.4.2"
	CriToolsVersion   = "v1.37.0"
	KubeletVersion    = "v1.37.2"
	// KubeAPIServerVersion and EtcdVersion are built by
	// hack/build-control-plane.sh.
	KubeAPIServerVersion = "v1.37.2"
	EtcdVersion          = "v3.6.16"
	// GVisorVersion is the pseudo-version of gVisor's Go branch that
	// hack/install-deps.sh builds runsc and containerd-shim-runsc-v1 from.
	GVisorVersion = "v0.0.0-20260905035102-160fafc42237"
)

// RuntimeHandlerRunsc is the CRI runtime handler of gVisor in the containerd
// 2.x instances (RuntimeHandler of RunPodSandbox; a RuntimeClass's handler).
const RuntimeHandlerRunsc = "runsc"

// GVisorBinDir holds runsc and containerd-shim-runsc-v1 ($INPLACED_GVISOR_BIN
// overrides it).
func GVisorBinDir() string {
	return toolPath("INPLACED_GVISOR_BIN", filepath.Join(ToolsDir(), "gvisor-"+GVisorVersion, "bin"))
}

// RunscAvailable reports whether gVisor's binaries are installed.
func RunscAvailable() bool {
	return isExecutable(filepath.Join(GVisorBinDir(), "runsc")) &&
		isExecutable(filepath.Join(GVisorBinDir(), "containerd-shim-runsc-v1"))
}

// CI reports whether the environment variable CI is "true": missing
// prerequisites then fail tests instead of skipping them.
func CI() bool { return os.Getenv("CI") == "true" }

// Require skips tb (or fails it when CI=true) unless ok. what names the missing
// prerequisite, why tells how to get it.
func Require(tb testing.TB, what string, ok bool, why string) {
	tb.Helper()
	if ok {
		return
	}
	if CI() {
		tb.Fatalf("requirement %q not met: %s (CI=true: failing instead of skipping)", what, why)
	}
	tb.Skipf("requirement %q not met: %s", what, why)
}

// RequireRoot skips (or fails under CI=true) unless the test runs as root.
func RequireRoot(tb testing.TB) {
	tb.Helper()
	Require(tb, "root", os.Geteuid() == 0, "needs root to run containerd, runc and CNI")
}

// ToolsDir is where hack/install-deps.sh puts pinned tools:
// $INPLACED_TOOLS, or /var/cache/inplaced/tools.
func ToolsDir() string {
	if d := os.Getenv("INPLACED_TOOLS"); d != "" {
		return d
	}
	return "/var/cache/inplaced/tools"
}

// CrictlPath is crictl v1.37 from ToolsDir ($INPLACED_CRICTL overrides it).
func CrictlPath() string {
	return toolPath("INPLACED_CRICTL", filepath.Join(ToolsDir(), "bin", "crictl"))
}

// CritestPath is critest v1.37 from ToolsDir ($INPLACED_CRITEST overrides it).
func CritestPath() string {
	return toolPath("INPLACED_CRITEST", filepath.Join(ToolsDir(), "bin", "critest"))
}

// KubeletPath is the kubelet built by hack/build-kubelet.sh ($INPLACED_KUBELET
// overrides it).
func KubeletPath() string {
	return toolPath("INPLACED_KUBELET", filepath.Join(ToolsDir(), "kubelet-"+KubeletVersion, "kubelet"))
}

// KubeAPIServerPath is the kube-apiserver built by
// hack/build-control-plane.sh ($INPLACED_KUBE_APISERVER overrides it).
func KubeAPIServerPath() string {
	return toolPath("INPLACED_KUBE_APISERVER",
		filepath.Join(ToolsDir(), "kube-apiserver-"+KubeAPIServerVersion, "kube-apiserver"))
}

// KubectlPath is the kubectl built by hack/build-control-plane.sh
// ($INPLACED_KUBECTL overrides it).
func KubectlPath() string {
	return toolPath("INPLACED_KUBECTL", filepath.Join(ToolsDir(), "kubectl-"+KubeAPIServerVersion, "kubectl"))
}

// EtcdPath is the etcd built by hack/build-control-plane.sh ($INPLACED_ETCD
// overrides it).
func EtcdPath() string {
	return toolPath("INPLACED_ETCD", filepath.Join(ToolsDir(), "etcd-"+EtcdVersion, "etcd"))
}

// BusyboxPath is the static busybox the test images are built from
// ($INPLACED_BUSYBOX overrides /bin/busybox of Debian's busybox-static).
func BusyboxPath() string { return toolPath("INPLACED_BUSYBOX", "/bin/busybox") }

func toolPath(env, def string) string {
	if p := os.Getenv(env); p != "" {
		return p
	}
	return def
}

// RequireTool skips (or fails under CI=true) unless path is an executable file.
func RequireTool(tb testing.TB, name, path string) {
	tb.Helper()
	Require(tb, name, isExecutable(path), fmt.Sprintf("%s not found; run hack/install-deps.sh", path))
}

func isExecutable(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode().IsRegular() && st.Mode().Perm()&0o111 != 0
}

// Backend names a containerd version the tests can run against.
type Backend string

const (
	// Containerd16 is Debian 12's containerd 1.6 (/usr/bin/containerd).
	Containerd16 Backend = "containerd-1.6"
	// Containerd2 is containerd v2.4.2 built by hack/install-deps.sh.
	Containerd2 Backend = "containerd-2.4"
)

// AllBackends lists every backend the harness knows, newest first.
func AllBackends() []Backend { return []Backend{Containerd2, Containerd16} }

// ContainerdBinary is the containerd executable of b. Its shim
// (containerd-shim-runc-v2) is expected in the same directory.
// $INPLACED_CONTAINERD16 and $INPLACED_CONTAINERD2 override the defaults.
func ContainerdBinary(b Backend) string {
	switch b {
	case Containerd16:
		return toolPath("INPLACED_CONTAINERD16", "/usr/bin/containerd")
	case Containerd2:
		return toolPath("INPLACED_CONTAINERD2",
			filepath.Join(ToolsDir(), "containerd-"+ContainerdVersion, "bin", "containerd"))
	default:
		return ""
	}
}

// Available reports whether the binaries of b (containerd and its shim) exist.
func (b Backend) Available() bool {
	bin := ContainerdBinary(b)
	return bin != "" && isExecutable(bin) &&
		isExecutable(filepath.Join(filepath.Dir(bin), "containerd-shim-runc-v2"))
}

// BackendsFromEnv returns the backends to test: the comma-separated list in
// $INPLACED_BACKENDS (e.g. "containerd-2.4,containerd-1.6"), or else every
// backend whose binaries are installed, or else all of them (so that
// StartContainerd reports what is missing). Under CI=true it is all of them
// unless the list names some: a backend CI was meant to install and did not
// fails its tests instead of dropping out of the run unseen.
func BackendsFromEnv() []Backend {
	if CI() && strings.TrimSpace(os.Getenv("INPLACED_BACKENDS")) == "" {
		return AllBackends()
	}
	if v := strings.TrimSpace(os.Getenv("INPLACED_BACKENDS")); v != "" {
		var out []Backend
		for _, s := range strings.Split(v, ",") {
			if s = strings.TrimSpace(s); s != "" {
				out = append(out, Backend(s))
			}
		}
		return out
	}
	var out []Backend
	for _, b := range AllBackends() {
		if b.Available() {
			out = append(out, b)
		}
	}
	if len(out) == 0 {
		return AllBackends()
	}
	return out
}

// lookPathOr returns the path of name in PATH, or def.
func lookPathOr(name, def string) string {
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	return def
}

// H2specPath is h2spec from ToolsDir, built by hack/install-deps.sh with
// INPLACED_WITH_H2SPEC=1 (make conformance); $INPLACED_H2SPEC overrides it.
func H2specPath() string {
	return toolPath("INPLACED_H2SPEC", filepath.Join(ToolsDir(), "bin", "h2spec"))
}

// RunscSentries are the pids of gVisor's sandbox processes (the sentry,
// argv[0] "runsc-sandbox") whose command line names sandboxID: one per
// running pod sandbox on handler runsc.
func RunscSentries(sandboxID string) []int {
	var out []int
	for _, p := range listProcs() {
		argv0, _, _ := strings.Cut(p.cmdline, " ")
		if !p.zombie && filepath.Base(argv0) == "runsc-sandbox" && strings.Contains(p.cmdline, sandboxID) {
			out = append(out, p.pid)
		}
	}
	return out
}
