package swap

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/pkg/fence"
	"github.com/inplaced/inplaced/pkg/internal/fakecri"
	"github.com/inplaced/inplaced/pkg/kubeletview"
	"github.com/inplaced/inplaced/pkg/store"
	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

// TestRecoverJournalOfPreviousBuild is an upgrade in the middle of a swap:
// a journal written by the previous build (testdata/journal-7ec0191, see its
// README) when it was killed mid-swap is read by this build, which settles
// the swap against the runtime as the old process left it.
func TestRecoverJournalOfPreviousBuild(t *testing.T) {
	for _, tc := range []struct {
		fixture    string
		newRunning bool // the new container had been started
		state      inplacedv1.SwapState
	}{
		{"start-new", true, inplacedv1.SwapState_SWAP_STATE_COMMITTED},
		{"stop-old", false, inplacedv1.SwapState_SWAP_STATE_FAILED},
	} {
		t.Run(tc.fixture, func(t *testing.T) {
			dir := t.TempDir()
			data, err := os.ReadFile(filepath.Join("testdata", "journal-7ec0191", tc.fixture, "state.db"))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "state.db"), data, 0o600); err != nil {
				t.Fatal(err)
			}
			st, err := store.Open(dir)
			if err != nil {
				t.Fatalf("the previous build's state.db: %v", err)
			}
			defer st.Close()
			js, err := st.Journal()
			if err != nil || len(js) != 1 {
				t.Fatalf("journal of the previous build: %v, %v; want one entry", js, err)
			}
			j := js[0]
			t.Logf("journal entry %s at step %s: old %s, new %s (attempt %d)", j.SwapID, j.Step, j.OldContainerID, j.NewContainerID, j.NewAttempt)

			// The runtime as the killed process left it.
			be := fakecri.Start(t)
			ctx := context.Background()
			pod := fakecri.PodConfig("default", "web", "uid-web")
			sb, err := be.RuntimeClient.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: pod})
			if err != nil || sb.PodSandboxId != j.SandboxID {
				t.Fatalf("sandbox %v, %v; the journal names %s", sb, err, j.SandboxID)
			}
			oldReq, newReq := &runtimeapi.CreateContainerRequest{}, &runtimeapi.CreateContainerRequest{}
			if err := proto.Unmarshal(j.OldRequest, oldReq); err != nil {
				t.Fatal(err)
			}
			if err := proto.Unmarshal(j.NewRequest, newReq); err != nil {
				t.Fatal(err)
			}
			oldID := createIn(t, be, oldReq, true)
			if _, err := be.RuntimeClient.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: oldID}); err != nil {
				t.Fatal(err)
			}
			newID := createIn(t, be, newReq, tc.newRunning)
			if oldID != j.OldContainerID || (j.NewContainerID != "" && newID != j.NewContainerID) {
				t.Fatalf("runtime IDs old %s new %s, the journal names %s and %s", oldID, newID, j.OldContainerID, j.NewContainerID)
			}

			eng, err := New(Options{Runtime: be.RuntimeClient, Images: be.ImageClient, Store: st, Fences: fence.NewRegistry(),
				Kubelet: kubeletview.New(), Logger: zaptest.NewLogger(t), HealthMinRuntime: 50 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			if err := eng.Recover(ctx); err != nil {
				t.Fatalf("Recover: %v", err)
			}
			if js, err := st.Journal(); err != nil || len(js) != 0 {
				t.Errorf("journal after recovery: %v, %v; want it empty", js, err)
			}
			rec, err := st.Swap(j.SwapID)
			if err != nil || rec.State != tc.state {
				t.Fatalf("swap record after recovery: %v, %v; want %s", rec, err, tc.state)
			}
			running := be.Named(j.SandboxID, "app")
			var up []string
			for _, c := range running {
				if c.State == runtimeapi.ContainerState_CONTAINER_RUNNING {
					up = append(up, c.Id)
				}
			}
			if len(up) != 1 || up[0] != rec.RunningContainerId {
				t.Fatalf("running containers %v, the record says %s", up, rec.RunningContainerId)
			}
			img := be.Container(up[0]).GetImage().GetImage()
			o, oerr := st.Override(j.SandboxID, "app")
			switch tc.state {
			case inplacedv1.SwapState_SWAP_STATE_COMMITTED:
				if up[0] != newID || oerr != nil || o.Image != "registry.local/app:v2" {
					t.Errorf("rolled forward: running %s (new %s), override %+v, %v", up[0], newID, o, oerr)
				}
			default:
				if up[0] == newID || up[0] == oldID || img != oldReq.GetConfig().GetImage().GetImage() || oerr == nil {
					t.Errorf("rolled back: running %s image %s (old %s, new %s), override %+v", up[0], img, oldID, newID, o)
				}
			}
			t.Logf("settled %s: %s, running %s", j.SwapID, rec.State, rec.RunningContainerId)
		})
	}
}

func createIn(t *testing.T, be *fakecri.Backend, req *runtimeapi.CreateContainerRequest, start bool) string {
	t.Helper()
	ctx := context.Background()
	resp, err := be.RuntimeClient.CreateContainer(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if start {
		if _, err := be.RuntimeClient.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: resp.ContainerId}); err != nil {
			t.Fatal(err)
		}
	}
	return resp.ContainerId
}
