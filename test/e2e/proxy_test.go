package e2e

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/test/harness"
)

// TestCrictlThroughProxy drives crictl v1.37 at the proxy socket through a
// pod's whole life and checks each answer.
func TestCrictlThroughProxy(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c *harness.Containerd) {
		e := newEnv(t, c)
		crictl := func(args ...string) string {
			t.Helper()
			out, err := harness.Crictl(t, e.px.Endpoint, args...)
			if err != nil {
				t.Fatalf("%v\ninplaced log:\n%s", err, e.px.LogTail(20))
			}
			return strings.TrimSpace(out)
		}
		dir := t.TempDir()
		podCfg := harness.PodConfig("crictl-pod", t.TempDir())
		writeJSON(t, filepath.Join(dir, "pod.json"), podCfg)
		ctrCfg := harness.ContainerConfig("app", e.imgs.App1)
		writeJSON(t, filepath.Join(dir, "ctr.json"), ctrCfg)

		// pull + images
		crictl("pull", e.imgs.App1)
		if imgs := crictl("images", "-q"); imgs == "" {
			t.Fatal("crictl images: empty after pull")
		}
		if out := crictl("images"); !strings.Contains(out, strings.Split(e.imgs.App1, ":")[0]+":") && !strings.Contains(out, "app") {
			t.Fatalf("crictl images does not list %s:\n%s", e.imgs.App1, out)
		}
		// runp
		podID := crictl("runp", filepath.Join(dir, "pod.json"))
		if len(podID) < 12 {
			t.Fatalf("runp returned %q", podID)
		}
		t.Cleanup(func() {
			_, _ = harness.Crictl(t, e.px.Endpoint, "stopp", podID)
			_, _ = harness.Crictl(t, e.px.Endpoint, "rmp", "-f", podID)
		})
		// inspectp: pod IP from CNI
		var sb struct {
			Status struct {
				State   string `json:"state"`
				Network struct {
					IP string `json:"ip"`
				} `json:"network"`
			} `json:"status"`
		}
		mustJSON(t, crictl("inspectp", podID), &sb)
		if sb.Status.State != "SANDBOX_READY" || !strings.HasPrefix(sb.Status.Network.IP, "10.") {
			t.Fatalf("inspectp: state %q ip %q, want SANDBOX_READY and a CNI 10.x address", sb.Status.State, sb.Status.Network.IP)
		}
		// create + start
		ctrID := crictl("create", podID, filepath.Join(dir, "ctr.json"), filepath.Join(dir, "pod.json"))
		crictl("start", ctrID)
		// ps
		if out := crictl("ps", "-q", "--pod", podID); out != ctrID {
			t.Fatalf("ps -q: %q, want %q", out, ctrID)
		}
		// inspect
		var ci struct {
			Status struct {
				State string `json:"state"`
			} `json:"status"`
			Info struct {
				Pid int `json:"pid"`
			} `json:"info"`
		}
		mustJSON(t, crictl("inspect", ctrID), &ci)
		if ci.Status.State != "CONTAINER_RUNNING" || ci.Info.Pid == 0 {
			t.Fatalf("inspect: state %q pid %d", ci.Status.State, ci.Info.Pid)
		}
		// exec
		if out := crictl("exec", ctrID, "cat", "/VERSION"); out != "v1" {
			t.Fatalf("exec cat /VERSION: %q", out)
		}
		// logs: the app prints its version when it starts
		eventually(t, 10*time.Second, "app log line", func() error {
			out, err := harness.Crictl(t, e.px.Endpoint, "logs", ctrID)
			if err != nil {
				return err
			}
			if !strings.Contains(out, "v1") {
				return errorf("logs: %q", out)
			}
			return nil
		})
		// stats
		var st struct {
			Stats []struct {
				Attributes struct {
					ID string `json:"id"`
				} `json:"attributes"`
				Memory struct {
					WorkingSetBytes struct {
						Value string `json:"value"`
					} `json:"workingSetBytes"`
				} `json:"memory"`
			} `json:"stats"`
		}
		mustJSON(t, crictl("stats", "-o", "json", "--id", ctrID), &st)
		if len(st.Stats) != 1 || st.Stats[0].Attributes.ID != ctrID || st.Stats[0].Memory.WorkingSetBytes.Value == "" {
			t.Fatalf("stats: %+v", st)
		}
		// stop, rm, rmp
		crictl("stop", ctrID)
		mustJSON(t, crictl("inspect", ctrID), &ci)
		if ci.Status.State != "CONTAINER_EXITED" {
			t.Fatalf("after stop: %s", ci.Status.State)
		}
		crictl("rm", ctrID)
		if out := crictl("ps", "-a", "-q", "--pod", podID); out != "" {
			t.Fatalf("after rm, ps -a: %q", out)
		}
		crictl("stopp", podID)
		crictl("rmp", podID)
		if out := crictl("pods", "-q", "--id", podID); out != "" {
			t.Fatalf("after rmp, pods: %q", out)
		}
	})
}

// TestBackendRestart: containerd killed and restarted under a running proxy.
func TestBackendRestart(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c *harness.Containerd) {
		e := newEnv(t, c)
		pid := e.px.PID()
		call := func() error {
			cc, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_, err := e.cri.Runtime.Version(cc, &runtimeapi.VersionRequest{})
			return err
		}
		if err := call(); err != nil {
			t.Fatalf("Version before restart: %v", err)
		}
		if err := c.Kill(); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		err := call()
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("with containerd down: %v, want Unavailable", err)
		}
		if d := time.Since(start); d > 3*time.Second {
			t.Fatalf("Unavailable took %s: not prompt", d)
		}
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		eventually(t, 30*time.Second, "Version through the proxy after containerd is back", call)
		if e.px.PID() != pid || pid == 0 {
			t.Fatalf("inplaced pid %d → %d: it restarted", pid, e.px.PID())
		}
	})
}

// TestGracefulShutdown: SIGTERM ends a stream, removes the sockets, exits 0.
func TestGracefulShutdown(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c *harness.Containerd) {
		e := newEnv(t, c)
		fi, err := os.Stat(e.px.Socket)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Fatalf("socket mode %v, want 0600", fi.Mode().Perm())
		}
		stream, err := e.cri.Runtime.GetContainerEvents(context.Background(), &runtimeapi.GetEventsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		recvErr := make(chan error, 1)
		go func() {
			_, err := stream.Recv()
			recvErr <- err
		}()
		time.Sleep(200 * time.Millisecond)
		if err := e.px.Stop(); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-recvErr:
			if err == nil {
				t.Fatal("event stream got an event instead of ending")
			}
		case <-time.After(15 * time.Second):
			t.Fatal("event stream did not end on SIGTERM")
		}
		if err := e.px.ExitError(); err != nil {
			t.Fatalf("inplaced exit: %v, want exit 0", err)
		}
		for _, s := range []string{e.px.Socket, e.px.ControlSocket} {
			if _, err := os.Stat(s); !os.IsNotExist(err) {
				t.Fatalf("socket %s left after exit", s)
			}
		}
	})
}

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

func mustJSON(t *testing.T, s string, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(s), v); err != nil {
		t.Fatalf("decode %q: %v", s, err)
	}
}

type strErr string

func (e strErr) Error() string { return string(e) }

func errorf(format string, a ...any) error { return strErr(sprintf(format, a...)) }
