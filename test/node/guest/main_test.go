// Package guest holds the suites that run inside the node guest of `make
// test-node` (see test/node): a Debian 12 guest with systemd as PID 1, cgroup
// v2, containerd (1.6 or 2.4) with SystemdCgroup = true, a standalone kubelet
// with cgroupDriver: systemd, and inplaced installed from the README as a
// systemd unit. The host compiles them with `go test -c` and the guest's
// run.sh (fixture/run.sh) runs the binary; outside the guest they skip.
//
// The suites use the node as it is: the system containerd, inplaced and
// kubelet units, the sockets at their default paths. They serve the test
// images from a registry on 127.0.0.1:5000 inside this process, which
// containerd knows as a mirror (fixture/hosts.toml). kubelet is registered as
// Node "node" to the API server the host test runs (10.0.2.100:6443, the
// guest's only network); the suites use it with the admin kubeconfig at
// $INPLACED_KUBECONFIG for pods bound to the node and the Node itself. CI is
// the host's: harness.Require fails rather than skips under CI=true.
package guest

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/test/harness"
)

// The node as run.sh set it up.
const (
	proxySocket      = "/run/inplaced/inplaced.sock"
	controlSocket    = "/run/inplaced/control.sock"
	containerdSocket = "/run/containerd/containerd.sock"
	stateDir         = "/var/lib/inplaced"
	manifestDir      = "/etc/kubernetes/manifests"
	kubeletPods      = "http://127.0.0.1:10255/pods"
	kubeletHealthz   = "http://127.0.0.1:10248/healthz"
	registryAddr     = "127.0.0.1:5000"
	nodeName         = "node"
	cgroupRoot       = "/sys/fs/cgroup"
)

// Images in the guest's registry.
var (
	imgBusybox = registryAddr + "/busybox:1.36"
	imgApp1    = registryAddr + "/app:v1"
	imgApp2    = registryAddr + "/app:v2"
	imgPause   = registryAddr + "/pause:3.10"
)

func TestMain(m *testing.M) {
	// -test.list runs on the host too: the host test lists what each suite
	// must report PASS for.
	flag.Parse()
	if f := flag.Lookup("test.list"); f != nil && f.Value.String() != "" {
		os.Exit(m.Run())
	}
	if os.Getenv("INPLACED_GUEST") != "1" {
		fmt.Println("guest suites: skipped (they run inside the node guest of make test-node; INPLACED_GUEST=1 there)")
		os.Exit(0)
	}
	stop, err := serveImages()
	if err != nil {
		fmt.Fprintf(os.Stderr, "guest: test images: %v\n", err)
		os.Exit(1)
	}
	code := m.Run()
	stop()
	os.Exit(code)
}

// serveImages starts the registry and pushes the test images: busybox (the
// guest's /bin/busybox), app:v1/v2 (test/images/app built on the host), and
// pause (app as /pause -listen=).
func serveImages() (func(), error) {
	start := time.Now()
	ln, err := net.Listen("tcp", registryAddr)
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: registry.New(registry.Logger(log.New(io.Discard, "", 0))), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	stop := func() { _ = srv.Close() }

	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		stop()
		return nil, err
	}
	appDir := os.Getenv("INPLACED_APP_DIR")
	files := func(extra map[string][]byte) (v1.Layer, error) {
		f := map[string][]byte{"bin/busybox": bb}
		for k, v := range extra {
			f[k] = v
		}
		return layer(f)
	}
	base, err := files(nil)
	if err != nil {
		stop()
		return nil, err
	}
	imgs := map[string]struct {
		layers []v1.Layer
		cfg    v1.Config
	}{imgBusybox: {[]v1.Layer{base}, v1.Config{Cmd: []string{"sh"}}}}
	for ref, v := range map[string]string{imgApp1: "v1", imgApp2: "v2"} {
		bin, err := os.ReadFile(filepath.Join(appDir, "app-"+v))
		if err != nil {
			stop()
			return nil, err
		}
		l, err := layer(map[string][]byte{"app": bin, "VERSION": []byte(v + "\n")})
		if err != nil {
			stop()
			return nil, err
		}
		imgs[ref] = struct {
			layers []v1.Layer
			cfg    v1.Config
		}{[]v1.Layer{base, l}, v1.Config{Entrypoint: []string{"/app"}}}
		if v == "v1" {
			p, err := layer(map[string][]byte{"pause": bin})
			if err != nil {
				stop()
				return nil, err
			}
			imgs[imgPause] = struct {
				layers []v1.Layer
				cfg    v1.Config
			}{[]v1.Layer{base, p}, v1.Config{Entrypoint: []string{"/pause", "-listen="}}}
		}
	}
	for ref, s := range imgs {
		img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
		img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
		if img, err = mutate.AppendLayers(img, s.layers...); err == nil {
			img, err = mutate.Config(img, s.cfg)
		}
		if err != nil {
			stop()
			return nil, err
		}
		tag, err := name.NewTag(ref, name.Insecure)
		if err == nil {
			err = remote.Write(tag, img)
		}
		if err != nil {
			stop()
			return nil, fmt.Errorf("push %s: %w", ref, err)
		}
	}
	fmt.Printf("guest: %d test images on %s in %s\n", len(imgs), registryAddr, time.Since(start).Round(time.Millisecond))
	return stop, nil
}

