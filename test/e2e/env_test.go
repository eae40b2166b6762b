// Package e2e proves inplaced against a real containerd (2.4 and 1.6), runc,
// CNI bridge networking and a loopback registry, all started by the harness.
// Under CI=true a missing piece fails the run instead of skipping.
package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/test/harness"
)

// env is one backend with a proxy in front of it.
type env struct {
	ctrd   *harness.Containerd
	px     *harness.Inplaced
	cri    *harness.CRIClient // through the proxy
	direct *harness.CRIClient
	imgs   harness.Images
}

func newEnv(t *testing.T, c *harness.Containerd, daemonEnv ...string) *env {
	t.Helper()
	px := harness.StartInplaced(t, c.Endpoint, daemonEnv...)
	return &env{ctrd: c, px: px, cri: harness.DialCRI(t, px.Endpoint), direct: c.CRI(t), imgs: c.Images}
}

// forEachBackend runs fn as a subtest per backend, each with its own
// registry-mirroring containerd.
func forEachBackend(t *testing.T, fn func(t *testing.T, c *harness.Containerd), opts ...harness.Option) {
	forBackends(t, harness.BackendsFromEnv(), fn, opts...)
}

// forFirstBackend is forEachBackend on the first backend only, for what is
// inplaced's own behaviour (firstBackend).
func forFirstBackend(t *testing.T, fn func(t *testing.T, c *harness.Containerd), opts ...harness.Option) {
	forBackends(t, firstBackendOnly(t, harness.BackendsFromEnv()), fn, opts...)
}

// firstBackendOnly is backends cut to the first, saying so when it cuts.
func firstBackendOnly(t *testing.T, backends []harness.Backend) []harness.Backend {
	if len(backends) > 1 {
		t.Logf("inplaced's own behaviour, the same on every containerd: runs on %s only", backends[0])
		backends = backends[:1]
	}
	return backends
}

func forBackends(t *testing.T, backends []harness.Backend, fn func(t *testing.T, c *harness.Containerd), opts ...harness.Option) {
	harness.RequireRoot(t)
	harness.Require(t, "a containerd backend", len(backends) > 0, "no containerd found; run hack/install-deps.sh")
	reg := harness.StartRegistry(t)
	for _, b := range backends {
		t.Run(string(b), func(t *testing.T) {
			c := harness.StartContainerd(t, b, reg, opts...)
			fn(t, c)
		})
	}
}

// firstBackend reports whether b is the first of INPLACED_BACKENDS
// (containerd 2.4 in make test). What proves inplaced's own behaviour, the
// same on every containerd (its socket across restarts, the API server's
// absence, the kubectl plugin), runs there only: a second backend would
// add only time to make test.
func firstBackend(b harness.Backend) bool {
	bs := harness.BackendsFromEnv()
	return len(bs) > 0 && bs[0] == b
}

// onFirstBackend runs fn as subtest name when b is the first backend, and
// otherwise records the subtest as skipped, saying where it ran.
func onFirstBackend(t *testing.T, b harness.Backend, name string, fn func(t *testing.T)) {
	t.Run(name, func(t *testing.T) {
		if !firstBackend(b) {
			t.Skipf("inplaced's own behaviour, the same on every containerd: runs on %s only", harness.BackendsFromEnv()[0])
		}
		fn(t)
	})
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return c
}

// pod is a pod made the way kubelet makes one: kubelet's labels and
// annotations on the sandbox and container, attempt 0, log path <name>/0.log,
// and a host directory mounted at /data.
type pod struct {
	name, ns, uid string
	sandboxID     string
	containerID   string
	hostDir       string
	sandboxConfig *runtimeapi.PodSandboxConfig
	containerCfg  *runtimeapi.ContainerConfig
}

type podOpts struct {
	preStop    string // kubelet's preStopHandler annotation JSON
	env        map[string]string
	grace      int
	restartCnt int
	handler    string // CRI runtime handler ("" is containerd's default, runc)
	// command and args replace the image's entrypoint and command.
	command, args []string
	// annotations go on the sandbox (a pod's annotations, as kubelet
	// copies them).
	annotations map[string]string
	// ports is the container's declared ports, kubelet's annotation JSON.
	ports string
	// sidecar, when set, are the args of a second container, "sidecar",
	// running the same image.
	sidecar []string
}

