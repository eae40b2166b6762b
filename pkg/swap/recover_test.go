package swap

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/pkg/store"
	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

// TestRecover writes, for every journal step, the entry a swap leaves when
// inplaced dies during that step, sets the fake backend to each state the
// runtime can then be in, and checks that Recover converges: one running
// container of the name, the right final state, nothing left behind.
func TestRecover(t *testing.T) {
	const (
		oldRunning = iota
		oldExited
	)
	const (
		newNone = iota
		newCreated
		newRunning
		newExited
		newRemoved // created then removed by a rollback that got further
	)
	const (
		wantOld      = "old"
		wantNew      = "new"
		wantRecreate = "recreated"
		wantRollback = "rollback" // the rollback container the swap had started
		wantNothing  = ""
	)
	for _, tc := range []struct {
		name        string
		step        store.JournalStep
		old         int
		new         int
		journalID   bool // NewContainerID in the journal
		rollbackRan bool // a rollback container of the old config runs
		sandboxGone bool
		state       inplacedv1.SwapState
		running     string
	}{
		{"prepared", store.StepPrepared, oldRunning, newNone, false, false, false, inplacedv1.SwapState_SWAP_STATE_FAILED, wantOld},
		{"pre-stop", store.StepPreStop, oldRunning, newNone, false, false, false, inplacedv1.SwapState_SWAP_STATE_FAILED, wantOld},
		{"stop-old, not yet stopped", store.StepStopOld, oldRunning, newNone, false, false, false, inplacedv1.SwapState_SWAP_STATE_FAILED, wantOld},
		{"stop-old, stopped", store.StepStopOld, oldExited, newNone, false, false, false, inplacedv1.SwapState_SWAP_STATE_FAILED, wantRecreate},
		{"create-new, not created", store.StepCreateNew, oldExited, newNone, false, false, false, inplacedv1.SwapState_SWAP_STATE_FAILED, wantRecreate},
		{"create-new, created, ID not journaled", store.StepCreateNew, oldExited, newCreated, false, false, false, inplacedv1.SwapState_SWAP_STATE_FAILED, wantRecreate},
		{"create-new, created, ID journaled", store.StepCreateNew, oldExited, newCreated, true, false, false, inplacedv1.SwapState_SWAP_STATE_FAILED, wantRecreate},
		{"create-new, running, ID not journaled", store.StepCreateNew, oldExited, newRunning, false, false, false, inplacedv1.SwapState_SWAP_STATE_COMMITTED, wantNew},
		{"start-new, not started", store.StepStartNew, oldExited, newCreated, true, false, false, inplacedv1.SwapState_SWAP_STATE_FAILED, wantRecreate},
		{"start-new, running", store.StepStartNew, oldExited, newRunning, true, false, false, inplacedv1.SwapState_SWAP_STATE_COMMITTED, wantNew},
		{"start-new, exited", store.StepStartNew, oldExited, newExited, true, false, false, inplacedv1.SwapState_SWAP_STATE_FAILED, wantRecreate},
		{"health-gate, running", store.StepHealthGate, oldExited, newRunning, true, false, false, inplacedv1.SwapState_SWAP_STATE_COMMITTED, wantNew},
		{"health-gate, exited", store.StepHealthGate, oldExited, newExited, true, false, false, inplacedv1.SwapState_SWAP_STATE_FAILED, wantRecreate},
		{"rolling-back, new still running", store.StepRollingBack, oldExited, newRunning, true, false, false, inplacedv1.SwapState_SWAP_STATE_FAILED, wantRecreate},
		{"rolling-back, new removed", store.StepRollingBack, oldExited, newRemoved, true, false, false, inplacedv1.SwapState_SWAP_STATE_FAILED, wantRecreate},
		{"rolling-back, rollback container runs", store.StepRollingBack, oldExited, newRemoved, true, true, false, inplacedv1.SwapState_SWAP_STATE_FAILED, wantRollback},
		{"rolling-back after a failed create", store.StepRollingBack, oldExited, newNone, false, true, false, inplacedv1.SwapState_SWAP_STATE_FAILED, wantRollback},
		{"sandbox gone", store.StepHealthGate, oldExited, newRunning, true, false, true, inplacedv1.SwapState_SWAP_STATE_ABORTED, wantNothing},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			ctx := context.Background()
			oldReq := e.containerReq(0)
			oldID := e.create(t, oldReq, true)
			if tc.old == oldExited {
				if _, err := e.be.RuntimeClient.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: oldID}); err != nil {
					t.Fatal(err)
				}
			}

			// The new config as the swap built it before its pre-stop step.
			newCfg := applyChange(oldReq.Config, &inplacedv1.Change{Image: strp("registry.local/app:v2")}, "sha256:v2", "registry.local/app:v2")
			attempt := nextAttempt(newCfg, oldReq.Config)
			newReq := &runtimeapi.CreateContainerRequest{PodSandboxId: e.sbID, Config: newCfg, SandboxConfig: e.pod}

			var newID string
			if tc.new != newNone {
				newID = e.create(t, newReq, tc.new == newRunning || tc.new == newExited)
				switch tc.new {
				case newExited:
					e.be.SetState(newID, runtimeapi.ContainerState_CONTAINER_EXITED, 1)
				case newRemoved:
					if _, err := e.be.RuntimeClient.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: newID}); err != nil {
						t.Fatal(err)
					}
				}
			}
			var rollbackID string
			if tc.rollbackRan {
				rb := proto.Clone(oldReq).(*runtimeapi.CreateContainerRequest)
				nextAttempt(rb.Config, newCfg)
				rollbackID = e.create(t, rb, true)
			}
			if tc.sandboxGone {
				if _, err := e.be.RuntimeClient.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: e.sbID}); err != nil {
					t.Fatal(err)
				}
			}

			// The journal entry as run.journal writes it at tc.step.
			rec := &inplacedv1.SwapRecord{Id: newID0(), Kind: "swap", Namespace: "default", Pod: "web", Container: "app",
				SandboxId: e.sbID, OldContainerId: oldID, RunningContainerId: oldID,
				State: inplacedv1.SwapState_SWAP_STATE_RUNNING, StartedUnixNano: time.Now().UnixNano()}
			j := &store.JournalEntry{SwapID: rec.Id, Kind: "swap", Step: tc.step, SandboxID: e.sbID, ContainerName: "app", OldContainerID: oldID}
			j.OldRequest, _ = proto.Marshal(oldReq)
			if tc.step != store.StepPrepared {
				j.NewAttempt = attempt
				j.NewRequest, _ = proto.Marshal(newReq)
			}
			if tc.journalID {
				j.NewContainerID = newID
				rec.NewContainerId = newID
			}
			j.Record, _ = proto.Marshal(rec)
			if err := e.st.PutJournal(j); err != nil {
				t.Fatal(err)
			}

			if err := e.eng.Recover(ctx); err != nil {
				t.Fatalf("Recover: %v", err)
			}

			got, err := e.st.Swap(rec.Id)
			if err != nil {
				t.Fatalf("no history record after recovery: %v", err)
			}
			if got.State != tc.state {
				t.Errorf("state %s (%s), want %s", got.State, got.Error, tc.state)
			}
			if js, _ := e.st.Journal(); len(js) != 0 {
				t.Errorf("journal not cleared: %v", js)
			}
			all := e.be.Named(e.sbID, "app")
			run := e.running()
			if tc.running == wantNothing {
				if len(run) != 0 || got.RunningContainerId != "" {
					t.Errorf("running %v (record %q), want nothing", run, got.RunningContainerId)
				}
			} else if len(run) != 1 {
				t.Fatalf("%d running containers named app, want exactly 1: %v", len(run), all)
			} else if run[0].Id != got.RunningContainerId {
				t.Errorf("running %q, record says %q", run[0].Id, got.RunningContainerId)
			}
			if newID != "" && tc.running != wantNew && e.be.Container(newID) != nil {
				t.Errorf("new container %s (%s) left behind", newID, e.be.Container(newID).State)
			}
			if len(run) != 1 {
				return
			}
			r := run[0]
			switch tc.running {
			case wantOld:
				if r.Id != oldID {
					t.Errorf("running %q, want the old container %q", r.Id, oldID)
				}
				if n := len(all); n != 1 {
					t.Errorf("%d containers named app, want the old one only", n)
				}
			case wantNew:
				if r.Id != newID {
					t.Errorf("running %q, want the new container %q", r.Id, newID)
				}
				if got.NewContainerId != newID {
					t.Errorf("record new ID %q, want %q", got.NewContainerId, newID)
				}
				o, err := e.st.Override(e.sbID, "app")
				if err != nil || o.Image != "registry.local/app:v2" || o.Hash != appHash {
					t.Errorf("override after roll-forward: %+v, %v", o, err)
				}
				if _, err := e.st.Container(newID); err != nil {
					t.Errorf("rolled-forward container not recorded: %v", err)
				}
			case wantRollback:
				if r.Id != rollbackID {
					t.Errorf("running %q, want the rollback container %q (no second one)", r.Id, rollbackID)
				}
			case wantRecreate:
				if r.Id == oldID || r.Id == newID || r.Id == rollbackID {
					t.Fatalf("running %q, want a recreated container", r.Id)
				}
				if r.Image.GetImage() != oldImageID || r.Annotations[AnnotationHash] != appHash {
					t.Errorf("recreated from %v hash %q, want the old config", r.Image, r.Annotations[AnnotationHash])
				}
				for _, c := range all {
					if c.Id != r.Id && c.Metadata.Attempt >= r.Metadata.Attempt {
						t.Errorf("recreated attempt %d not above %s's %d", r.Metadata.Attempt, c.Id, c.Metadata.Attempt)
					}
				}
				if r.Metadata.Attempt <= attempt {
					t.Errorf("recreated attempt %d, want above the swap's %d: kubelet's next restart needs a free name", r.Metadata.Attempt, attempt)
				}
				if _, err := e.st.Container(r.Id); err != nil {
					t.Errorf("recreated container not recorded: %v", err)
				}
			}
			if tc.running != wantNew {
				if _, err := e.st.Override(e.sbID, "app"); !errors.Is(err, store.ErrNotFound) {
					t.Errorf("override after a failed swap: %v", err)
				}
			}
		})
	}
}

