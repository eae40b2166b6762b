package harness

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"
)

// K3sVersion is the pseudo-version of github.com/k3s-io/k3s that
// hack/build-k3s.sh builds: k3s main of 2026-02-11, Kubernetes v1.35.1 (k3s's
// release tags are not Go module versions).
const K3sVersion = "v1.35.1-0.20260211145931-c5b158798933"

// K3sDir holds k3s and its kubectl and crictl links ($INPLACED_K3S
// overrides it).
func K3sDir() string {
	return toolPath("INPLACED_K3S", filepath.Join(ToolsDir(), "k3s-"+K3sVersion))
}

// K3sPath is the k3s binary built by hack/build-k3s.sh.
func K3sPath() string { return filepath.Join(K3sDir(), "k3s") }

// K3sPrerequisites skips (or fails under CI=true) unless k3s is built and its
// kubelets can run here.
func K3sPrerequisites(tb testing.TB) {
	tb.Helper()
	RequireRoot(tb)
	Require(tb, "k3s "+K3sVersion, isExecutable(K3sPath()),
		K3sPath()+" not found; run hack/build-k3s.sh (or INPLACED_WITH_KUBELET=1 hack/install-deps.sh)")
	requireKubeletMachine(tb)
}

// K3sNode is one k3s node as docs/k3s.md sets it up, started from a clean
// state in the documented order: its own containerd, then its own inplaced
// in front of it with --kubeconfig naming the file k3s writes for its
// kubelet (not there yet: inplaced serves CRI at once and starts Kubernetes
// mode when the file appears), then k3s with the repository's
// deploy/k3s/config.yaml and config.yaml.d/ (the paths in them replaced by
// the node's: k3sPaths) and a drop-in of the harness's own settings
// (ports, data dir, the test bed's network).
//
// What it puts on the machine, and how Close takes it back:
//   - Dir holds k3s's --data-dir (DataDir), its config, log, admin
//     kubeconfig and the kubelet's pod logs. k3s's process title hides its
//     command line, so its processes are found by pid and process group;
//     mounts below Dir are unmounted, Dir removed.
//   - Its kubelet's pods: k3s stops with its containers running (as on a
//     node); Close removes every pod of the node's containerd through CRI
//     before the cgroups go.
//   - Its kubelet's cgroupRoot (/inplaced-k3s-<rand>), the /var/log/containers
//     links, the device-plugin socket and kubelet's kernel tunables: as for a
//     harness Kubelet (machineAcquire, makeCgroupRoot).
//   - What k3s itself writes outside its data dir: /etc/rancher/node/password,
//     on a server the link /etc/rancher/k3s/k3s.yaml to --write-kubeconfig
//     (and the directories), and the forwarding sysctls its agent sets; taken
//     back after the last k3s node of the process stops (k3sMachine). The
//     kernel modules k3s loads (br_netfilter, overlay, iptable_nat, ...)
//     stay loaded.
type K3sNode struct {
	Name   string
	Server bool
	Dir    string
	// DataDir is k3s's --data-dir, Dir/data.
	DataDir string
	// ConfigPath is k3s's --config, Dir/config.yaml (with config.yaml.d/).
	ConfigPath string
	LogPath    string
	// KubeletKubeconfig is DataDir/agent/kubelet.kubeconfig, written by k3s
	// once it runs, and inplaced's --kubeconfig.
	KubeletKubeconfig string
	// CgroupRoot is the kubelet's cgroupRoot, "/inplaced-k3s-<rand>".
	CgroupRoot string
	// PodLogsDir is the kubelet's podLogsDir.
	PodLogsDir string
	// KubeletRootDir is the kubelet's --root-dir, DataDir/kubelet: k3s
	// leaves it at /var/lib/kubelet (unless rootless), which two nodes on
	// one machine cannot share.
	KubeletRootDir string
	Containerd     *Containerd
	Inplaced       *Inplaced

	tb             testing.TB
	mu             sync.Mutex
	d              *daemon
	pids           []int // every k3s process started, for Leftovers
	createdCgroups []string
	closeOnce      sync.Once
	closeErr       error
}