func runPod(t *testing.T, cri *harness.CRIClient, name, image string, o podOpts) *pod {
	t.Helper()
	c := ctx(t)
	p := &pod{name: name, ns: "default", uid: "uid-" + name}
	p.hostDir = t.TempDir()
	logDir := t.TempDir()
	p.sandboxConfig = harness.PodConfig(name, logDir)
	p.sandboxConfig.Labels = map[string]string{
		"io.kubernetes.pod.name": name, "io.kubernetes.pod.namespace": p.ns, "io.kubernetes.pod.uid": p.uid, "app": name,
	}
	p.sandboxConfig.Annotations = o.annotations
	rs, err := cri.Runtime.RunPodSandbox(c, &runtimeapi.RunPodSandboxRequest{Config: p.sandboxConfig, RuntimeHandler: o.handler})
	if err != nil {
		t.Fatalf("RunPodSandbox: %v", err)
	}
	p.sandboxID = rs.PodSandboxId
	t.Cleanup(func() {
		cc, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, _ = cri.Runtime.StopPodSandbox(cc, &runtimeapi.StopPodSandboxRequest{PodSandboxId: p.sandboxID})
		_, _ = cri.Runtime.RemovePodSandbox(cc, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: p.sandboxID})
	})
	if _, err := cri.Image.PullImage(c, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: image}}); err != nil {
		t.Fatalf("PullImage %s: %v", image, err)
	}
	grace := o.grace
	if grace == 0 {
		grace = 5
	}
	cfg := harness.ContainerConfig("app", image)
	cfg.Image.UserSpecifiedImage = image
	cfg.Labels = map[string]string{
		"io.kubernetes.pod.name": name, "io.kubernetes.pod.namespace": p.ns, "io.kubernetes.pod.uid": p.uid,
		"io.kubernetes.container.name": "app",
	}
	cfg.Annotations = map[string]string{
		"io.kubernetes.container.hash":                     "1a2b3c4d",
		"io.kubernetes.container.restartCount":             strconv.Itoa(o.restartCnt),
		"io.kubernetes.container.terminationMessagePath":   "/dev/termination-log",
		"io.kubernetes.container.terminationMessagePolicy": "File",
		"io.kubernetes.pod.terminationGracePeriod":         strconv.Itoa(grace),
	}
	cfg.Metadata.Attempt = uint32(o.restartCnt)
	cfg.LogPath = fmt.Sprintf("app/%d.log", o.restartCnt)
	if o.preStop != "" {
		cfg.Annotations["io.kubernetes.container.preStopHandler"] = o.preStop
	}
	for k, v := range o.env {
		cfg.Envs = append(cfg.Envs, &runtimeapi.KeyValue{Key: k, Value: []byte(v)})
	}
	cfg.Mounts = []*runtimeapi.Mount{{HostPath: p.hostDir, ContainerPath: "/data"}}
	cfg.Command, cfg.Args = o.command, o.args
	if o.ports != "" {
		cfg.Annotations["io.kubernetes.container.ports"] = o.ports
	}
	if o.sidecar != nil {
		runSidecar(t, cri, p, image, o.sidecar)
	}
	p.containerCfg = cfg
	cr, err := cri.Runtime.CreateContainer(c, &runtimeapi.CreateContainerRequest{PodSandboxId: p.sandboxID, Config: cfg, SandboxConfig: p.sandboxConfig})
	if err != nil {
		t.Fatalf("CreateContainer: %v", err)
	}
	p.containerID = cr.ContainerId
	if _, err := cri.Runtime.StartContainer(c, &runtimeapi.StartContainerRequest{ContainerId: p.containerID}); err != nil {
		t.Fatalf("StartContainer: %v", err)
	}
	return p
}

