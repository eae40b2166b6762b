package harness

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
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

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Kubelet is a real kubelet started by StartKubelet, with its CRI runtime and
// image endpoints at a given socket (usually inplaced in front of a private
// containerd). It is standalone (static pods from a manifest directory, no API
// server) unless KubeletOptions.Kubeconfig is set: then it also registers as
// Node NodeName and runs the pods bound to it (ControlPlane.StartKubelet).
//
// What it puts on the machine, and how Close takes it back:
//   - Dir holds its config, --root-dir, --cert-dir, the manifests, podLogsDir,
//     volumePluginDir and its log: processes with Dir in their command line
//     are killed, mounts below Dir unmounted, Dir removed.
//   - Its pods' cgroups live under CgroupRoot (/inplaced-kubelet-<rand>),
//     created by the harness in every cgroup v1 hierarchy so that kubelet's
//     kubepods/... tree and the containers' cgroups are below it; Close
//     removes exactly that tree (rmdir, bottom-up).
//   - Its pods' sandboxes are stopped and removed through CRI after kubelet
//     has stopped: the static pods' (name suffix "-"+NodeName) and those of
//     every pod kubelet knew (pod UID label: a directory in RootDir/pods or
//     PodLogsDir, or a pod on the read-only port at Close).
//   - kubelet sets six kernel sysctls at start (vm.overcommit_memory,
//     vm.panic_on_oom, kernel.panic, kernel.panic_on_oops,
//     kernel.keys.root_maxkeys/maxbytes; protectKernelDefaults would make it
//     refuse to start instead): their values from before the first kubelet of
//     the process are restored after the last one stops.
//   - kubelet always creates /var/log/containers and a symlink there per
//     container: the links into PodLogsDir go, the directory too if no
//     kubelet of this process found it there.
//   - kubelet's device manager always listens on
//     /var/lib/kubelet/device-plugins/kubelet.sock, whatever --root-dir says
//     (deviceplugin/v1beta1.KubeletSocket): the socket goes after the last
//     kubelet of the process stops, and the directories if they were not
//     there before. StartKubelet refuses to run next to a kubelet that
//     answers on that socket.
//   - makeIPTablesUtilChains is false: kubelet creates no iptables chains.
type Kubelet struct {
	Dir         string
	RootDir     string // --root-dir
	CertDir     string // --cert-dir
	ManifestDir string // staticPodPath
	PodLogsDir  string // podLogsDir (instead of /var/log/pods)
	ConfigPath  string
	LogPath     string
	// NodeName is --hostname-override; static pods are named <name>-NodeName.
	// With a Kubeconfig it is the name of the Node kubelet registers.
	NodeName string
	// Kubeconfig is kubelet's --kubeconfig (a copy in Dir), "" when standalone.
	Kubeconfig string
	// ReadOnlyPort serves GET /pods (a PodList) on 127.0.0.1 without auth.
	ReadOnlyPort int
	Port         int
	HealthzPort  int
	// CgroupRoot is kubelet's cgroupRoot ("/inplaced-kubelet-<rand>").
	CgroupRoot      string
	SyncFrequency   time.Duration
	RuntimeEndpoint string
	ImageEndpoint   string
	// BackendEndpoint, when set, is where Close removes the static pods if
	// RuntimeEndpoint no longer answers (e.g. containerd behind the proxy).
	BackendEndpoint string

	extraArgs []string
	tb        testing.TB
	mu        sync.Mutex
	cmd       *exec.Cmd
	exited    chan struct{}
	waitErr   error

	// createdCgroups are CgroupRoot in every hierarchy where it did not
	// exist before: made by the harness (v1) or by kubelet (unified).
	createdCgroups []string

	closeOnce sync.Once
	closeErr  error
}

// KubeletOptions configures StartKubelet.
type KubeletOptions struct {
	// RuntimeEndpoint is the CRI endpoint ("unix:///..."); required.
	RuntimeEndpoint string
	// ImageEndpoint defaults to RuntimeEndpoint.
	ImageEndpoint string
	// BackendEndpoint: see Kubelet.BackendEndpoint.
	BackendEndpoint string
	// SyncFrequency is kubelet's syncFrequency (default 5s).
	SyncFrequency time.Duration
	// FileCheckFrequency is how often the manifest dir is re-read (default
	// 1s; kubelet also watches it with inotify).
	FileCheckFrequency time.Duration
	// Verbosity is klog's -v (default 2).
	Verbosity int
	// NodeName is --hostname-override (default: a fresh "ipk-<rand>").
	NodeName string
	// Kubeconfig, when set, is a kubeconfig with the credentials of Node
	// NodeName (ControlPlane.NodeKubeconfig): kubelet registers that Node and
	// runs the API's pods bound to it (spec.nodeName), besides static pods.
	// Without it kubelet runs standalone.
	Kubeconfig string
	// Dir is the kubelet's directory (default: a new temporary one); its
	// --root-dir is KubeletRootDirIn(Dir), so that files kubelet reads there
	// (the node's docker config.json) can be written before it starts. The
	// kubelet's cleanup removes Dir.
	Dir string
	// ExtraArgs are appended to kubelet's command line (e.g.
	// --image-credential-provider-config).
	ExtraArgs []string
}

