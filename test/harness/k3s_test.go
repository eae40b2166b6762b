package harness

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// TestK3sConfig: a node's k3s config is the repository's deploy/k3s files
// with the node's paths in place of the documented ones, plus the
// harness's drop-in; no documented path is left over.
func TestK3sConfig(t *testing.T) {
	dir := t.TempDir()
	n := &K3sNode{
		Name: "ip3s-test", Dir: dir, DataDir: filepath.Join(dir, "data"), ConfigPath: filepath.Join(dir, "config.yaml"),
		CgroupRoot: "/inplaced-k3s-test", PodLogsDir: filepath.Join(dir, "pod-logs"), KubeletRootDir: filepath.Join(dir, "data", "kubelet"),
		Inplaced:   &Inplaced{Endpoint: "unix:///tmp/ipx1/i.sock"},
		Containerd: &Containerd{Socket: "/tmp/ipd1/c.sock"},
	}
	if err := n.writeConfig([2]int{10001, 10002}, map[string]any{"https-listen-port": 10003}); err != nil {
		t.Fatal(err)
	}
	read := func(p string) map[string]any {
		t.Helper()
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		for _, documented := range []string{"/run/inplaced/", "/run/containerd/", "/etc/rancher/"} {
			if strings.Contains(string(b), documented) {
				t.Errorf("%s still names %s:\n%s", p, documented, b)
			}
		}
		var m map[string]any
		if err := yaml.Unmarshal(b, &m); err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		return m
	}
	cfg := read(n.ConfigPath)
	if cfg["container-runtime-endpoint"] != n.Inplaced.Endpoint || cfg["image-service-endpoint"] != n.Inplaced.Endpoint {
		t.Errorf("config.yaml endpoints: %v", cfg)
	}
	if args, _ := cfg["kubelet-arg"].([]any); len(args) != 1 || args[0] != "containerd="+n.Containerd.Socket {
		t.Errorf("config.yaml kubelet-arg: %v", cfg["kubelet-arg"])
	}
	v1 := read(filepath.Join(dir, "config.yaml.d", "10-cgroupv1.yaml"))
	if args, _ := v1["kubelet-arg+"].([]any); len(args) != 1 || args[0] != "config="+filepath.Join(dir, "kubelet-cgroupv1.conf") {
		t.Errorf("10-cgroupv1.yaml kubelet-arg+: %v", v1["kubelet-arg+"])
	}
	kubelet := read(filepath.Join(dir, "kubelet-cgroupv1.conf"))
	if kubelet["failCgroupV1"] != false || kubelet["cgroupRoot"] != n.CgroupRoot || kubelet["port"] != float64(10001) || kubelet["kind"] != "KubeletConfiguration" {
		t.Errorf("kubelet-cgroupv1.conf: %v", kubelet)
	}
	own := read(filepath.Join(dir, "config.yaml.d", "90-test-harness.yaml"))
	if own["data-dir"] != n.DataDir || own["node-name"] != n.Name || own["https-listen-port"] != float64(10003) ||
		len(own["kubelet-arg+"].([]any)) != 1 {
		t.Errorf("90-test-harness.yaml: %v", own)
	}
}
