package fence

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

var key = Key{SandboxID: "sb1", Name: "app"}

func TestAcquireTwiceIsBusy(t *testing.T) {
	r := NewRegistry()
	f, ctx, err := r.Acquire(context.Background(), key, "swap-1", "old")
	if err != nil || f == nil || ctx == nil {
		t.Fatalf("Acquire = %v, %v, %v", f, ctx, err)
	}
	_, _, err = r.Acquire(context.Background(), key, "swap-2", "old")
	if !errors.Is(err, ErrBusy) {
		t.Fatalf("second Acquire = %v, want ErrBusy", err)
	}
	if want := "swap-1"; !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), key.String()) {
		t.Errorf("error %q should name the running swap and the key", err)
	}
	// Another name in the same sandbox, or the same name elsewhere, is free.
	for _, k := range []Key{{"sb1", "side"}, {"sb2", "app"}} {
		g, _, err := r.Acquire(context.Background(), k, "swap-x", "other-"+k.String())
		if err != nil {
			t.Errorf("Acquire(%v) = %v", k, err)
			continue
		}
		r.Release(g, Outcome{})
	}
	if !r.Active() || r.Lookup(key) != f {
		t.Error("the first fence is not up")
	}
	r.Release(f, Outcome{RunningID: "old"})
	if r.Active() || r.Lookup(key) != nil {
		t.Error("fence still up after Release")
	}
	g, _, err := r.Acquire(context.Background(), key, "swap-3", "old")
	if err != nil {
		t.Fatalf("Acquire after Release = %v", err)
	}
	r.Release(g, Outcome{})
}

func TestReleaseWakesWaitersWithTheOutcome(t *testing.T) {
	r := NewRegistry()
	f, swapCtx, err := r.Acquire(context.Background(), key, "swap-1", "old")
	if err != nil {
		t.Fatal(err)
	}
	const waiters = 5
	var wg sync.WaitGroup
	got := make(chan Outcome, waiters)
	for i := 0; i < waiters; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, err := f.Wait(context.Background())
			if err != nil {
				t.Error(err)
			}
			got <- out
		}()
	}
	select {
	case <-got:
		t.Fatal("a waiter woke before Release")
	case <-time.After(20 * time.Millisecond):
	}
	want := Outcome{RunningID: "new", Committed: true}
	r.Release(f, want)
	wg.Wait()
	close(got)
	n := 0
	for out := range got {
		n++
		if out != want {
			t.Errorf("waiter got %+v, want %+v", out, want)
		}
	}
	if n != waiters {
		t.Errorf("%d waiters woke, want %d", n, waiters)
	}
	select {
	case <-f.Done():
	default:
		t.Error("Done not closed")
	}
	if f.Outcome() != want {
		t.Errorf("Outcome = %+v", f.Outcome())
	}
	// Release ends the swap's context too, without a cause of its own.
	if swapCtx.Err() == nil {
		t.Error("swap context not cancelled by Release")
	}
	if !errors.Is(context.Cause(swapCtx), context.Canceled) {
		t.Errorf("cause after Release = %v", context.Cause(swapCtx))
	}
	// A late waiter returns at once.
	if out, err := f.Wait(context.Background()); err != nil || out != want {
		t.Errorf("late Wait = %+v, %v", out, err)
	}
}