// K3sServer is a k3s server node: the control plane (apiserver, scheduler,
// controller-manager, cloud-controller-manager, kine on sqlite) and a
// kubelet in one process.
type K3sServer struct {
	*K3sNode
	// URL is the supervisor and API server, https://127.0.0.1:<port>.
	URL   string
	Token string
	// AdminKubeconfig is k3s's --write-kubeconfig; Admin a clientset of it.
	AdminKubeconfig string
	Admin           kubernetes.Interface
}

// k3sPaths are the paths the repository's deploy/k3s files name, and what a
// node's own are: the harness copies the files with these replaced.
func (n *K3sNode) k3sPaths() *strings.Replacer {
	return strings.NewReplacer(
		"unix:///run/inplaced/inplaced.sock", n.Inplaced.Endpoint,
		"/run/containerd/containerd.sock", n.Containerd.Socket,
		"/etc/rancher/k3s/", n.Dir+"/",
	)
}

// StartK3sServer starts a k3s server node on containerd backend b whose
// images come from reg; it returns once the API server answers. The node's
// Ready condition is the caller's to wait for (WaitNodeReady). tb.Cleanup
// tears it all down.
func StartK3sServer(tb testing.TB, b Backend, reg *Registry) *K3sServer {
	tb.Helper()
	K3sPrerequisites(tb)
	start := time.Now()
	s := &K3sServer{K3sNode: &K3sNode{Name: "ip3s-" + randHex(3), Server: true, tb: tb}, Token: randHex(16)}
	// The supervisor listens on port p; its API server on p+1.
	p, err := freePortPair()
	if err != nil {
		tb.Fatalf("k3s server: %v", err)
	}
	s.URL = "https://127.0.0.1:" + strconv.Itoa(p)
	settings := k3sServerSettings(tb)
	s.startNode(b, reg, func(n *K3sNode) map[string]any {
		s.AdminKubeconfig = filepath.Join(n.Dir, "admin.kubeconfig")
		settings["token"], settings["write-kubeconfig"] = s.Token, s.AdminKubeconfig
		settings["bind-address"], settings["advertise-address"], settings["https-listen-port"] = "127.0.0.1", "127.0.0.1", p
		return settings
	})
	if err := waitFor(s.d, 2*time.Minute, s.apiReady); err != nil {
		tb.Fatalf("k3s server %s: %v\n%s", s.Name, err, s.LogTail(60))
	}
	tb.Logf("k3s server %s running in %s: pid %d, %s, inplaced %s, %s",
		s.Name, time.Since(start).Round(time.Millisecond), s.PID(), s.URL, s.Inplaced.Endpoint, s.Containerd.Backend)
	return s
}

// k3sServerSettings are a k3s server's settings on this test bed: the
// network is the agents' containerd's own CNI config (a bridge per
// containerd), so no flannel, kube-proxy or network policy rules on a shared
// machine, and no packaged add-ons; the controllers off the default ports
// another kube-scheduler or controller manager of the machine may hold.
func k3sServerSettings(tb testing.TB) map[string]any {
	tb.Helper()
	var ports [3]int
	for i := range ports {
		var err error
		if ports[i], err = freePort(); err != nil {
			tb.Fatalf("k3s server: %v", err)
		}
	}
	return map[string]any{
		"flannel-backend":                   "none",
		"disable-network-policy":            true,
		"disable-kube-proxy":                true,
		"disable":                           []string{"traefik", "servicelb", "metrics-server", "local-storage", "coredns"},
		"disable-helm-controller":           true,
		"kube-controller-manager-arg":       []string{"secure-port=" + strconv.Itoa(ports[0])},
		"kube-scheduler-arg":                []string{"secure-port=" + strconv.Itoa(ports[1])},
		"kube-cloud-controller-manager-arg": []string{"secure-port=" + strconv.Itoa(ports[2])},
	}
}

