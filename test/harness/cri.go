package harness

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// CRIClient is a CRI v1 client on a unix socket endpoint.
type CRIClient struct {
	Conn    *grpc.ClientConn
	Runtime runtimeapi.RuntimeServiceClient
	Image   runtimeapi.ImageServiceClient
}

// Close closes the connection.
func (c *CRIClient) Close() error { return c.Conn.Close() }

func dialCRI(endpoint string) (*CRIClient, error) {
	if !strings.HasPrefix(endpoint, "unix://") {
		endpoint = "unix://" + endpoint
	}
	conn, err := grpc.NewClient(endpoint,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16<<20)))
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", endpoint, err)
	}
	return &CRIClient{
		Conn:    conn,
		Runtime: runtimeapi.NewRuntimeServiceClient(conn),
		Image:   runtimeapi.NewImageServiceClient(conn),
	}, nil
}

// DialCRI connects to a CRI endpoint ("unix:///path" or a socket path); tb.Cleanup
// closes the connection.
func DialCRI(tb testing.TB, endpoint string) *CRIClient {
	tb.Helper()
	c, err := dialCRI(endpoint)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// CRI returns a CRI client connected to this containerd.
func (c *Containerd) CRI(tb testing.TB) *CRIClient { return DialCRI(tb, c.Endpoint) }

// WaitCRIReady waits until the CRI endpoint answers Status with every
// condition true (e.g. a proxy in front of containerd).
func WaitCRIReady(endpoint string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		c, err := dialCRI(endpoint)
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		resp, err := c.Runtime.Status(ctx, &runtimeapi.StatusRequest{})
		cancel()
		_ = c.Close()
		if err == nil {
			last = nil
			for _, cond := range resp.GetStatus().GetConditions() {
				if !requiredCondition(cond.GetType()) {
					continue
				}
				if !cond.GetStatus() {
					last = fmt.Errorf("%s: %s", cond.GetType(), cond.GetMessage())
				}
			}
			if last == nil {
				return nil
			}
		} else {
			last = err
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("%s not ready after %s: %v", endpoint, timeout, last)
}

// requiredCondition tells the runtime conditions CRI requires: RuntimeReady
// and NetworkReady. containerd 2.x on cgroup v1 adds a false
// "ContainerdHasNoDeprecationWarnings" that says nothing about readiness.
func requiredCondition(t string) bool {
	return t == runtimeapi.RuntimeReady || t == runtimeapi.NetworkReady
}

// Crictl runs crictl v1.37 against endpoint (runtime and image endpoint) and
// returns its standard output. The error holds the exit status and stderr.
func Crictl(tb testing.TB, endpoint string, args ...string) (string, error) {
	tb.Helper()
	RequireTool(tb, "crictl", CrictlPath())
	if !strings.Contains(endpoint, "://") {
		endpoint = "unix://" + endpoint
	}
	// --config /dev/null: no /etc/crictl.yaml of the machine, no warning about it.
	full := append([]string{"--config", "/dev/null", "--runtime-endpoint", endpoint, "--image-endpoint", endpoint, "--timeout", "2m"}, args...)
	cmd := exec.Command(CrictlPath(), full...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("crictl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// Crictl runs crictl against this containerd.
func (c *Containerd) Crictl(tb testing.TB, args ...string) (string, error) {
	tb.Helper()
	return Crictl(tb, c.Endpoint, args...)
}

// cgroupParentRoot is the cgroupfs parent under which test pods run.
const cgroupParentRoot = "/inplaced-test"

var (
	cgroupMu      sync.Mutex
	cgroupParents = map[string]bool{}
)

// CgroupParent is the cgroupfs parent ("/inplaced-test/<pod>") to put in a test
// pod's LinuxPodSandboxConfig.CgroupParent. The last containerd instance of the
// process to close removes it (if empty) in every hierarchy.
func CgroupParent(podName string) string {
	p := path.Join(cgroupParentRoot, strings.ReplaceAll(podName, "/", "_"))
	cgroupMu.Lock()
	cgroupParents[p] = true
	cgroupMu.Unlock()
	return p
}

func removeCgroupParents() error {
	cgroupMu.Lock()
	ps := make([]string, 0, len(cgroupParents))
	for p := range cgroupParents {
		ps = append(ps, p)
	}
	clear(cgroupParents)
	cgroupMu.Unlock()
	sort.Sort(sort.Reverse(sort.StringSlice(ps)))
	var errs []string
	for _, p := range ps {
		if err := removeCgroupTree(p); err != nil {
			errs = append(errs, err.Error())
		}
	}
	removeEmptyCgroup(cgroupParentRoot) // shared with other processes' tests: only if empty
	if len(errs) > 0 {
		return fmt.Errorf("cgroups: %s", strings.Join(errs, "; "))
	}
	return nil
}

// PodConfig is a minimal pod sandbox config for a test pod named name in
// namespace "default", with its cgroup under CgroupParent(name), logs in
// logDir and kubelet's namespace defaults (a PID namespace per container,
// network and IPC per pod).
func PodConfig(name, logDir string) *runtimeapi.PodSandboxConfig {
	return &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{
			Name:      name,
			Namespace: "default",
			Uid:       "uid-" + name,
		},
		Hostname:     name,
		LogDirectory: logDir,
		Linux: &runtimeapi.LinuxPodSandboxConfig{
			CgroupParent:    CgroupParent(name),
			SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{NamespaceOptions: kubeletNamespaces()},
		},
	}
}

// kubeletNamespaces are the namespace options kubelet sends for a pod without
// hostNetwork/hostPID/hostIPC/shareProcessNamespace. (CRI's zero value for the
// PID mode is POD: a shared PID namespace.)
func kubeletNamespaces() *runtimeapi.NamespaceOption {
	return &runtimeapi.NamespaceOption{
		Network: runtimeapi.NamespaceMode_POD,
		Pid:     runtimeapi.NamespaceMode_CONTAINER,
		Ipc:     runtimeapi.NamespaceMode_POD,
	}
}

// ContainerConfig is a minimal container config running image with its own
// entrypoint, logging to <name>/0.log under the pod's log directory, with
// kubelet's namespace defaults (see PodConfig).
func ContainerConfig(name, image string) *runtimeapi.ContainerConfig {
	return &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: name},
		Image:    &runtimeapi.ImageSpec{Image: image},
		LogPath:  name + "/0.log",
		Linux: &runtimeapi.LinuxContainerConfig{
			SecurityContext: &runtimeapi.LinuxContainerSecurityContext{NamespaceOptions: kubeletNamespaces()},
		},
	}
}
