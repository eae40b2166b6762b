package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func TestRegistryImages(t *testing.T) {
	reg := StartRegistry(t)
	images := reg.PushTestImages(t)
	for _, ref := range images.All() {
		r, err := name.ParseReference(ref, name.Insecure)
		if err != nil {
			t.Fatal(err)
		}
		img, err := remote.Image(r)
		if err != nil {
			t.Fatalf("%s: %v", ref, err)
		}
		m, err := img.Manifest()
		if err != nil {
			t.Fatalf("%s: manifest: %v", ref, err)
		}
		if m.MediaType != "application/vnd.oci.image.manifest.v1+json" {
			t.Errorf("%s: media type %s", ref, m.MediaType)
		}
	}
	// A second push to the same registry is a no-op returning the same refs.
	if again := reg.PushTestImages(t); again != images {
		t.Errorf("second PushTestImages = %+v, want %+v", again, images)
	}
	// App1 and App2 differ in their /app layer; Large has a big extra layer.
	digests := func(ref string) []string {
		r, _ := name.ParseReference(ref, name.Insecure)
		img, err := remote.Image(r)
		if err != nil {
			t.Fatal(err)
		}
		ls, err := img.Layers()
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, l := range ls {
			d, _ := l.Digest()
			out = append(out, d.String())
		}
		return out
	}
	a1, a2 := digests(images.App1), digests(images.App2)
	if len(a1) != 2 || len(a2) != 2 || a1[0] != a2[0] || a1[1] == a2[1] {
		t.Errorf("app layers: v1 %v, v2 %v: want a shared base and different app layers", a1, a2)
	}
	r, _ := name.ParseReference(images.Large, name.Insecure)
	large, err := remote.Image(r)
	if err != nil {
		t.Fatal(err)
	}
	ls, _ := large.Layers()
	if size, _ := ls[len(ls)-1].Size(); size < LargeFileSize {
		t.Errorf("large layer is %d bytes, want >= %d", size, LargeFileSize)
	}
}

// TestContainerd runs a pod with a CNI IP and the App1 container on each
// backend, execs into it, and checks that the teardown leaves nothing behind.
func TestContainerd(t *testing.T) {
	RequireRoot(t)
	RequireTool(t, "crictl", CrictlPath())
	reg := StartRegistry(t)
	images := reg.PushTestImages(t)
	for _, b := range BackendsFromEnv() {
		t.Run(string(b), func(t *testing.T) {
			c := StartContainerd(t, b, reg)
			testPodLifecycle(t, c, images)

			if err := c.Close(); err != nil {
				t.Fatalf("close: %v", err)
			}
			if left := c.Leftovers(); len(left) > 0 {
				t.Errorf("left behind after Close:\n%s", strings.Join(left, "\n"))
			}
			if out, err := os.ReadFile("/proc/self/mountinfo"); err == nil && strings.Contains(string(out), c.Dir) {
				t.Errorf("/proc/self/mountinfo still mentions %s", c.Dir)
			}
			if _, err := net.InterfaceByName(c.Bridge); err == nil {
				t.Errorf("bridge %s still exists", c.Bridge)
			}
			if _, err := os.Stat(filepath.Join("/sys/fs/cgroup/memory", CgroupParent("harness-pod"))); err == nil {
				t.Errorf("pod cgroup %s still exists", CgroupParent("harness-pod"))
			}
		})
	}
}