// apiReady makes the admin client once k3s has written its kubeconfig, and
// asks the API server's /readyz.
func (s *K3sServer) apiReady() error { return k3sAPIReady(&s.Admin, s.AdminKubeconfig) }

// k3sAPIReady makes *admin from kubeconfig once k3s has written it, and asks
// the API server's /readyz.
func k3sAPIReady(admin *kubernetes.Interface, kubeconfig string) error {
	if *admin == nil {
		rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return err
		}
		cs, err := kubernetes.NewForConfig(rc)
		if err != nil {
			return err
		}
		*admin = cs
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	body, err := (*admin).Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
	if err != nil {
		return fmt.Errorf("readyz: %w: %s", err, body)
	}
	return nil
}

// StartAgent starts a k3s agent node joined to s, with its own containerd
// (backend b, images from reg) and inplaced; it returns once k3s has written
// the kubelet's kubeconfig.
func (s *K3sServer) StartAgent(tb testing.TB, b Backend, reg *Registry) *K3sNode {
	tb.Helper()
	start := time.Now()
	n := &K3sNode{Name: "ip3a-" + randHex(3), tb: tb}
	// The agent's load balancer to the supervisor; the port below it is
	// taken too when the supervisor and API server listen apart.
	lb, err := freePortPair()
	if err != nil {
		tb.Fatalf("k3s agent: %v", err)
	}
	n.startNode(b, reg, func(*K3sNode) map[string]any {
		return map[string]any{"server": s.URL, "token": s.Token, "lb-server-port": lb + 1}
	})
	if err := waitFor(n.d, 2*time.Minute, func() error {
		_, err := os.Stat(n.KubeletKubeconfig)
		return err
	}); err != nil {
		tb.Fatalf("k3s agent %s: %v\n%s", n.Name, err, n.LogTail(60))
	}
	tb.Logf("k3s agent %s running in %s: pid %d, inplaced %s, %s",
		n.Name, time.Since(start).Round(time.Millisecond), n.PID(), n.Inplaced.Endpoint, n.Containerd.Backend)
	return n
}

// startNode starts the node's containerd and inplaced, writes k3s's config
// (the repository's files, then the harness's drop-in: settings returns
// the role's part) and starts k3s.
func (n *K3sNode) startNode(b Backend, reg *Registry, settings func(*K3sNode) map[string]any) {
	tb := n.tb
	tb.Helper()
	n.Containerd = StartContainerd(tb, b, reg)
	dir, err := os.MkdirTemp(shortTempDir(), "ip3")
	if err != nil {
		tb.Fatalf("k3s: %v", err)
	}
	n.Dir, n.DataDir = dir, filepath.Join(dir, "data")
	n.ConfigPath, n.LogPath = filepath.Join(dir, "config.yaml"), filepath.Join(dir, "k3s.log")
	n.KubeletKubeconfig = filepath.Join(n.DataDir, "agent", "kubelet.kubeconfig")
	n.PodLogsDir = filepath.Join(dir, "pod-logs")
	n.CgroupRoot = "/inplaced-k3s-" + randHex(4)
	n.KubeletRootDir = filepath.Join(n.DataDir, "kubelet")
	// As docs/k3s.md configures it: k3s's kubelet kubeconfig (not there
	// yet), the kubelet's root dir, the node's name.
	n.Inplaced = StartInplacedWith(tb, n.Containerd.Endpoint, []string{"--kubeconfig", n.KubeletKubeconfig,
		"--kubelet-root-dir", n.KubeletRootDir, "--node-name", n.Name})
	// Registered after containerd's and inplaced's: runs before them.
	tb.Cleanup(func() {
		if err := n.Close(); err != nil {
			tb.Errorf("k3s %s cleanup: %v", n.Name, err)
		}
	})
	k3sMachineAcquire()
	machineAcquire()
	if n.createdCgroups, err = makeCgroupRoot(n.CgroupRoot); err != nil {
		tb.Fatalf("k3s: %v", err)
	}
	kubeletPorts := [2]int{}
	for i := range kubeletPorts {
		if kubeletPorts[i], err = freePort(); err != nil {
			tb.Fatalf("k3s: %v", err)
		}
	}
	if err := n.writeConfig(kubeletPorts, settings(n)); err != nil {
		tb.Fatalf("k3s %s config: %v", n.Name, err)
	}
	if err := n.Start(); err != nil {
		tb.Fatalf("k3s %s: %v\n%s", n.Name, err, n.LogTail(40))
	}
}

