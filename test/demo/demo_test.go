// Package demo is `make demo`: a private containerd and inplaced, a pod run
// through the proxy with crictl, an in-place swap of its container, then a
// full clean-up. Each line it prints says what it did.
package demo

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/inplaced/inplaced/test/harness"
)

func TestDemo(t *testing.T) {
	say := func(format string, a ...any) { t.Helper(); t.Logf(format, a...) }
	backend := harness.Containerd2
	if !backend.Available() {
		backend = harness.Containerd16
	}
	reg := harness.StartRegistry(t)
	say("registry on %s with locally built test images", reg.Addr)
	c := harness.StartContainerd(t, backend, reg)
	say("private %s: %s (CNI bridge %s, %s)", backend, c.Endpoint, c.Bridge, c.Subnet)
	px := harness.StartInplaced(t, c.Endpoint)
	say("inplaced: CRI proxy on %s, control socket %s", px.Endpoint, px.ControlSocket)

	crictl := func(args ...string) string {
		t.Helper()
		out, err := harness.Crictl(t, px.Endpoint, args...)
		if err != nil {
			t.Fatal(err)
		}
		out = strings.TrimSpace(out)
		say("$ crictl %s\n%s", strings.Join(args, " "), indent(out))
		return out
	}
	dir := t.TempDir()
	pod := harness.PodConfig("demo", t.TempDir())
	pod.Labels = map[string]string{"io.kubernetes.pod.name": "demo", "io.kubernetes.pod.namespace": "default", "io.kubernetes.pod.uid": "uid-demo"}
	writeJSON(t, filepath.Join(dir, "pod.json"), pod)
	ctr := harness.ContainerConfig("app", c.Images.App1)
	ctr.Labels = map[string]string{"io.kubernetes.pod.name": "demo", "io.kubernetes.pod.namespace": "default",
		"io.kubernetes.pod.uid": "uid-demo", "io.kubernetes.container.name": "app"}
	ctr.Annotations = map[string]string{"io.kubernetes.container.hash": "demo", "io.kubernetes.container.restartCount": "0"}
	writeJSON(t, filepath.Join(dir, "ctr.json"), ctr)

	crictl("pull", c.Images.App1)
	podID := crictl("runp", filepath.Join(dir, "pod.json"))
	t.Cleanup(func() {
		_, _ = harness.Crictl(t, px.Endpoint, "stopp", podID)
		_, _ = harness.Crictl(t, px.Endpoint, "rmp", "-f", podID)
	})
	ip := crictl("inspectp", "-o", "go-template", "--template", "{{.status.network.ip}}", podID)
	ctrID := crictl("create", podID, filepath.Join(dir, "ctr.json"), filepath.Join(dir, "pod.json"))
	crictl("start", ctrID)
	crictl("ps", "--pod", podID)
	crictl("exec", ctrID, "cat", "/VERSION")

	out, err := px.Ctl("swap", "demo", "-n", "default", "-c", "app", "--image", c.Images.App2, "--env", "GREETING=hello", "--min-runtime", "1s")
	if err != nil {
		t.Fatalf("swap: %v\n%s", err, out)
	}
	say("$ inplacectl swap demo -n default -c app --image %s --env GREETING=hello\n%s", c.Images.App2, indent(strings.TrimSpace(out)))
	crictl("ps", "-a", "--pod", podID)
	newIP := crictl("inspectp", "-o", "go-template", "--template", "{{.status.network.ip}}", podID)
	ids := strings.Fields(crictl("ps", "-q", "--pod", podID))
	if len(ids) != 1 {
		t.Fatalf("running containers after swap: %v", ids)
	}
	crictl("exec", ids[0], "cat", "/VERSION")
	crictl("exec", ids[0], "sh", "-c", "echo GREETING=$GREETING")
	if newIP != ip {
		t.Fatalf("pod IP changed %s → %s", ip, newIP)
	}
	say("same sandbox %s, same IP %s; the container now runs v2 — no pod was recreated", podID[:13], ip)
	hist, _ := px.Ctl("swaps")
	say("$ inplacectl swaps\n%s", indent(strings.TrimSpace(hist)))
	say("cleaning up: pod, inplaced, containerd, bridge, registry")
}

func indent(s string) string { return "    " + strings.ReplaceAll(s, "\n", "\n    ") }

func writeJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}