// KubeletRootDirIn is the --root-dir of a kubelet started with Dir dir.
func KubeletRootDirIn(dir string) string { return filepath.Join(dir, "root") }

// kernelTunables are the sysctls kubelet's container manager sets at start
// (pkg/kubelet/cm/container_manager_linux.go, setupKernelTunables).
var kernelTunables = []string{
	"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
	"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes",
}

// Paths kubelet uses whatever its flags say.
const (
	containerLogsDir = "/var/log/containers"
	varLibKubelet    = "/var/lib/kubelet"
	devicePluginDir  = "/var/lib/kubelet/device-plugins"
	devicePluginSock = "/var/lib/kubelet/device-plugins/kubelet.sock"
)

// machineState is what kubelet changes outside its own directories, taken
// when the first kubelet of the process starts and put back when the last
// one stops.
var machineState struct {
	mu            sync.Mutex
	live          int
	sysctls       map[string]string
	hadLogSymlink bool // containerLogsDir existed before
	hadVarLib     bool // varLibKubelet existed before
	hadDevPlugins bool // devicePluginDir existed before
}

// KubeletPrerequisites skips (or fails under CI=true) unless a kubelet can run.
func KubeletPrerequisites(tb testing.TB) {
	tb.Helper()
	RequireRoot(tb)
	Require(tb, "kubelet "+KubeletVersion, isExecutable(KubeletPath()),
		KubeletPath()+" not found; run INPLACED_WITH_KUBELET=1 hack/install-deps.sh (or hack/build-kubelet.sh)")
	requireKubeletMachine(tb)
}

// requireKubeletMachine skips (or fails under CI=true) unless a test kubelet
// (standalone, or inside k3s) can run here: cgroup v1, and no kubelet of
// another process on the device-plugin socket.
func requireKubeletMachine(tb testing.TB) {
	tb.Helper()
	roots := cgroupV1Roots()
	Require(tb, "cgroup v1 hierarchies", len(roots) > 0, "the kubelet harness runs kubelet with the cgroupfs driver on cgroup v1")
	if c, err := net.DialTimeout("unix", devicePluginSock, time.Second); err == nil {
		c.Close()
		machineState.mu.Lock()
		ours := machineState.live > 0
		machineState.mu.Unlock()
		Require(tb, "no other kubelet on the machine", ours,
			devicePluginSock+" answers: a kubelet runs here, and a test kubelet would take its device-plugin socket")
	}
}

// StartKubelet starts a standalone kubelet; tb.Cleanup tears it down (Close).
func StartKubelet(tb testing.TB, o KubeletOptions) *Kubelet {
	tb.Helper()
	KubeletPrerequisites(tb)
	if o.RuntimeEndpoint == "" {
		tb.Fatal("StartKubelet: RuntimeEndpoint is required")
	}
	if o.ImageEndpoint == "" {
		o.ImageEndpoint = o.RuntimeEndpoint
	}
	if o.SyncFrequency <= 0 {
		o.SyncFrequency = 5 * time.Second
	}
	if o.FileCheckFrequency <= 0 {
		o.FileCheckFrequency = time.Second
	}
	if o.Verbosity == 0 {
		o.Verbosity = 2
	}
	dir := o.Dir
	var err error
	if dir == "" {
		if dir, err = os.MkdirTemp(shortTempDir(), "ipk"); err != nil {
			tb.Fatalf("kubelet: %v", err)
		}
	}
	suffix := randHex(4)
	if o.NodeName == "" {
		o.NodeName = "ipk-" + suffix
	}
	k := &Kubelet{
		Dir: dir, RootDir: KubeletRootDirIn(dir), CertDir: filepath.Join(dir, "pki"),
		ManifestDir: filepath.Join(dir, "manifests"), PodLogsDir: filepath.Join(dir, "pod-logs"),
		ConfigPath: filepath.Join(dir, "kubelet.yaml"), LogPath: filepath.Join(dir, "kubelet.log"),
		NodeName: o.NodeName, CgroupRoot: "/inplaced-kubelet-" + suffix,
		SyncFrequency: o.SyncFrequency, RuntimeEndpoint: o.RuntimeEndpoint, ImageEndpoint: o.ImageEndpoint,
		BackendEndpoint: o.BackendEndpoint, extraArgs: o.ExtraArgs, tb: tb,
	}
	tb.Cleanup(func() {
		if err := k.Close(); err != nil {
			tb.Errorf("kubelet %s cleanup: %v", k.Dir, err)
		}
	})
	for _, d := range []string{k.RootDir, k.CertDir, k.ManifestDir, k.PodLogsDir, filepath.Join(dir, "volume-plugins")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			tb.Fatalf("kubelet: %v", err)
		}
	}
	for _, p := range []*int{&k.ReadOnlyPort, &k.Port, &k.HealthzPort} {
		if *p, err = freePort(); err != nil {
			tb.Fatalf("kubelet: %v", err)
		}
	}
	machineAcquire()
	if k.createdCgroups, err = makeCgroupRoot(k.CgroupRoot); err != nil {
		tb.Fatalf("kubelet: %v", err)
	}
	if err := os.WriteFile(k.ConfigPath, []byte(k.config(o)), 0o644); err != nil {
		tb.Fatalf("kubelet: %v", err)
	}
	if o.Kubeconfig != "" {
		// kubelet's own copy: its command line names only Dir.
		k.Kubeconfig = filepath.Join(dir, "kubeconfig")
		if err := copyFile(o.Kubeconfig, k.Kubeconfig); err != nil {
			tb.Fatalf("kubelet: kubeconfig: %v", err)
		}
	}
	if err := k.start(o.Verbosity); err != nil {
		tb.Fatalf("start kubelet: %v\n%s", err, k.LogTail(60))
	}
	mode := "standalone"
	if k.Kubeconfig != "" {
		mode = "registered to an API server"
	}
	tb.Logf("kubelet %s running (%s): pid %d, node %s, read-only port %d, cgroup root %s, CRI %s",
		KubeletVersion, mode, k.PID(), k.NodeName, k.ReadOnlyPort, k.CgroupRoot, k.RuntimeEndpoint)
	return k
}