// repoRoot is the repository this file is in.
func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// writeConfig writes Dir/config.yaml and Dir/config.yaml.d/ from the
// repository's deploy/k3s (paths replaced), the kubelet configuration they
// name with the harness's settings added, and the harness's drop-in
// config.yaml.d/90-test-harness.yaml (role settings, data dir, node name).
func (n *K3sNode) writeConfig(kubeletPorts [2]int, role map[string]any) error {
	src := filepath.Join(repoRoot(), "deploy", "k3s")
	paths := n.k3sPaths()
	install := func(from, to string, extra []byte) error {
		data, err := os.ReadFile(from)
		if err != nil {
			return err
		}
		return os.WriteFile(to, append([]byte(paths.Replace(string(data))), extra...), 0o600)
	}
	if err := os.MkdirAll(n.ConfigPath+".d", 0o755); err != nil {
		return err
	}
	if err := install(filepath.Join(src, "config.yaml"), n.ConfigPath, nil); err != nil {
		return err
	}
	// config.yaml.d/10-cgroupv1.yaml is for cgroup v1 hosts: the harness runs
	// on those only (requireKubeletMachine).
	dropins, err := filepath.Glob(filepath.Join(src, "config.yaml.d", "*.yaml"))
	if err != nil {
		return err
	}
	for _, f := range dropins {
		if err := install(f, filepath.Join(n.ConfigPath+".d", filepath.Base(f)), nil); err != nil {
			return err
		}
	}
	// k3s takes one kubelet config file (--kubelet-arg=config=...): the
	// harness's settings go into the one the repository's drop-in names.
	kubelet, err := yaml.Marshal(map[string]any{
		// A shared machine: this node's own ports, cgroup tree and pod logs.
		"port":        kubeletPorts[0],
		"healthzPort": kubeletPorts[1],
		"cgroupRoot":  n.CgroupRoot,
		"podLogsDir":  n.PodLogsDir,
		// As the harness's own kubelets: no iptables chains, no node
		// allocatable cgroups, no eviction or image GC on a full test disk,
		// and a test's pace.
		"makeIPTablesUtilChains":      false,
		"enforceNodeAllocatable":      []string{},
		"evictionHard":                map[string]string{"memory.available": "1Mi", "nodefs.available": "1%", "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
		"imageGCHighThresholdPercent": 100,
		"imageGCLowThresholdPercent":  99,
		"syncFrequency":               "5s",
	})
	if err != nil {
		return err
	}
	if err := install(filepath.Join(src, "kubelet-cgroupv1.conf"), filepath.Join(n.Dir, "kubelet-cgroupv1.conf"),
		append([]byte("# added by the test harness (test/harness/k3s.go)\n"), kubelet...)); err != nil {
		return err
	}
	own := map[string]any{"data-dir": n.DataDir, "node-name": n.Name, "kubelet-arg+": []string{"root-dir=" + n.KubeletRootDir}}
	for k, v := range role {
		own[k] = v
	}
	data, err := yaml.Marshal(own)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(n.ConfigPath+".d", "90-test-harness.yaml"),
		append([]byte("# written by the test harness (test/harness/k3s.go)\n"), data...), 0o600)
}