// runSidecar starts a second container, "sidecar", in the pod.
func runSidecar(t *testing.T, cri *harness.CRIClient, p *pod, image string, args []string) {
	t.Helper()
	cfg := harness.ContainerConfig("sidecar", image)
	cfg.Labels = map[string]string{
		"io.kubernetes.pod.name": p.name, "io.kubernetes.pod.namespace": p.ns, "io.kubernetes.pod.uid": p.uid,
		"io.kubernetes.container.name": "sidecar",
	}
	cfg.Annotations = map[string]string{"io.kubernetes.container.hash": "5e6f7a8b", "io.kubernetes.container.restartCount": "0"}
	cfg.Args = args
	cr, err := cri.Runtime.CreateContainer(ctx(t), &runtimeapi.CreateContainerRequest{PodSandboxId: p.sandboxID, Config: cfg, SandboxConfig: p.sandboxConfig})
	if err != nil {
		t.Fatalf("CreateContainer sidecar: %v", err)
	}
	if _, err := cri.Runtime.StartContainer(ctx(t), &runtimeapi.StartContainerRequest{ContainerId: cr.ContainerId}); err != nil {
		t.Fatalf("StartContainer sidecar: %v", err)
	}
}

// containers lists the containers named "app" in the pod, newest first.
func (p *pod) containers(t *testing.T, cri *harness.CRIClient) []*runtimeapi.Container {
	t.Helper()
	resp, err := cri.Runtime.ListContainers(ctx(t), &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{
		PodSandboxId: p.sandboxID, LabelSelector: map[string]string{"io.kubernetes.container.name": "app"}}})
	if err != nil {
		t.Fatalf("ListContainers: %v", err)
	}
	cs := resp.Containers
	for i := range cs {
		for j := i + 1; j < len(cs); j++ {
			if cs[j].CreatedAt > cs[i].CreatedAt {
				cs[i], cs[j] = cs[j], cs[i]
			}
		}
	}
	return cs
}

// running returns the running "app" containers of the pod.
func (p *pod) running(t *testing.T, cri *harness.CRIClient) []*runtimeapi.Container {
	var out []*runtimeapi.Container
	for _, c := range p.containers(t, cri) {
		if c.State == runtimeapi.ContainerState_CONTAINER_RUNNING {
			out = append(out, c)
		}
	}
	return out
}

// info is the verbose info containerd gives about a container or sandbox.
type info struct {
	Pid         int `json:"pid"`
	RuntimeSpec struct {
		Linux struct {
			Namespaces []struct {
				Type string `json:"type"`
				Path string `json:"path"`
			} `json:"namespaces"`
			CgroupsPath string `json:"cgroupsPath"`
		} `json:"linux"`
	} `json:"runtimeSpec"`
}

func containerInfo(t *testing.T, cri *harness.CRIClient, id string) (*runtimeapi.ContainerStatus, info) {
	t.Helper()
	st, err := cri.Runtime.ContainerStatus(ctx(t), &runtimeapi.ContainerStatusRequest{ContainerId: id, Verbose: true})
	if err != nil {
		t.Fatalf("ContainerStatus %s: %v", id, err)
	}
	var in info
	if err := json.Unmarshal([]byte(st.Info["info"]), &in); err != nil {
		t.Fatalf("decode verbose info of %s: %v", id, err)
	}
	return st.Status, in
}

func sandboxInfo(t *testing.T, cri *harness.CRIClient, id string) (*runtimeapi.PodSandboxStatus, info) {
	t.Helper()
	st, err := cri.Runtime.PodSandboxStatus(ctx(t), &runtimeapi.PodSandboxStatusRequest{PodSandboxId: id, Verbose: true})
	if err != nil {
		t.Fatalf("PodSandboxStatus %s: %v", id, err)
	}
	var in info
	if err := json.Unmarshal([]byte(st.Info["info"]), &in); err != nil {
		t.Fatalf("decode verbose sandbox info: %v", err)
	}
	return st.Status, in
}

// netns returns the network namespace inode of a process.
func netns(t *testing.T, pid int) string {
	t.Helper()
	l, err := os.Readlink(filepath.Join("/proc", strconv.Itoa(pid), "ns", "net"))
	if err != nil {
		t.Fatalf("netns of pid %d: %v", pid, err)
	}
	return l
}

// eventually polls cond until it holds or the timeout passes.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var err error
	for time.Now().Before(deadline) {
		if err = cond(); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s: not within %s: %v", what, timeout, err)
}
