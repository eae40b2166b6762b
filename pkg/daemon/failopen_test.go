package daemon

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/pkg/config"
	"github.com/inplaced/inplaced/pkg/internal/fakecri"
	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

// TestFailOpen starts the daemon with everything of its own broken at once
// — a damaged state.db, a metrics address in use, a regular file where the
// control socket goes, a kubeconfig that does not exist — and checks that
// kubelet's calls pass through from the start, that each part is reported
// with what to do, that swaps and resizes are refused, and that each part
// comes back on its own once its cause is gone.
func TestFailOpen(t *testing.T) {
	be := fakecri.Start(t)
	dir, err := os.MkdirTemp("", "ipfo")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	stateDir := filepath.Join(dir, "state")
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	junk := bytes.Repeat([]byte("damaged "), 4096)
	stateDB := filepath.Join(stateDir, "state.db")
	if err := os.WriteFile(stateDB, junk, 0o600); err != nil {
		t.Fatal(err)
	}
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	cfg := config.Default()
	cfg.Listen = filepath.Join(dir, "cri.sock")
	cfg.ControlSocket = filepath.Join(dir, "ctl.sock")
	cfg.StateDir = stateDir
	cfg.RuntimeEndpoint = be.Endpoint
	cfg.MetricsListen = busy.Addr().String()
	cfg.Kubeconfig = filepath.Join(dir, "kubelet.conf")
	cfg.NodeName = "node-a"
	cfg.CgroupRoot = dir // no cgroup hierarchy: resizes via the backend only
	if err := os.WriteFile(cfg.ControlSocket, nil, 0o600); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg, zaptest.NewLogger(t)) }()
	defer func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("Run did not return")
		}
	}()

	cri := dial(t, cfg.Listen)
	rt := runtimeapi.NewRuntimeServiceClient(cri)
	waitFor(t, 10*time.Second, "CRI served", func() error {
		_, err := rt.Version(context.Background(), &runtimeapi.VersionRequest{})
		return err
	})
	pod := fakecri.PodConfig("default", "web", "uid-web")
	sb, err := rt.RunPodSandbox(context.Background(), &runtimeapi.RunPodSandboxRequest{Config: pod})
	if err != nil {
		t.Fatalf("RunPodSandbox through a daemon with a damaged store: %v", err)
	}
	c, err := rt.CreateContainer(context.Background(), &runtimeapi.CreateContainerRequest{PodSandboxId: sb.PodSandboxId, SandboxConfig: pod,
		Config: fakecri.ContainerConfig(pod, "app", 0, "sha256:v1", "registry.local/app:v1", "h")})
	if err != nil {
		t.Fatalf("CreateContainer: %v", err)
	}
	if _, err := rt.StartContainer(context.Background(), &runtimeapi.StartContainerRequest{ContainerId: c.ContainerId}); err != nil {
		t.Fatalf("StartContainer: %v", err)
	}
	// kubelet's resize goes to the backend as it came.
	if _, err := rt.UpdateContainerResources(context.Background(), &runtimeapi.UpdateContainerResourcesRequest{ContainerId: c.ContainerId,
		Linux: &runtimeapi.LinuxContainerResources{CpuQuota: 50000, CpuPeriod: 100000}}); err != nil {
		t.Errorf("kubelet's UpdateContainerResources with the store out: %v", err)
	}

	// The control socket comes up once the file in its way is gone.
	if err := os.Remove(cfg.ControlSocket); err != nil {
		t.Fatal(err)
	}
	ctl := inplacedv1.NewControlClient(dial(t, cfg.ControlSocket))
	var st *inplacedv1.StatusResponse
	waitFor(t, 3*listenRetry, "control socket served", func() (err error) {
		st, err = ctl.Status(context.Background(), &inplacedv1.StatusRequest{})
		return err
	})
	parts := map[string]*inplacedv1.HealthProblem{}
	for _, p := range st.Problems {
		parts[p.Part] = p
	}
	if st.SwapsAllowed || st.Kubernetes != "waiting" || parts["state"] == nil || parts["kubeconfig"] == nil || parts["metrics"] == nil {
		t.Fatalf("status: %v; want swaps refused, Kubernetes mode waiting, state, kubeconfig and metrics out", st)
	}
	if p := parts["state"]; !p.BlocksSwaps || !strings.Contains(p.Action, "move it aside") {
		t.Errorf("state problem %v: want it to block swaps and say to move the file aside", p)
	}
	s, err := ctl.Swap(context.Background(), &inplacedv1.SwapRequest{Target: &inplacedv1.Target{ContainerId: c.ContainerId},
		Change: &inplacedv1.Change{Image: ptr("registry.local/app:v2")}})
	if err == nil {
		_, err = s.Recv()
	}
	if err == nil || !strings.Contains(err.Error(), "refused") || !strings.Contains(err.Error(), "move it aside") {
		t.Errorf("swap with the store out: %v; want it refused with the action", err)
	}
	if _, err := ctl.Resize(context.Background(), &inplacedv1.ResizeRequest{Target: &inplacedv1.Target{ContainerId: c.ContainerId},
		Resources: &inplacedv1.Resources{CpuLimitMillis: 500}}); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Errorf("resize with the store out: %v; want it refused", err)
	}

	// Each part comes back on its own once its cause is gone; the damaged
	// file was kept as it was.
	if got, err := os.ReadFile(stateDB); err != nil || !bytes.Equal(got, junk) {
		t.Fatalf("the damaged state.db was changed (%v)", err)
	}
	if err := os.Rename(stateDB, stateDB+".damaged"); err != nil {
		t.Fatal(err)
	}
	busy.Close()
	waitFor(t, 15*time.Second, "state and metrics back", func() error {
		st, err := ctl.Status(context.Background(), &inplacedv1.StatusRequest{})
		if err != nil {
			return err
		}
		if !st.SwapsAllowed || len(st.Problems) != 1 || st.Problems[0].Part != "kubeconfig" {
			return fmt.Errorf("status %v", st)
		}
		return nil
	})
	if _, err := ctl.Resize(context.Background(), &inplacedv1.ResizeRequest{Target: &inplacedv1.Target{ContainerId: c.ContainerId},
		Resources: &inplacedv1.Resources{CpuLimitMillis: 500}}); err != nil && strings.Contains(err.Error(), "refused") {
		t.Errorf("resize with the store back: %v", err)
	}
}

func dial(t *testing.T, path string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func waitFor(t *testing.T, d time.Duration, what string, f func() error) {
	t.Helper()
	var err error
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if err = f(); err == nil {
			return
		}
	}
	t.Fatalf("%s: not within %s: %v", what, d, err)
}

func ptr[T any](v T) *T { return &v }