// Start starts k3s (again, after Stop: same config and data dir).
func (n *K3sNode) Start() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.d.pid() != 0 {
		return errors.New("k3s is already running")
	}
	role := "agent"
	if n.Server {
		role = "server"
	}
	logf, err := os.OpenFile(n.LogPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err == nil {
		fmt.Fprintf(logf, "==== harness: starting k3s %s at %s\n", role, time.Now().Format(time.RFC3339Nano))
		logf.Close()
	}
	cmd := []string{role, "--config", n.ConfigPath}
	d, err := spawnDaemon("k3s "+role, K3sPath(), n.Dir, n.LogPath, cmd, nil)
	if err != nil {
		return err
	}
	n.d = d
	n.pids = append(n.pids, d.cmd.Process.Pid)
	return nil
}

// Stop stops k3s (SIGTERM to its process group; SIGKILL after 30 s). Its
// pods keep running, as on a node whose k3s service stops.
func (n *K3sNode) Stop() error {
	n.mu.Lock()
	d := n.d
	n.mu.Unlock()
	return d.stop(syscall.SIGTERM, 30*time.Second)
}

// Restart is Stop then Start.
func (n *K3sNode) Restart() error {
	if err := n.Stop(); err != nil {
		return err
	}
	return n.Start()
}

// PID is the running k3s's pid, 0 while it is stopped.
func (n *K3sNode) PID() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.d.pid()
}

// LogTail returns the last n lines of k3s's log.
func (n *K3sNode) LogTail(lines int) string { return tailFile(n.LogPath, lines) }

// LogGrep returns the lines of k3s's log that contain s.
func (n *K3sNode) LogGrep(s string) []string { return grepFile(n.LogPath, s) }

// WaitNodeReady polls Node name until its Ready condition is True.
func (s *K3sServer) WaitNodeReady(tb testing.TB, name string, timeout time.Duration) *corev1.Node {
	tb.Helper()
	return waitNodeReady(tb, s.Admin, name, timeout)
}

// WaitPod polls pod ns/name until cond returns nil (ControlPlane.WaitPod).
func (s *K3sServer) WaitPod(tb testing.TB, ns, name string, timeout time.Duration, cond func(*corev1.Pod) error) *corev1.Pod {
	tb.Helper()
	return waitPod(tb, s.Admin, ns, name, timeout, cond)
}

// Close tears the node down (tb.Cleanup calls it; it runs once): k3s is
// stopped, the node's pods removed through its containerd, mounts below Dir
// unmounted, the kubelet's links, cgroups and machine changes taken back,
// Dir removed. The node's inplaced and containerd are closed by their own
// cleanups, after this one.
func (n *K3sNode) Close() error {
	n.closeOnce.Do(func() { n.closeErr = n.close() })
	return n.closeErr
}