// newNodeName is a fresh node name for a test kubelet.
func newNodeName() string { return "ipk-" + randHex(4) }

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// config is the KubeletConfiguration. JSON is YAML: no YAML library needed.
func (k *Kubelet) config(o KubeletOptions) string {
	cfg := map[string]any{
		"apiVersion":               "kubelet.config.k8s.io/v1beta1",
		"kind":                     "KubeletConfiguration",
		"staticPodPath":            k.ManifestDir,
		"podLogsDir":               k.PodLogsDir,
		"volumePluginDir":          filepath.Join(k.Dir, "volume-plugins"),
		"containerRuntimeEndpoint": k.RuntimeEndpoint,
		"imageServiceEndpoint":     k.ImageEndpoint,
		"cgroupDriver":             "cgroupfs",
		"cgroupRoot":               k.CgroupRoot,
		"cgroupsPerQOS":            true,
		"enforceNodeAllocatable":   []string{},
		"failCgroupV1":             false,
		"failSwapOn":               false,
		"makeIPTablesUtilChains":   false,
		"address":                  "127.0.0.1",
		"port":                     k.Port,
		"readOnlyPort":             k.ReadOnlyPort,
		"healthzBindAddress":       "127.0.0.1",
		"healthzPort":              k.HealthzPort,
		"authentication":           map[string]any{"anonymous": map[string]bool{"enabled": true}, "webhook": map[string]bool{"enabled": false}},
		"authorization":            map[string]string{"mode": "AlwaysAllow"},
		"syncFrequency":            o.SyncFrequency.String(),
		"fileCheckFrequency":       o.FileCheckFrequency.String(),
		// A loaded or nearly full test machine must not make kubelet evict
		// or garbage-collect the test's pods and images.
		"evictionHard":                map[string]string{"memory.available": "1Mi", "nodefs.available": "1%", "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
		"imageGCHighThresholdPercent": 100,
		"imageGCLowThresholdPercent":  99,
	}
	b, _ := json.MarshalIndent(cfg, "", "  ")
	return string(b) + "\n"
}

// cgroupV1Roots are the mount points of the v1 hierarchies (not cgroup2).
func cgroupV1Roots() []string {
	ms, err := readMountInfo()
	if err != nil {
		return nil
	}
	var out []string
	for _, m := range ms {
		if m.fsType == "cgroup" {
			out = append(out, m.mountPoint)
		}
	}
	return out
}

// makeCgroupRoot creates the cgroup rel (a kubelet's cgroupRoot) in every
// v1 hierarchy: kubelet requires its cgroupRoot to exist. kubelet's cgroup
// manager also creates the same tree in the cgroup2 "unified" mount next to
// the v1 controllers; with a fresh random name, whatever is there at Close
// is kubelet's. It returns rel in every hierarchy (removeCgroups takes them
// back). rel is also registered with the containerd instances' cgroup
// parents: if a container still held it when its kubelet closed, the last
// containerd to close removes it.
func makeCgroupRoot(rel string) (created []string, _ error) {
	cgroupMu.Lock()
	cgroupParents[rel] = true
	cgroupMu.Unlock()
	v1 := map[string]bool{}
	for _, root := range cgroupV1Roots() {
		v1[root] = true
	}
	for _, root := range cgroupRoots() {
		d := filepath.Join(root, rel)
		if !v1[root] {
			if exists(d) {
				return created, fmt.Errorf("cgroup %s exists already: not ours", d)
			}
			created = append(created, d)
			continue
		}
		if err := os.Mkdir(d, 0o755); err != nil {
			if errors.Is(err, os.ErrExist) {
				return created, fmt.Errorf("cgroup %s exists already: not ours", d)
			}
			return created, fmt.Errorf("create cgroup %s: %w", d, err)
		}
		created = append(created, d)
		if filepath.Base(root) == "cpuset" {
			// A new v1 cpuset cgroup starts with no CPUs and no memory nodes:
			// inherit the parent's, as kubelet's own cgroups do.
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				if v, err := os.ReadFile(filepath.Join(root, f)); err == nil {
					_ = os.WriteFile(filepath.Join(d, f), v, 0o644)
				}
			}
		}
	}
	return created, nil
}