// TestRecoverNothing: an empty journal is a no-op.
func TestRecoverNothing(t *testing.T) {
	e := newEnv(t)
	e.create(t, e.containerReq(0), true)
	before := len(e.be.Calls())
	if err := e.eng.Recover(context.Background()); err != nil {
		t.Fatal(err)
	}
	if calls := e.be.Calls()[before:]; len(calls) != 0 {
		t.Errorf("Recover with an empty journal called the backend: %v", calls)
	}
}

// TestRecoverBadEntry: an undecodable entry is set aside (the store keeps
// its bytes and records a failed swap), the others are still recovered.
func TestRecoverBadEntry(t *testing.T) {
	e := newEnv(t)
	oldReq := e.containerReq(0)
	oldID := e.create(t, oldReq, true)
	if err := e.st.PutJournal(&store.JournalEntry{SwapID: "bad", Record: []byte{0xff, 0xff}}); err != nil {
		t.Fatal(err)
	}
	good := &store.JournalEntry{SwapID: "good", Step: store.StepPrepared, SandboxID: e.sbID, ContainerName: "app", OldContainerID: oldID}
	good.OldRequest, _ = proto.Marshal(oldReq)
	good.Record, _ = proto.Marshal(&inplacedv1.SwapRecord{Id: "good", SandboxId: e.sbID, Container: "app"})
	if err := e.st.PutJournal(good); err != nil {
		t.Fatal(err)
	}
	if err := e.eng.Recover(context.Background()); err != nil {
		t.Errorf("Recover with an undecodable entry: %v, want it set aside", err)
	}
	if rec, err := e.st.Swap("good"); err != nil || rec.State != inplacedv1.SwapState_SWAP_STATE_FAILED || rec.RunningContainerId != oldID {
		t.Errorf("good entry: %v, %v", rec, err)
	}
	js, _ := e.st.Journal()
	if len(js) != 0 {
		t.Errorf("journal after recovery: %v, want it empty", js)
	}
	if rec, err := e.st.Swap("bad"); err != nil || rec.State != inplacedv1.SwapState_SWAP_STATE_FAILED {
		t.Errorf("bad entry: %v, %v; want a failed swap record", rec, err)
	}
}

func newID0() string { return newID(time.Now()) }