func (n *K3sNode) close() error {
	if n.tb.Failed() {
		n.tb.Logf("k3s %s log (last 60 lines):\n%s", n.Name, n.LogTail(60))
		saveArtifacts(n.tb, "-k3s-"+n.Name, n.LogPath, n.ConfigPath, filepath.Join(n.ConfigPath+".d", "90-test-harness.yaml"))
	}
	var errs []error
	if err := n.Stop(); err != nil {
		errs = append(errs, err)
	}
	if n.Containerd != nil && n.Containerd.Running() {
		if err := n.Containerd.removeAllPods(); err != nil {
			errs = append(errs, err)
		}
	}
	if n.Dir != "" {
		if err := unmountUnder(n.Dir); err != nil {
			errs = append(errs, err)
		}
	}
	removeLogSymlinks(n.PodLogsDir)
	if err := removeCgroups(n.createdCgroups, 20*time.Second); err != nil {
		errs = append(errs, err)
	}
	if err := machineRelease(); err != nil {
		errs = append(errs, err)
	}
	if err := k3sMachineRelease(); err != nil {
		errs = append(errs, err)
	}
	if n.Dir != "" && len(mountsUnder(n.Dir)) == 0 {
		if err := os.RemoveAll(n.Dir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Leftovers describes what of the node is still on the machine: its k3s
// processes, mounts below Dir, its cgroups, its /var/log/containers links,
// Dir, and (once no k3s node or kubelet of the process runs) what k3s and
// kubelet change outside their directories. Empty after Close. The node's
// containerd answers for itself (Containerd.Leftovers).
func (n *K3sNode) Leftovers() []string {
	var out []string
	for _, pid := range n.pids {
		for _, p := range listProcs() {
			if p.pid == pid && !p.zombie {
				out = append(out, fmt.Sprintf("process %d: %s", p.pid, p.cmdline))
			}
		}
	}
	out = append(out, nodeLeftovers(n.Dir, n.CgroupRoot, n.PodLogsDir)...)
	out = append(out, machineLeftovers()...)
	return append(out, k3sMachineLeftovers()...)
}

// FreePortPair is freePortPair, for k3s servers started elsewhere.
func FreePortPair() (int, error) { return freePortPair() }

// freePortPair returns a port p such that p and p+1 are both free on
// 127.0.0.1 (k3s's supervisor and API server; an agent's two load
// balancers).
func freePortPair() (int, error) {
	for range 50 {
		p, err := freePort()
		if err != nil {
			return 0, err
		}
		if p >= 65535 {
			continue
		}
		if ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+1)); err == nil {
			ln.Close()
			return p, nil
		}
	}
	return 0, errors.New("no two consecutive free ports on 127.0.0.1")
}

// k3sMachine is what k3s itself changes outside its data dir, noted before
// the first k3s node of the process starts and put back after the last one
// stops.
var k3sMachine struct {
	mu      sync.Mutex
	live    int
	absent  []string          // k3sFiles not there before
	sysctls map[string]string // k3sTunables before
}

// k3sFiles are written by k3s nodes, parents first: the node password
// (unless rootless), and on a server a link at the default kubeconfig path
// to the one --write-kubeconfig names.
var k3sFiles = []string{"/etc/rancher", "/etc/rancher/node", "/etc/rancher/node/password", "/etc/rancher/k3s", "/etc/rancher/k3s/k3s.yaml"}

// k3sTunables are the sysctls k3s's agent sets (pkg/agent/syssetup) that
// this machine had before; bridge-nf-call-iptables exists only once
// br_netfilter is loaded.
var k3sTunables = []string{"net/ipv4/conf/all/forwarding", "net/ipv4/conf/default/forwarding", "net/bridge/bridge-nf-call-iptables"}

func k3sMachineAcquire() {
	k3sMachine.mu.Lock()
	defer k3sMachine.mu.Unlock()
	if k3sMachine.live == 0 {
		k3sMachine.absent = nil
		for _, f := range k3sFiles {
			if !exists(f) {
				k3sMachine.absent = append(k3sMachine.absent, f)
			}
		}
		k3sMachine.sysctls = readTunables(k3sTunables)
	}
	k3sMachine.live++
}

func k3sMachineRelease() error {
	k3sMachine.mu.Lock()
	defer k3sMachine.mu.Unlock()
	k3sMachine.live--
	if k3sMachine.live > 0 {
		return nil
	}
	var errs []error
	for i := len(k3sMachine.absent) - 1; i >= 0; i-- {
		if err := os.Remove(k3sMachine.absent[i]); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(append(errs, writeTunables(k3sMachine.sysctls))...)
}

func k3sMachineLeftovers() []string {
	k3sMachine.mu.Lock()
	defer k3sMachine.mu.Unlock()
	if k3sMachine.live > 0 {
		return nil
	}
	var out []string
	for _, f := range k3sMachine.absent {
		if exists(f) {
			out = append(out, "file "+f)
		}
	}
	now := readTunables(k3sTunables)
	for s, v := range k3sMachine.sysctls {
		if now[s] != v {
			out = append(out, fmt.Sprintf("sysctl %s=%s (was %s)", s, now[s], v))
		}
	}
	return out
}