func (k *Kubelet) start(verbosity int) error {
	logf, err := os.OpenFile(k.LogPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	args := []string{"--config", k.ConfigPath, "--root-dir", k.RootDir, "--cert-dir", k.CertDir,
		"--hostname-override", k.NodeName, "-v", strconv.Itoa(verbosity)}
	if k.Kubeconfig != "" {
		// A registered kubelet refuses a loopback --node-ip ("nodeIP can't
		// be loopback address"): the Node gets the host's addresses.
		args = append(args, "--kubeconfig", k.Kubeconfig)
	} else {
		args = append(args, "--node-ip", "127.0.0.1")
	}
	args = append(args, k.extraArgs...)
	cmd := exec.Command(KubeletPath(), args...)
	cmd.Dir = k.Dir
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = filteredEnv("KUBECONFIG", "NOTIFY_SOCKET")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := startLocked(cmd); err != nil {
		return err
	}
	exited := make(chan struct{})
	go func() {
		err := cmd.Wait()
		k.mu.Lock()
		k.waitErr = err
		k.mu.Unlock()
		close(exited)
	}()
	k.mu.Lock()
	k.cmd, k.exited = cmd, exited
	k.mu.Unlock()
	deadline := time.Now().Add(90 * time.Second)
	var last error
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return fmt.Errorf("kubelet exited during start: %v", k.ExitError())
		default:
		}
		if last = k.ready(); last == nil {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("kubelet not ready after 90s: %v", last)
}

func (k *Kubelet) ready() error {
	body, err := httpGetBody(fmt.Sprintf("http://127.0.0.1:%d/healthz", k.HealthzPort))
	if err != nil {
		return err
	}
	if strings.TrimSpace(string(body)) != "ok" {
		return fmt.Errorf("healthz: %q", body)
	}
	_, err = k.Pods(context.Background())
	return err
}

func httpGetBody(url string) ([]byte, error) {
	c := &http.Client{Timeout: 3 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return b, fmt.Errorf("GET %s: %s: %s", url, resp.Status, strings.TrimSpace(string(b)))
	}
	return b, nil
}

// PID is the running kubelet's pid, 0 if none.
func (k *Kubelet) PID() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.cmd == nil {
		return 0
	}
	select {
	case <-k.exited:
		return 0
	default:
		return k.cmd.Process.Pid
	}
}

// ExitError is kubelet's wait error once it has exited.
func (k *Kubelet) ExitError() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.waitErr
}

// Stop sends SIGTERM to kubelet and waits (SIGKILL after 15 s). Its pods
// keep running, as with a real kubelet restart.
func (k *Kubelet) Stop() {
	k.mu.Lock()
	cmd, exited := k.cmd, k.exited
	k.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(15 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
	}
	k.mu.Lock()
	k.cmd = nil
	k.mu.Unlock()
}

// LogTail returns the last n lines of kubelet's log.
func (k *Kubelet) LogTail(n int) string {
	data, err := os.ReadFile(k.LogPath)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// LogGrep returns kubelet's log lines that contain any of substrs.
func (k *Kubelet) LogGrep(substrs ...string) []string {
	f, err := os.Open(k.LogPath)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		for _, s := range substrs {
			if strings.Contains(sc.Text(), s) {
				out = append(out, sc.Text())
				break
			}
		}
	}
	return out
}

// ---- static pods ----

// StaticPod is a static pod manifest.
type StaticPod struct {
	Name      string // file name and metadata.name (kubelet appends -NodeName)
	Namespace string // default "default"
	// RestartPolicy is Always, OnFailure or Never (default Always).
	RestartPolicy string
	// TerminationGracePeriodSeconds defaults to 2.
	TerminationGracePeriodSeconds int64
	Containers                    []StaticContainer
}