func TestWaitEndsWithItsContext(t *testing.T) {
	r := NewRegistry()
	f, _, err := r.Acquire(context.Background(), key, "swap-1", "old")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Release(f, Outcome{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if _, err := f.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Wait = %v, want the deadline", err)
	}
}

func TestAbortCancelsWithCause(t *testing.T) {
	r := NewRegistry()
	f, swapCtx, err := r.Acquire(context.Background(), key, "swap-1", "old")
	if err != nil {
		t.Fatal(err)
	}
	cause := errors.New("the pod sandbox is being removed")
	f.Abort(cause)
	select {
	case <-swapCtx.Done():
	case <-time.After(time.Second):
		t.Fatal("swap context not cancelled by Abort")
	}
	if !errors.Is(context.Cause(swapCtx), cause) {
		t.Errorf("cause = %v, want %v", context.Cause(swapCtx), cause)
	}
	// Abort does not end the fence: the swap still has to clean up.
	select {
	case <-f.Done():
		t.Fatal("Abort closed Done: waiters would go before the swap cleaned up")
	default:
	}
	if r.Lookup(key) != f {
		t.Error("Abort released the fence")
	}
	r.Release(f, Outcome{})
	// The first cause stays.
	if !errors.Is(context.Cause(swapCtx), cause) {
		t.Errorf("cause after Release = %v", context.Cause(swapCtx))
	}
}

func TestAcquireFollowsParentContext(t *testing.T) {
	r := NewRegistry()
	parent, cancel := context.WithCancel(context.Background())
	f, swapCtx, err := r.Acquire(parent, key, "swap-1", "old")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Release(f, Outcome{})
	cancel()
	if swapCtx.Err() == nil {
		t.Error("swap context outlives its parent")
	}
}

func TestByContainer(t *testing.T) {
	r := NewRegistry()
	f, _, _ := r.Acquire(context.Background(), key, "swap-1", "old")
	g, _, _ := r.Acquire(context.Background(), Key{"sb2", "app"}, "swap-2", "other")
	if r.ByContainer("old") != f || r.ByContainer("other") != g {
		t.Error("old containers not found")
	}
	if r.ByContainer("new") != nil {
		t.Error("a container not yet hidden is found")
	}
	f.Hide(r, "new")
	f.Hide(r, "rollback")
	if r.ByContainer("new") != f || r.ByContainer("rollback") != f {
		t.Error("hidden containers not found")
	}
	if v := f.View(); !v.Hidden["new"] || !v.Hidden["rollback"] || v.Hidden["old"] {
		t.Errorf("view hidden = %v", v.Hidden)
	}
	if got := r.BySandbox("sb1"); len(got) != 1 || got[0] != f {
		t.Errorf("BySandbox(sb1) = %v", got)
	}
	if got := r.All(); len(got) != 2 {
		t.Errorf("All = %d fences, want 2", len(got))
	}

	r.Release(f, Outcome{RunningID: "new", Committed: true})
	for _, id := range []string{"old", "new", "rollback"} {
		if r.ByContainer(id) != nil {
			t.Errorf("%s still maps to a released fence", id)
		}
	}
	if r.ByContainer("other") != g {
		t.Error("releasing one fence dropped another's IDs")
	}
	// Hiding on a released fence does not bring it back.
	f.Hide(r, "late")
	if r.ByContainer("late") != nil {
		t.Error("Hide after Release registered the ID")
	}
	if len(r.BySandbox("sb1")) != 0 {
		t.Error("BySandbox finds a released fence")
	}
	r.Release(g, Outcome{})
}

func TestMaskAndView(t *testing.T) {
	r := NewRegistry()
	f, _, _ := r.Acquire(context.Background(), key, "swap-1", "old")
	if v := f.View(); v.Masking || v.OldID != "old" || v.OldStatus != nil {
		t.Errorf("view before Mask = %+v", v)
	}
	st := &runtimeapi.ContainerStatus{Id: "old", State: runtimeapi.ContainerState_CONTAINER_RUNNING}
	entry := &runtimeapi.Container{Id: "old", State: runtimeapi.ContainerState_CONTAINER_RUNNING}
	f.Mask(r, st, entry)
	v := f.View()
	if !v.Masking || v.OldStatus != st || v.OldEntry != entry {
		t.Errorf("view after Mask = %+v", v)
	}
	// The view is a snapshot: later Hides do not change it.
	f.Hide(r, "new")
	if v.Hidden["new"] {
		t.Error("a taken view changed")
	}
	f.Unmask()
	if f.View().Masking {
		t.Error("still masking after Unmask")
	}
	f.Mask(r, st, entry)
	r.Release(f, Outcome{})
	if f.View().Masking {
		t.Error("still masking after Release")
	}
}

func TestConcurrentUse(t *testing.T) {
	r := NewRegistry()
	var wg sync.WaitGroup
	var mu sync.Mutex
	acquired := 0
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f, _, err := r.Acquire(context.Background(), key, "s", "old")
			if err != nil {
				return
			}
			mu.Lock()
			acquired++
			mu.Unlock()
			f.Hide(r, "new")
			_ = f.View()
			_ = r.ByContainer("new")
			r.Release(f, Outcome{})
		}()
	}
	wg.Wait()
	if acquired == 0 || r.Active() {
		t.Errorf("acquired %d times, active after all released: %v", acquired, r.Active())
	}
}
