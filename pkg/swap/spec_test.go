package swap

import (
	"context"
	"errors"
	"testing"

	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"

	"github.com/inplaced/inplaced/pkg/store"
)

// TestSpecHashHandover: a swap with Hooks.SpecHash creates the new
// container with that hash, shows kubelet the old hash for it, and
// SpecWritten ends that, drops the image-only override and removes the
// stopped old container.
func TestSpecHashHandover(t *testing.T) {
	e := newEnv(t)
	oldID := e.create(t, e.containerReq(0), true)
	sub, err := e.eng.Start(context.Background(), &inplacedv1.SwapRequest{
		Target: &inplacedv1.Target{Namespace: "default", Pod: "web", Container: "app"},
		Change: &inplacedv1.Change{Image: strp("registry.local/app:v2")},
	}, Caller{Description: "test"}, Hooks{SpecHash: "h-new"})
	if err != nil {
		t.Fatal(err)
	}
	rec := (&events{t: t, sub: sub}).end()
	if rec.State != inplacedv1.SwapState_SWAP_STATE_COMMITTED {
		t.Fatalf("state %s: %s", rec.State, rec.Error)
	}
	newID := rec.RunningContainerId
	if got := e.be.Container(newID).Annotations[AnnotationHash]; got != "h-new" {
		t.Errorf("new container's hash %q, want the new spec's h-new", got)
	}
	if h, ok := e.view.PresentedHash(newID); !ok || h != appHash {
		t.Errorf("presented %q %v, want the old spec's %s until the spec is written", h, ok, appHash)
	}
	if o, err := e.st.Override(e.sbID, "app"); err != nil || o.Hash != appHash {
		t.Fatalf("override before the spec write: %+v %v (want keyed to the old hash)", o, err)
	}
	if err := e.eng.SpecWritten(context.Background(), rec, "h-new", true); err != nil {
		t.Fatal(err)
	}
	if _, ok := e.view.PresentedHash(newID); ok {
		t.Error("still presenting the old hash after SpecWritten")
	}
	if e.fences.Active() || e.view.Presenting() {
		t.Error("read gate open after SpecWritten")
	}
	if _, err := e.st.Override(e.sbID, "app"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("image-only override not dropped: %v", err)
	}
	if c := e.be.Container(oldID); c != nil {
		t.Errorf("old container still there: %v", c.State)
	}
	if c := e.be.Container(newID); c == nil {
		t.Error("the new container went")
	}
}

// TestSpecWrittenKeepsOtherOverrides: env changes stay an override, keyed
// to the new spec's hash; a rolled-back swap presents nothing.
func TestSpecWrittenKeepsOtherOverrides(t *testing.T) {
	e := newEnv(t)
	e.create(t, e.containerReq(0), true)
	sub, err := e.eng.Start(context.Background(), &inplacedv1.SwapRequest{
		Target: &inplacedv1.Target{Namespace: "default", Pod: "web", Container: "app"},
		Change: &inplacedv1.Change{Image: strp("registry.local/app:v2"), SetEnv: map[string]string{"MODE": "new"}},
	}, Caller{Description: "test"}, Hooks{SpecHash: "h-new"})
	if err != nil {
		t.Fatal(err)
	}
	rec := (&events{t: t, sub: sub}).end()
	if err := e.eng.SpecWritten(context.Background(), rec, "h-new", false); err != nil {
		t.Fatal(err)
	}
	o, err := e.st.Override(e.sbID, "app")
	if err != nil || o.Hash != "h-new" || o.Image != "" || len(o.Env) == 0 {
		t.Fatalf("override after the spec write: %+v %v (want env kept, hash h-new, no image)", o, err)
	}
	failed := &inplacedv1.SwapRecord{Id: "x", State: inplacedv1.SwapState_SWAP_STATE_FAILED, RunningContainerId: rec.RunningContainerId}
	if err := e.eng.SpecWritten(context.Background(), failed, "h-new", true); err == nil {
		t.Error("SpecWritten accepted a swap that did not commit")
	}
}