// layer is an uncompressed tar of files (busybox gets its applets as hard
// links): gzip under TCG costs more than the loopback "network" saves.
func layer(files map[string][]byte) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	for p, data := range files {
		if d := filepath.Dir(p); d != "." && !dirs[d] {
			dirs[d] = true
			if err := tw.WriteHeader(&tar.Header{Name: d + "/", Typeflag: tar.TypeDir, Mode: 0o755}); err != nil {
				return nil, err
			}
		}
		if err := tw.WriteHeader(&tar.Header{Name: p, Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(data))}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
		if p == "bin/busybox" {
			for _, a := range []string{"sh", "sleep", "head", "tr", "cat", "echo", "ls", "env", "true", "ps", "dd", "date", "wget", "grep"} {
				if err := tw.WriteHeader(&tar.Header{Name: "bin/" + a, Typeflag: tar.TypeLink, Linkname: "bin/busybox", Mode: 0o755}); err != nil {
					return nil, err
				}
			}
			for _, d := range []string{"tmp/", "etc/", "proc/", "sys/", "dev/"} {
				if err := tw.WriteHeader(&tar.Header{Name: d, Typeflag: tar.TypeDir, Mode: 0o755}); err != nil {
					return nil, err
				}
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return static.NewLayer(buf.Bytes(), types.OCIUncompressedLayer), nil
}

// ---- the node ----

// unitProps reads properties of a systemd unit.
func unitProps(t *testing.T, unit string, props ...string) map[string]string {
	t.Helper()
	out, err := exec.Command("systemctl", "show", unit, "-p", strings.Join(props, ",")).CombinedOutput()
	if err != nil {
		t.Fatalf("systemctl show %s: %v\n%s", unit, err, out)
	}
	m := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		k, v, _ := strings.Cut(line, "=")
		m[k] = v
	}
	return m
}

func systemctl(t *testing.T, args ...string) {
	t.Helper()
	start := time.Now()
	if out, err := exec.Command("systemctl", args...).CombinedOutput(); err != nil {
		t.Fatalf("systemctl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	t.Logf("systemctl %s: %s", strings.Join(args, " "), time.Since(start).Round(time.Millisecond))
}

func inplacectl(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "/usr/local/bin/inplacectl", args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("inplacectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return string(out), nil
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return c
}

func eventually(t *testing.T, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s: %v", what, timeout, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// ---- kubelet's static pods ----

// pod is a static pod manifest with one container.
type pod struct {
	name, image string
	command     []string
	env         [][2]string
	// cpu and memory requests and limits ("250m", "128Mi"); a limit above the
	// request makes the pod Burstable: kubepods-burstable-pod<uid>.slice.
	cpuReq, cpuLim, memReq, memLim string
	readinessHTTP                  int
	annotations                    map[string]string
}

const container = "app"

func (p pod) manifest() []byte {
	c := map[string]any{"name": container, "image": p.image, "imagePullPolicy": "IfNotPresent"}
	if p.command != nil {
		c["command"] = p.command
	}
	var env []any
	for _, kv := range p.env {
		env = append(env, map[string]string{"name": kv[0], "value": kv[1]})
	}
	if env != nil {
		c["env"] = env
	}
	res := map[string]any{}
	req, lim := map[string]string{}, map[string]string{}
	for k, v := range map[string]string{"cpu": p.cpuReq, "memory": p.memReq} {
		if v != "" {
			req[k] = v
		}
	}
	for k, v := range map[string]string{"cpu": p.cpuLim, "memory": p.memLim} {
		if v != "" {
			lim[k] = v
		}
	}
	if len(req) > 0 {
		res["requests"] = req
	}
	if len(lim) > 0 {
		res["limits"] = lim
	}
	c["resources"] = res
	if p.readinessHTTP != 0 {
		c["readinessProbe"] = map[string]any{"httpGet": map[string]any{"path": "/healthz", "port": p.readinessHTTP}, "periodSeconds": 1}
	}
	m := map[string]any{
		"apiVersion": "v1", "kind": "Pod",
		"metadata": map[string]any{"name": p.name, "namespace": "default", "annotations": p.annotations},
		"spec":     map[string]any{"containers": []any{c}, "terminationGracePeriodSeconds": 2, "enableServiceLinks": false},
	}
	b, _ := json.MarshalIndent(m, "", "  ")
	return b
}

// writePods declares pods to kubelet; t.Cleanup removes them and waits until
// kubelet has stopped their containers.
func writePods(t *testing.T, pods ...pod) {
	t.Helper()
	for _, p := range pods {
		path := filepath.Join(manifestDir, p.name+".json")
		tmp := filepath.Join(os.TempDir(), p.name+".json")
		if err := os.WriteFile(tmp, p.manifest(), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = os.Remove(path) })
	}
}

// podName is kubelet's name for static pod name.
func podName(name string) string { return name + "-" + nodeName }

func kubeletPod(name string) (*harness.KubePod, error) {
	c := http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(kubeletPods)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var l struct {
		Items []harness.KubePod `json:"items"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&l); err != nil {
		return nil, fmt.Errorf("decode %s: %w", kubeletPods, err)
	}
	for i := range l.Items {
		if l.Items[i].Metadata.Name == podName(name) {
			return &l.Items[i], nil
		}
	}
	return nil, fmt.Errorf("kubelet has no pod %s", podName(name))
}

// waitPod waits until kubelet shows pod name with cond true.
func waitPod(t *testing.T, name string, timeout time.Duration, cond func(*harness.KubePod) error) *harness.KubePod {
	t.Helper()
	var p *harness.KubePod
	eventually(t, timeout, "pod "+podName(name), func() error {
		var err error
		if p, err = kubeletPod(name); err != nil {
			return err
		}
		return cond(p)
	})
	return p
}

func kubeletHealthy() error {
	c := http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(kubeletHealthz)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("kubelet /healthz: %s: %s", resp.Status, b)
	}
	return nil
}

// ---- CRI ----

// ctrInfo is what the tests need of a container.
type ctrInfo struct {
	status      *runtimeapi.ContainerStatus
	pid         int
	cgroupsPath string
	sandboxID   string
}

func inspect(t *testing.T, cri *harness.CRIClient, id string) ctrInfo {
	t.Helper()
	st, err := cri.Runtime.ContainerStatus(ctx(t), &runtimeapi.ContainerStatusRequest{ContainerId: id, Verbose: true})
	if err != nil {
		t.Fatalf("ContainerStatus %s: %v", id, err)
	}
	var info struct {
		Pid         int    `json:"pid"`
		SandboxID   string `json:"sandboxID"`
		RuntimeSpec struct {
			Linux struct {
				CgroupsPath string `json:"cgroupsPath"`
			} `json:"linux"`
		} `json:"runtimeSpec"`
	}
	if err := json.Unmarshal([]byte(st.Info["info"]), &info); err != nil {
		t.Fatalf("decode verbose info of %s: %v", id, err)
	}
	return ctrInfo{status: st.Status, pid: info.Pid, cgroupsPath: info.RuntimeSpec.Linux.CgroupsPath, sandboxID: info.SandboxID}
}

// procCgroup is the cgroup v2 path of a process ("/kubepods.slice/...").
func procCgroup(t *testing.T, pid int) string {
	t.Helper()
	s := readFile(t, "/proc/"+strconv.Itoa(pid)+"/cgroup")
	p, ok := strings.CutPrefix(s, "0::")
	if !ok {
		t.Fatalf("/proc/%d/cgroup is not a cgroup v2 line: %q", pid, s)
	}
	return p
}

func isUnavailable(err error) bool {
	return err != nil && strings.Contains(err.Error(), "Unavailable")
}

var errNotYet = errors.New("not yet")
