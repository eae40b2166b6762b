package swap

import (
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/inplaced/inplaced/pkg/store"
	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

// failingJournal is the store's journal with its writes failing, as on a
// full disk, from the first entry of step from onwards.
type failingJournal struct {
	st   *store.Store
	from store.JournalStep

	mu      sync.Mutex
	failing bool
	failed  []store.JournalStep
}

func (f *failingJournal) PutJournal(j *store.JournalEntry) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if j.Step == f.from {
		f.failing = true
	}
	if f.failing {
		f.failed = append(f.failed, j.Step)
		return fmt.Errorf("write %s: %w", f.st.Path(), syscall.ENOSPC)
	}
	return f.st.PutJournal(j)
}

func (f *failingJournal) DeleteJournal(id string) error { return f.st.DeleteJournal(id) }

// A journal write that fails (a full state filesystem) never leaves the pod
// without its container, nor with two: before the old container is
// stopped the swap ends and the old one runs on; once it was stopped the
// swap goes on, forward or rolled back, and says the journal was not
// written.
func TestSwapJournalWriteFails(t *testing.T) {
	for _, tc := range []struct {
		name      string
		from      store.JournalStep
		image     string // the new image; :crash exits at once
		wantState inplacedv1.SwapState
		wantSteps string
		wantOld   bool // the old container is the one running
		wantError string
	}{
		{"before stop-old", store.StepStopOld, "registry.local/app:v2", inplacedv1.SwapState_SWAP_STATE_FAILED,
			"pull,create-new,pre-stop", true, "the old container was not stopped and runs on"},
		{"after stop-old, commits", store.StepStartNew, "registry.local/app:v2", inplacedv1.SwapState_SWAP_STATE_COMMITTED,
			"pull,create-new,pre-stop,stop-old,journal!,start-new,health-gate,commit", false, ""},
		{"after stop-old, rolls back", store.StepHealthGate, "registry.local/app:crash", inplacedv1.SwapState_SWAP_STATE_FAILED,
			"pull,create-new,pre-stop,stop-old,start-new,journal!,health-gate!,rollback", false, "rolled back"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			oldID := e.create(t, e.containerReq(0), true)
			e.be.ExitOnStart("registry.local/app:crash", 3)
			fj := &failingJournal{st: e.st, from: tc.from}
			e.eng.journal = fj

			rec := e.swap(t, &inplacedv1.Change{Image: strp(tc.image)}, nil)

			if rec.State != tc.wantState {
				t.Fatalf("state %s (%s), want %s", rec.State, rec.Error, tc.wantState)
			}
			if got := stepNames(rec); got != tc.wantSteps {
				t.Errorf("steps = %s, want %s", got, tc.wantSteps)
			}
			if !strings.Contains(rec.Error, tc.wantError) {
				t.Errorf("error %q, want it to say %q", rec.Error, tc.wantError)
			}
			if len(fj.failed) == 0 {
				t.Fatal("no journal write failed: the test did not test")
			}
			run := e.running()
			if len(run) != 1 {
				t.Fatalf("%d running containers named app, want 1", len(run))
			}
			if (run[0].Id == oldID) != tc.wantOld || run[0].Id != rec.RunningContainerId {
				t.Errorf("running %s, record says %s, old %s (want the old one: %v)", run[0].Id, rec.RunningContainerId, oldID, tc.wantOld)
			}
			if tc.wantOld {
				if n := len(e.be.Named(e.sbID, "app")); n != 1 {
					t.Errorf("%d containers named app, want the old one only: the new one must go", n)
				}
			}
			if j, err := e.st.Journal(); err != nil || len(j) != 0 {
				// Before the failure the entry was written; finish clears it.
				t.Errorf("journal after the swap: %v, %v", j, err)
			}
			if got, err := e.st.Swap(rec.Id); err != nil || got.State != rec.State {
				t.Errorf("history: %v, %v", got, err)
			}
		})
	}
}