// StaticContainer is one container of a StaticPod.
type StaticContainer struct {
	Name    string
	Image   string
	Env     [][2]string // name, value
	Command []string
	Args    []string
	// ReadinessHTTP, when non-zero, adds an httpGet readiness probe on
	// that port at /healthz every second.
	ReadinessHTTP int
	// PreStopSleep, when non-zero, adds a preStop sleep handler of that
	// many seconds.
	PreStopSleep int64
}

// Manifest returns the pod as a JSON manifest, imagePullPolicy IfNotPresent.
func (p StaticPod) Manifest() []byte {
	ns := p.Namespace
	if ns == "" {
		ns = "default"
	}
	rp := p.RestartPolicy
	if rp == "" {
		rp = "Always"
	}
	grace := p.TerminationGracePeriodSeconds
	if grace == 0 {
		grace = 2
	}
	var cs []any
	for _, c := range p.Containers {
		m := map[string]any{"name": c.Name, "image": c.Image, "imagePullPolicy": "IfNotPresent"}
		var env []any
		for _, kv := range c.Env {
			env = append(env, map[string]string{"name": kv[0], "value": kv[1]})
		}
		if env != nil {
			m["env"] = env
		}
		if c.Command != nil {
			m["command"] = c.Command
		}
		if c.Args != nil {
			m["args"] = c.Args
		}
		if c.PreStopSleep != 0 {
			m["lifecycle"] = map[string]any{"preStop": map[string]any{"sleep": map[string]int64{"seconds": c.PreStopSleep}}}
		}
		if c.ReadinessHTTP != 0 {
			m["readinessProbe"] = map[string]any{
				"httpGet":       map[string]any{"path": "/healthz", "port": c.ReadinessHTTP},
				"periodSeconds": 1, "failureThreshold": 1,
			}
		}
		cs = append(cs, m)
	}
	pod := map[string]any{
		"apiVersion": "v1", "kind": "Pod",
		"metadata": map[string]any{"name": p.Name, "namespace": ns, "labels": map[string]string{"app": p.Name}},
		"spec": map[string]any{
			"restartPolicy": rp, "terminationGracePeriodSeconds": grace, "containers": cs,
			"enableServiceLinks": false,
		},
	}
	b, _ := json.MarshalIndent(pod, "", "  ")
	return b
}

// PodName is the name kubelet gives static pod name: name-NodeName.
func (k *Kubelet) PodName(name string) string { return name + "-" + k.NodeName }

// WritePod writes (or replaces) the manifest of p atomically.
func (k *Kubelet) WritePod(tb testing.TB, p StaticPod) {
	tb.Helper()
	tmp := filepath.Join(k.Dir, "."+p.Name+".json.tmp") // outside ManifestDir
	if err := os.WriteFile(tmp, p.Manifest(), 0o644); err != nil {
		tb.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(k.ManifestDir, p.Name+".json")); err != nil {
		tb.Fatal(err)
	}
}

// RemovePod removes the manifest of the static pod name: kubelet deletes the pod.
func (k *Kubelet) RemovePod(tb testing.TB, name string) {
	tb.Helper()
	if err := os.Remove(filepath.Join(k.ManifestDir, name+".json")); err != nil {
		tb.Fatal(err)
	}
}

// ---- pod status from the read-only port ----

// KubePod is the part of a v1.Pod the tests read.
type KubePod struct {
	Metadata struct {
		Name        string            `json:"name"`
		Namespace   string            `json:"namespace"`
		UID         string            `json:"uid"`
		Annotations map[string]string `json:"annotations"`
	} `json:"metadata"`
	Status struct {
		Phase      string `json:"phase"`
		PodIP      string `json:"podIP"`
		Conditions []struct {
			Type   string `json:"type"`
			Status string `json:"status"`
		} `json:"conditions"`
		ContainerStatuses []KubeContainerStatus `json:"containerStatuses"`
	} `json:"status"`
}

// KubeContainerStatus is a v1.ContainerStatus.
type KubeContainerStatus struct {
	Name         string             `json:"name"`
	Image        string             `json:"image"`
	ImageID      string             `json:"imageID"`
	ContainerID  string             `json:"containerID"`
	Ready        bool               `json:"ready"`
	Started      *bool              `json:"started"`
	RestartCount int32              `json:"restartCount"`
	State        KubeContainerState `json:"state"`
	LastState    KubeContainerState `json:"lastState"`
}

