package swap

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/pkg/holdmode"
	"github.com/inplaced/inplaced/pkg/store"
	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

// leftHold is a Holder after a crash: only Remove is expected of it.
type leftHold struct{ removed []string }

func (h *leftHold) Ports(string, int, []uint16) (HoldPorts, error) {
	return HoldPorts{}, errors.New("recovery finds no ports")
}

func (h *leftHold) Hold(context.Context, string, []uint16, holdmode.Mode) (ActiveHold, error) {
	return nil, errors.New("recovery installs no hold")
}

func (h *leftHold) Remove(netns string) ([]string, error) {
	h.removed = append(h.removed, netns)
	return []string{"inplaced_hold_8080"}, nil
}

// crashedSwap journals a swap of the app container at step, as a crash
// leaves it: the old container (stopped when oldStopped) and the new one,
// created, its ID journaled. It returns the swap's ID and the new
// container's.
func crashedSwap(t *testing.T, e *env, step store.JournalStep, oldStopped bool, hold *store.JournalHold) (swapID, newID string) {
	t.Helper()
	ctx := context.Background()
	oldReq := e.containerReq(0)
	oldID := e.create(t, oldReq, true)
	if oldStopped {
		if _, err := e.be.RuntimeClient.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: oldID}); err != nil {
			t.Fatal(err)
		}
	}
	newCfg := applyChange(oldReq.Config, &inplacedv1.Change{Image: strp("registry.local/app:v2")}, "sha256:v2", "registry.local/app:v2")
	attempt := nextAttempt(newCfg, oldReq.Config)
	newReq := &runtimeapi.CreateContainerRequest{PodSandboxId: e.sbID, Config: newCfg, SandboxConfig: e.pod}
	newID = e.create(t, newReq, false)
	rec := &inplacedv1.SwapRecord{Id: newID0(), Kind: KindSwap, Container: "app", SandboxId: e.sbID, OldContainerId: oldID,
		RunningContainerId: oldID, NewContainerId: newID, State: inplacedv1.SwapState_SWAP_STATE_RUNNING, StartedUnixNano: time.Now().UnixNano()}
	j := &store.JournalEntry{SwapID: rec.Id, Kind: KindSwap, Step: step, SandboxID: e.sbID, ContainerName: "app",
		OldContainerID: oldID, NewContainerID: newID, NewAttempt: attempt, Hold: hold}
	j.OldRequest, _ = proto.Marshal(oldReq)
	j.NewRequest, _ = proto.Marshal(newReq)
	j.Record, _ = proto.Marshal(rec)
	if err := e.st.PutJournal(j); err != nil {
		t.Fatal(err)
	}
	return rec.Id, newID
}

// The executor removes the connection hold the crash left, and says so in
// the swap's record.
func TestRecoverRemovesTheHold(t *testing.T) {
	e := newEnv(t)
	h := &leftHold{}
	e.eng.holder = h
	id, newID := crashedSwap(t, e, store.StepPreStop, false,
		&store.JournalHold{NetNS: "/var/run/netns/cni-1", Ports: []uint16{8080}, Mode: string(holdmode.Queue)})
	if err := e.eng.Recover(context.Background()); err != nil {
		t.Fatalf("Recover: %v", err)
	}
	if fmt.Sprint(h.removed) != "[/var/run/netns/cni-1]" {
		t.Errorf("holds removed in %v, want the journaled netns", h.removed)
	}
	rec, err := e.st.Swap(id)
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != inplacedv1.SwapState_SWAP_STATE_FAILED || rec.Hold.GetReason() != "crash-recovered" || fmt.Sprint(rec.Hold.GetPorts()) != "[8080]" {
		t.Errorf("record %s, hold %v", rec.State, rec.Hold)
	}
	if e.be.Container(newID) != nil {
		t.Errorf("new container %s left behind", newID)
	}
}

// A runtime that cannot be asked leaves the entry for the next start, but
// the hold goes at once.
func TestRecoverRuntimeDownKeepsTheEntry(t *testing.T) {
	e := newEnv(t)
	h := &leftHold{}
	e.eng.holder = h
	crashedSwap(t, e, store.StepStopOld, true, &store.JournalHold{NetNS: "/var/run/netns/cni-1", Ports: []uint16{8080}, Mode: string(holdmode.Queue)})
	e.be.Runtime.InjectError("ListContainers", status.Error(codes.Unavailable, "containerd is restarting"))
	err := e.eng.Recover(context.Background())
	if err == nil || !strings.Contains(err.Error(), "list containers") || !strings.Contains(err.Error(), "containerd is restarting") {
		t.Errorf("Recover: %v, want the runtime's error", err)
	}
	if len(h.removed) != 1 {
		t.Errorf("holds removed in %v, want the journaled netns", h.removed)
	}
	if js, _ := e.st.Journal(); len(js) != 1 {
		t.Errorf("journal %v, want the entry kept", js)
	}
}

// A rollback whose recreate fails ends ROLLBACK_FAILED, with nothing
// running and the new container gone: kubelet recreates the container.
func TestRecoverRollbackFails(t *testing.T) {
	e := newEnv(t)
	id, newID := crashedSwap(t, e, store.StepStopOld, true, nil)
	e.be.Runtime.InjectError("CreateContainer", status.Error(codes.Internal, "no space left on device"))
	if err := e.eng.Recover(context.Background()); err != nil {
		t.Fatalf("Recover: %v", err)
	}
	rec, err := e.st.Swap(id)
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != inplacedv1.SwapState_SWAP_STATE_ROLLBACK_FAILED || rec.RunningContainerId != "" ||
		!strings.Contains(rec.Error, "could not be recreated") || !strings.Contains(rec.Error, "no space left on device") {
		t.Errorf("record %s running %q: %s", rec.State, rec.RunningContainerId, rec.Error)
	}
	if run := e.running(); len(run) != 0 {
		t.Errorf("running %v, want nothing", run)
	}
	if e.be.Container(newID) != nil {
		t.Errorf("new container %s left behind", newID)
	}
	if js, _ := e.st.Journal(); len(js) != 0 {
		t.Errorf("journal %v, want it cleared", js)
	}
}