func testPodLifecycle(t *testing.T, c *Containerd, images Images) {
	t.Helper()
	tmp := t.TempDir()
	if out, err := c.Crictl(t, "pull", images.App1); err != nil {
		t.Fatalf("pull: %v\n%s", err, c.LogTail(20))
	} else {
		t.Logf("crictl pull: %s", strings.TrimSpace(out))
	}

	pod := PodConfig("harness-pod", filepath.Join(tmp, "logs"))
	podFile := writeJSON(t, tmp, "pod.json", pod)
	ctrFile := writeJSON(t, tmp, "ctr.json", ContainerConfig("app", images.App1))

	podID := mustCrictl(t, c, "runp", podFile)
	var inspect struct {
		Status struct {
			State   string `json:"state"`
			Network struct {
				IP string `json:"ip"`
			} `json:"network"`
		} `json:"status"`
	}
	if err := json.Unmarshal([]byte(mustCrictl(t, c, "inspectp", "-o", "json", podID)), &inspect); err != nil {
		t.Fatal(err)
	}
	_, subnet, _ := net.ParseCIDR(c.Subnet)
	if ip := net.ParseIP(inspect.Status.Network.IP); ip == nil || !subnet.Contains(ip) {
		t.Fatalf("pod IP %q not in %s", inspect.Status.Network.IP, c.Subnet)
	}
	t.Logf("pod %s: IP %s", podID[:12], inspect.Status.Network.IP)
	if _, err := net.InterfaceByName(c.Bridge); err != nil {
		t.Errorf("bridge %s: %v", c.Bridge, err)
	}

	ctrID := mustCrictl(t, c, "create", podID, ctrFile, podFile)
	mustCrictl(t, c, "start", ctrID)

	// Exec through ExecSync and through the streaming server.
	if out := mustCrictl(t, c, "exec", "-s", ctrID, "cat", "/VERSION"); out != "v1" {
		t.Errorf("exec -s cat /VERSION = %q, want v1", out)
	}
	if out := mustCrictl(t, c, "exec", ctrID, "cat", "/VERSION"); out != "v1" {
		t.Errorf("exec (streaming) cat /VERSION = %q, want v1", out)
	}
	// Kubelet's defaults: the container has its own PID namespace, /app is PID 1.
	if out := mustCrictl(t, c, "exec", "-s", ctrID, "cat", "/proc/1/comm"); out != "app" {
		t.Errorf("PID 1 of the container is %q, want app", out)
	}
	// The app answers on :8080 inside the pod (it may need a moment to listen).
	var got string
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		out, err := c.Crictl(t, "exec", "-s", ctrID, "wget", "-q", "-O", "-", fmt.Sprintf("http://127.0.0.1:%d/version", AppPort))
		if got = strings.TrimSpace(out); err == nil && got == "v1" {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if got != "v1" {
		t.Errorf("GET /version inside the pod = %q, want v1", got)
	}
	// The pod's cgroup parent is ours.
	if _, err := os.Stat(filepath.Join("/sys/fs/cgroup/memory", CgroupParent("harness-pod"))); err != nil {
		t.Errorf("pod cgroup: %v", err)
	}

	// The same through the Go CRI client: the container runs.
	cli := c.CRI(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := cli.Runtime.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: ctrID})
	if err != nil {
		t.Fatal(err)
	}
	if st.GetStatus().GetState() != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Errorf("container state %s", st.GetStatus().GetState())
	}
}

func TestContainerdRestart(t *testing.T) {
	RequireRoot(t)
	RequireTool(t, "crictl", CrictlPath())
	reg := StartRegistry(t)
	images := reg.PushTestImages(t)
	b := BackendsFromEnv()[0]
	c := StartContainerd(t, b, reg)
	tmp := t.TempDir()
	mustCrictl(t, c, "pull", images.App2)
	podFile := writeJSON(t, tmp, "pod.json", PodConfig("restart-pod", filepath.Join(tmp, "logs")))
	podID := mustCrictl(t, c, "runp", podFile)
	ctrID := mustCrictl(t, c, "create", podID, writeJSON(t, tmp, "ctr.json", ContainerConfig("app", images.App2)), podFile)
	mustCrictl(t, c, "start", ctrID)

	if err := c.Kill(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Crictl(t, "ps"); err == nil {
		t.Fatal("crictl ps works while containerd is killed")
	}
	if err := c.Start(); err != nil {
		t.Fatalf("restart: %v", err)
	}
	if out := mustCrictl(t, c, "exec", "-s", ctrID, "cat", "/VERSION"); out != "v2" {
		t.Errorf("after restart: /VERSION = %q, want v2", out)
	}
	// Close with containerd stopped: it is restarted for the CRI teardown.
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if left := c.Leftovers(); len(left) > 0 {
		t.Errorf("left behind after Close:\n%s", strings.Join(left, "\n"))
	}
}

func mustCrictl(t *testing.T, c *Containerd, args ...string) string {
	t.Helper()
	out, err := c.Crictl(t, args...)
	if err != nil {
		t.Fatalf("%v\ncontainerd log:\n%s", err, c.LogTail(30))
	}
	return strings.TrimSpace(out)
}

func writeJSON(t *testing.T, dir, name string, v any) string {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestAuthRegistry: docker-registry with htpasswd refuses anonymous
// requests and serves a copied image to its users; its log names who pulled.
func TestAuthRegistry(t *testing.T) {
	reg := StartRegistry(t)
	imgs := reg.PushTestImages(t)
	ar := StartAuthRegistry(t, reg, map[string]string{"alice": "pw-alice"})
	ref := ar.Copy(t, imgs.App2, "team/app:v2", "alice")
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := remote.Image(r); err == nil || !strings.Contains(err.Error(), "UNAUTHORIZED") {
		t.Fatalf("anonymous read of %s: %v, want UNAUTHORIZED", ref, err)
	}
	if _, err := remote.Image(r, remote.WithAuth(&authn.Basic{Username: "alice", Password: "pw-alice"})); err != nil {
		t.Fatalf("read of %s as alice: %v", ref, err)
	}
	if got := ar.Pulls("team/app"); len(got) != 1 || got[0] != "alice" {
		t.Fatalf("pulls of team/app recorded as %q, want one by alice; accesses %+v", got, ar.Accesses())
	}
	if !slices.Contains(reg.Links(), ar.Addr) {
		t.Fatalf("links %v: the auth registry is not served over plain HTTP to containerd", reg.Links())
	}
}