// KubeContainerState is a v1.ContainerState.
type KubeContainerState struct {
	Waiting *struct {
		Reason  string `json:"reason"`
		Message string `json:"message"`
	} `json:"waiting"`
	Running *struct {
		StartedAt string `json:"startedAt"`
	} `json:"running"`
	Terminated *struct {
		ExitCode    int32  `json:"exitCode"`
		Reason      string `json:"reason"`
		Message     string `json:"message"`
		ContainerID string `json:"containerID"`
	} `json:"terminated"`
}

// ID is the CRI container ID ("containerd://" stripped).
func (s KubeContainerStatus) ID() string {
	_, id, ok := strings.Cut(s.ContainerID, "://")
	if !ok {
		return s.ContainerID
	}
	return id
}

// Container returns the status of container name, nil if kubelet has none.
func (p *KubePod) Container(name string) *KubeContainerStatus {
	for i := range p.Status.ContainerStatuses {
		if p.Status.ContainerStatuses[i].Name == name {
			return &p.Status.ContainerStatuses[i]
		}
	}
	return nil
}

// Condition returns the status ("True"/"False") of a pod condition.
func (p *KubePod) Condition(typ string) string {
	for _, c := range p.Status.Conditions {
		if c.Type == typ {
			return c.Status
		}
	}
	return ""
}

// Pods reads kubelet's pods from the read-only port.
func (k *Kubelet) Pods(ctx context.Context) ([]KubePod, error) {
	body, err := httpGetBody(fmt.Sprintf("http://127.0.0.1:%d/pods", k.ReadOnlyPort))
	if err != nil {
		return nil, err
	}
	var l struct {
		Items []KubePod `json:"items"`
	}
	if err := json.Unmarshal(body, &l); err != nil {
		return nil, fmt.Errorf("decode /pods: %w", err)
	}
	return l.Items, nil
}

// Pod returns kubelet's pod ns/name (full name, with the node suffix), nil
// when kubelet has no such pod.
func (k *Kubelet) Pod(ctx context.Context, ns, name string) (*KubePod, error) {
	pods, err := k.Pods(ctx)
	if err != nil {
		return nil, err
	}
	for i := range pods {
		if pods[i].Metadata.Namespace == ns && pods[i].Metadata.Name == name {
			return &pods[i], nil
		}
	}
	return nil, nil
}

// WaitPod polls kubelet's pod ns/name until cond returns nil, and returns it.
func (k *Kubelet) WaitPod(tb testing.TB, ns, name string, timeout time.Duration, cond func(*KubePod) error) *KubePod {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	var last error
	for {
		select {
		case <-k.exitedCh():
			tb.Fatalf("kubelet exited: %v\n%s", k.ExitError(), k.LogTail(40))
		default:
		}
		p, err := k.Pod(context.Background(), ns, name)
		switch {
		case err != nil:
			last = err
		case p == nil:
			last = fmt.Errorf("kubelet has no pod %s/%s", ns, name)
		default:
			if last = cond(p); last == nil {
				return p
			}
		}
		if time.Now().After(deadline) {
			tb.Fatalf("pod %s/%s: not within %s: %v", ns, name, timeout, last)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (k *Kubelet) exitedCh() <-chan struct{} {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.exited == nil {
		return nil
	}
	return k.exited
}

// Running is a WaitPod condition: container name runs and is ready.
func Running(name string) func(*KubePod) error {
	return func(p *KubePod) error {
		c := p.Container(name)
		if c == nil {
			return fmt.Errorf("no status for container %q yet (phase %s)", name, p.Status.Phase)
		}
		if c.State.Running == nil || !c.Ready {
			b, _ := json.Marshal(c)
			return fmt.Errorf("container %q not running and ready: %s", name, b)
		}
		return nil
	}
}

// ---- teardown ----

// Close tears the kubelet down (tb.Cleanup calls it; it runs once):
//  1. SIGTERM kubelet (SIGKILL after 15 s), then SIGKILL whatever still has
//     Dir in its command line, and descendants;
//  2. through CRI, stop and remove the static pods' sandboxes (name suffix
//     "-"+NodeName) — at RuntimeEndpoint, or BackendEndpoint if that fails;
//  3. unmount everything below Dir; remove kubelet's symlinks into PodLogsDir
//     from /var/log/containers (and the directory if it was not there
//     before); remove the CgroupRoot tree; restore the kernel tunables;
//     remove Dir.
func (k *Kubelet) Close() error {
	k.closeOnce.Do(func() { k.closeErr = k.close() })
	return k.closeErr
}

func (k *Kubelet) close() error {
	var errs []error
	if k.tb.Failed() {
		k.tb.Logf("kubelet log (last 80 lines):\n%s", k.LogTail(80))
		saveArtifacts(k.tb, "-kubelet-"+filepath.Base(k.Dir), k.LogPath, k.ConfigPath)
	}
	uids := k.podUIDs()
	k.Stop()
	if err := killProcsOf(k.Dir, 15*time.Second); err != nil {
		errs = append(errs, err)
	}
	for uid := range k.podUIDs() {
		uids[uid] = true
	}
	if err := k.removePods(uids); err != nil {
		errs = append(errs, err)
	}
	if err := unmountUnder(k.Dir); err != nil {
		errs = append(errs, err)
	}
	removeLogSymlinks(k.PodLogsDir)
	if err := removeCgroups(k.createdCgroups, 20*time.Second); err != nil {
		errs = append(errs, err)
	}
	if err := machineRelease(); err != nil {
		errs = append(errs, err)
	}
	if len(mountsUnder(k.Dir)) == 0 {
		if err := os.RemoveAll(k.Dir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// podUIDs are the UIDs of the pods this kubelet knows: its pod directories
// (RootDir/pods/<uid>, made before a pod's sandbox), its pod log directories
// (PodLogsDir/<ns>_<name>_<uid>, removed by its garbage collection only after
// the pod's sandboxes) and, while it runs, the pods on its read-only port.
func (k *Kubelet) podUIDs() map[string]bool {
	uids := map[string]bool{}
	if ents, err := os.ReadDir(filepath.Join(k.RootDir, "pods")); err == nil {
		for _, e := range ents {
			uids[e.Name()] = true
		}
	}
	if ents, err := os.ReadDir(k.PodLogsDir); err == nil {
		for _, e := range ents {
			if i := strings.LastIndexByte(e.Name(), '_'); i >= 0 {
				uids[e.Name()[i+1:]] = true
			}
		}
	}
	if k.PID() != 0 {
		if pods, err := k.Pods(context.Background()); err == nil {
			for _, p := range pods {
				uids[p.Metadata.UID] = true
			}
		}
	}
	return uids
}

// removePods stops and removes the sandboxes of this kubelet's pods: the
// static pods' and those whose pod UID is in uids.
func (k *Kubelet) removePods(uids map[string]bool) error {
	err := k.removePodsAt(k.RuntimeEndpoint, uids)
	if err != nil && k.BackendEndpoint != "" {
		k.tb.Logf("kubelet cleanup: %v; removing the pods at %s", err, k.BackendEndpoint)
		err = k.removePodsAt(k.BackendEndpoint, uids)
	}
	return err
}

func (k *Kubelet) removePodsAt(endpoint string, uids map[string]bool) error {
	cli, err := dialCRI(endpoint)
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ids, err := k.sandboxes(ctx, cli, uids)
	if err != nil {
		return err
	}
	var errs []error
	for _, id := range ids {
		if _, err := cli.Runtime.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: id}); err != nil && status.Code(err) != codes.NotFound {
			errs = append(errs, fmt.Errorf("stop pod %s: %w", id, err))
		}
		if _, err := cli.Runtime.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id}); err != nil && status.Code(err) != codes.NotFound {
			errs = append(errs, fmt.Errorf("remove pod %s: %w", id, err))
		}
	}
	return errors.Join(errs...)
}

// sandboxes lists the IDs of this kubelet's pod sandboxes: static pods (name
// suffix) and pods whose UID label is in uids.
func (k *Kubelet) sandboxes(ctx context.Context, cli *CRIClient, uids map[string]bool) ([]string, error) {
	resp, err := cli.Runtime.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return nil, fmt.Errorf("list pod sandboxes: %w", err)
	}
	var ids []string
	for _, p := range resp.Items {
		if strings.HasSuffix(p.GetMetadata().GetName(), "-"+k.NodeName) || uids[p.GetMetadata().GetUid()] {
			ids = append(ids, p.Id)
		}
	}
	return ids, nil
}

// machineAcquire notes what kubelet changes outside its own directories
// before the first kubelet of the process (standalone or inside k3s) starts.
func machineAcquire() {
	machineState.mu.Lock()
	defer machineState.mu.Unlock()
	if machineState.live == 0 {
		machineState.sysctls = readSysctls()
		machineState.hadLogSymlink = exists(containerLogsDir)
		machineState.hadVarLib = exists(varLibKubelet)
		machineState.hadDevPlugins = exists(devicePluginDir)
	}
	machineState.live++
}

// machineRelease puts back what machineAcquire noted once the last kubelet
// of the process has stopped.
func machineRelease() error {
	machineState.mu.Lock()
	defer machineState.mu.Unlock()
	machineState.live--
	if machineState.live > 0 {
		return nil
	}
	err := restoreSysctls(machineState.sysctls)
	if !machineState.hadLogSymlink {
		_ = os.Remove(containerLogsDir) // only if empty
	}
	_ = os.Remove(devicePluginSock)
	if !machineState.hadDevPlugins {
		_ = os.Remove(devicePluginDir) // only if empty
	}
	if !machineState.hadVarLib {
		_ = os.Remove(varLibKubelet) // only if empty
	}
	return err
}

// removeLogSymlinks removes the links a kubelet made into podLogsDir.
func removeLogSymlinks(podLogsDir string) {
	for _, l := range logSymlinks(podLogsDir) {
		_ = os.Remove(l)
	}
}

// logSymlinks are the links in /var/log/containers into podLogsDir.
func logSymlinks(podLogsDir string) []string {
	ents, err := os.ReadDir(containerLogsDir)
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range ents {
		p := filepath.Join(containerLogsDir, e.Name())
		if t, err := os.Readlink(p); err == nil && under(t, podLogsDir) {
			out = append(out, p)
		}
	}
	return out
}

// removeCgroups removes the cgroup trees made by makeCgroupRoot, retrying
// while the last container processes exit.
func removeCgroups(created []string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		var errs []error
		for _, d := range created {
			if err := rmdirTree(d); err != nil {
				errs = append(errs, err)
			}
		}
		if len(errs) == 0 || time.Now().After(deadline) {
			return errors.Join(errs...)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// rmdirTree removes a cgroup directory and its sub-cgroups bottom-up.
func rmdirTree(top string) error {
	if _, err := os.Stat(top); err != nil {
		return nil
	}
	var dirs []string
	_ = filepath.WalkDir(top, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	var errs []error
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := os.Remove(dirs[i]); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("rmdir %s: %w", dirs[i], err))
		}
	}
	return errors.Join(errs...)
}

func readSysctls() map[string]string { return readTunables(kernelTunables) }

func restoreSysctls(before map[string]string) error { return writeTunables(before) }

// readTunables reads the sysctls (paths below /proc/sys) that exist.
func readTunables(names []string) map[string]string {
	out := map[string]string{}
	for _, s := range names {
		if b, err := os.ReadFile(filepath.Join("/proc/sys", s)); err == nil {
			out[s] = strings.TrimSpace(string(b))
		}
	}
	return out
}

// writeTunables sets the sysctls of before that have another value now.
func writeTunables(before map[string]string) error {
	var errs []error
	names := make([]string, 0, len(before))
	for s := range before {
		names = append(names, s)
	}
	now := readTunables(names)
	for s, v := range before {
		if now[s] == v {
			continue
		}
		if err := os.WriteFile(filepath.Join("/proc/sys", s), []byte(v), 0o644); err != nil {
			errs = append(errs, fmt.Errorf("restore sysctl %s=%s: %w", s, v, err))
		}
	}
	return errors.Join(errs...)
}

// nodeLeftovers is what a node's kubelet (the harness's or k3s's) can
// leave of its own: mounts below dir, its cgroup root, its
// /var/log/containers links and dir itself.
func nodeLeftovers(dir, cgroupRoot, podLogsDir string) []string {
	var out []string
	for _, m := range mountsUnder(dir) {
		out = append(out, "mount "+m)
	}
	for _, root := range cgroupRoots() {
		if d := filepath.Join(root, cgroupRoot); exists(d) {
			out = append(out, "cgroup "+d)
		}
	}
	for _, l := range logSymlinks(podLogsDir) {
		out = append(out, "symlink "+l)
	}
	if exists(dir) {
		out = append(out, "dir "+dir)
	}
	return out
}

// Leftovers describes what of this kubelet is still on the machine: its
// processes, mounts below Dir, its cgroups, its /var/log/containers links,
// Dir itself, and (while no other kubelet of the process runs) changed
// kernel tunables and a /var/log/containers it created. Empty after Close.
func (k *Kubelet) Leftovers() []string {
	var out []string
	for _, p := range procsOf(k.Dir) {
		out = append(out, fmt.Sprintf("process %d: %s", p.pid, p.cmdline))
	}
	out = append(out, nodeLeftovers(k.Dir, k.CgroupRoot, k.PodLogsDir)...)
	return append(out, machineLeftovers()...)
}

// machineLeftovers describes, while no kubelet of the process runs, changed
// kernel tunables, a /var/log/containers or /var/lib/kubelet created, and
// the device-plugin socket.
func machineLeftovers() []string {
	var out []string
	machineState.mu.Lock()
	defer machineState.mu.Unlock()
	if machineState.live == 0 {
		now := readSysctls()
		for s, v := range machineState.sysctls {
			if now[s] != v {
				out = append(out, fmt.Sprintf("sysctl %s=%s (was %s)", s, now[s], v))
			}
		}
		if !machineState.hadLogSymlink && exists(containerLogsDir) {
			out = append(out, "dir "+containerLogsDir)
		}
		if exists(devicePluginSock) {
			out = append(out, "socket "+devicePluginSock)
		}
		if !machineState.hadVarLib && exists(varLibKubelet) {
			out = append(out, "dir "+varLibKubelet)
		}
	}
	return out
}

func exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}
