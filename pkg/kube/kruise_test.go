package kube

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/pkg/swap"
	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

func TestKruiseEnvUpdate(t *testing.T) {
	const state = `{"revision":"web-2","updateEnvFromMetadata":true}`
	for _, tc := range []struct {
		name        string
		cond        corev1.ConditionStatus // "" = no condition
		annotations map[string]string
		want        bool
	}{
		{"updating with env from metadata", corev1.ConditionFalse, map[string]string{KruiseInPlaceUpdateState: state}, true},
		{"legacy annotation", corev1.ConditionFalse, map[string]string{KruiseInPlaceUpdateStateOld: state}, true},
		{"update complete", corev1.ConditionTrue, map[string]string{KruiseInPlaceUpdateState: state}, false},
		{"no gate condition", "", map[string]string{KruiseInPlaceUpdateState: state}, false},
		{"image update only", corev1.ConditionFalse, map[string]string{KruiseInPlaceUpdateState: `{"revision":"web-2"}`}, false},
		{"no state", corev1.ConditionFalse, nil, false},
		{"state not JSON", corev1.ConditionFalse, map[string]string{KruiseInPlaceUpdateState: "yes"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := &corev1.Pod{}
			pod.Annotations = tc.annotations
			if tc.cond != "" {
				pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse},
					{Type: KruiseInPlaceUpdateReady, Status: tc.cond}}
			}
			if got := kruiseEnvUpdate(pod); got != tc.want {
				t.Errorf("kruiseEnvUpdate = %v, want %v", got, tc.want)
			}
		})
	}
}

// swapping is an Engine whose swaps end after a delay, committed or not,
// and that records what it was asked.
type swapping struct {
	preparing
	after  time.Duration
	commit bool
	refuse error

	mu   sync.Mutex
	reqs []*inplacedv1.SwapRequest
	by   []string
}

func (s *swapping) Start(_ context.Context, req *inplacedv1.SwapRequest, caller swap.Caller, _ swap.Hooks) (*swap.Subscription, error) {
	s.mu.Lock()
	s.reqs = append(s.reqs, req)
	s.by = append(s.by, caller.Description)
	s.mu.Unlock()
	if s.refuse != nil {
		return nil, s.refuse
	}
	ch := make(chan *inplacedv1.SwapEvent, 1)
	state := inplacedv1.SwapState_SWAP_STATE_FAILED
	if s.commit {
		state = inplacedv1.SwapState_SWAP_STATE_COMMITTED
	}
	go func() {
		time.Sleep(s.after)
		ch <- &inplacedv1.SwapEvent{Record: &inplacedv1.SwapRecord{State: state}}
		close(ch)
	}()
	return &swap.Subscription{C: ch}, nil
}

func (s *swapping) started() []*inplacedv1.SwapRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*inplacedv1.SwapRequest(nil), s.reqs...)
}

// newKruiseEnv is a pod with env TIER from label tier, running with
// TIER=gold, and an engine whose swaps take 100 ms.
func newKruiseEnv(t *testing.T, commit bool) (*lagEnv, *swapping) {
	t.Helper()
	e := newLagEnv(t)
	eng := &swapping{preparing: *e.eng, after: 100 * time.Millisecond, commit: commit}
	e.compose(eng)
	req, err := e.st.Container(e.id)
	if err != nil {
		t.Fatal(err)
	}
	req.Config.Envs = []*runtimeapi.KeyValue{{Key: "TIER", Value: []byte("gold")}, {Key: "OTHER", Value: []byte("x")}}
	if err := e.st.PutContainer(e.id, req); err != nil {
		t.Fatal(err)
	}
	e.pod.Labels = map[string]string{"tier": "gold"}
	e.pod.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "TIER", ValueFrom: &corev1.EnvVarSource{
		FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels['tier']"}}}}
	e.pod.Status.Conditions = []corev1.PodCondition{{Type: KruiseInPlaceUpdateReady, Status: corev1.ConditionTrue}}
	if err := e.indexer.Update(e.pod); err != nil {
		t.Fatal(err)
	}
	return e, eng
}

// kruiseUpdate is the pod as OpenKruise leaves it for an env-from-metadata
// update: gate False, state annotation, the new label.
func kruiseUpdate(pod *corev1.Pod, rv, tier string) *corev1.Pod {
	p := pod.DeepCopy()
	p.ResourceVersion = rv
	p.Labels["tier"] = tier
	p.Annotations = map[string]string{KruiseInPlaceUpdateState: `{"revision":"web-2","updateEnvFromMetadata":true}`}
	p.Status.Conditions = []corev1.PodCondition{{Type: KruiseInPlaceUpdateReady, Status: corev1.ConditionFalse}}
	return p
}

func stopOf(id string) *runtimeapi.StopContainerRequest {
	return &runtimeapi.StopContainerRequest{ContainerId: id, Timeout: 5}
}

// TestKruiseStopBecomesEnvSwap: kruise-daemon's stop of a container whose
// env from metadata OpenKruise is updating starts the in-place env swap and
// is answered once it committed; a later stop of the replaced container is
// answered at once, with no second swap.
func TestKruiseStopBecomesEnvSwap(t *testing.T) {
	e, eng := newKruiseEnv(t, true)
	if err := e.indexer.Update(kruiseUpdate(e.pod, "2", "platinum")); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	d, err := e.c.SwapInsteadOfStop(context.Background(), stopOf(e.id))
	took := time.Since(start)
	if err != nil || !d.Answered || d.Adopt != nil {
		t.Fatalf("SwapInsteadOfStop = %+v, %v; want answered with success, nothing to adopt", d, err)
	}
	if took < 100*time.Millisecond || took > watchLag {
		t.Errorf("the stop took %s: want it held for the swap (100 ms), no longer", took)
	}
	reqs := eng.started()
	if len(reqs) != 1 {
		t.Fatalf("%d swaps started, want 1", len(reqs))
	}
	if r := reqs[0]; r.Target.GetContainerId() != e.id || len(r.Change.SetEnv) != 1 || r.Change.SetEnv["TIER"] != "platinum" {
		t.Errorf("swap request %v, want container %s with TIER=platinum only", r, e.id)
	}
	if eng.by[0] != CallerKruiseEnvFromMetadata {
		t.Errorf("caller %q, want %q", eng.by[0], CallerKruiseEnvFromMetadata)
	}
	// kruise-daemon retries from its own (older) view: same answer, no new swap.
	if d, err := e.c.SwapInsteadOfStop(context.Background(), stopOf(e.id)); err != nil || !d.Answered {
		t.Errorf("second stop = %+v, %v; want answered", d, err)
	}
	if n := len(eng.started()); n != 1 {
		t.Errorf("%d swaps after the second stop, want 1", n)
	}
}

// TestKruiseStopJoinsTheWatchsSwap: the watch saw OpenKruise's update first
// and started the swap; the stop that follows waits for that same swap.
func TestKruiseStopJoinsTheWatchsSwap(t *testing.T) {
	e, eng := newKruiseEnv(t, true)
	upd := kruiseUpdate(e.pod, "2", "platinum")
	if err := e.indexer.Update(upd); err != nil {
		t.Fatal(err)
	}
	e.c.env.sync(upd, map[string]*runtimeapi.Container{"app": {Id: e.id}})
	d, err := e.c.SwapInsteadOfStop(context.Background(), stopOf(e.id))
	if err != nil || !d.Answered {
		t.Fatalf("SwapInsteadOfStop = %+v, %v; want answered", d, err)
	}
	if n := len(eng.started()); n != 1 {
		t.Errorf("%d swaps started, want the watch's one", n)
	}
}

// TestKruiseStopBeforeTheWatch: kruise-daemon's stop came before inplaced's
// watch delivered the update: the stop waits for it (watchLag at most) and
// then swaps.
func TestKruiseStopBeforeTheWatch(t *testing.T) {
	e, eng := newKruiseEnv(t, true)
	go func() {
		time.Sleep(80 * time.Millisecond)
		upd := kruiseUpdate(e.pod, "2", "platinum")
		_ = e.indexer.Update(upd)
		e.c.cache.delivered(upd)
	}()
	d, err := e.c.SwapInsteadOfStop(context.Background(), stopOf(e.id))
	if err != nil || !d.Answered {
		t.Fatalf("SwapInsteadOfStop = %+v, %v; want answered after the swap", d, err)
	}
	if n := len(eng.started()); n != 1 {
		t.Errorf("%d swaps started, want 1", n)
	}
}

// TestStopsLeftAlone: without an OpenKruise env update in progress, or with
// the env already in place, a stop goes through and nothing is swapped; a
// swap that did not commit lets the stop through too.
func TestStopsLeftAlone(t *testing.T) {
	t.Run("no update in progress", func(t *testing.T) {
		e, eng := newKruiseEnv(t, true)
		p := e.pod.DeepCopy()
		p.Labels["tier"] = "platinum" // a label change by hand: kruise-daemon leaves it too
		_ = e.indexer.Update(p)
		if d, err := e.c.SwapInsteadOfStop(context.Background(), stopOf(e.id)); err != nil || d.Answered {
			t.Errorf("SwapInsteadOfStop = %+v, %v; want the stop through", d, err)
		}
		if n := len(eng.started()); n != 0 {
			t.Errorf("%d swaps started", n)
		}
	})
	t.Run("env already in place", func(t *testing.T) {
		e, eng := newKruiseEnv(t, true)
		_ = e.indexer.Update(kruiseUpdate(e.pod, "2", "gold"))
		if d, err := e.c.SwapInsteadOfStop(context.Background(), stopOf(e.id)); err != nil || d.Answered {
			t.Errorf("SwapInsteadOfStop = %+v, %v; want the stop through", d, err)
		}
		if n := len(eng.started()); n != 0 {
			t.Errorf("%d swaps started", n)
		}
	})
	t.Run("swap rolled back", func(t *testing.T) {
		e, _ := newKruiseEnv(t, false)
		_ = e.indexer.Update(kruiseUpdate(e.pod, "2", "platinum"))
		if d, err := e.c.SwapInsteadOfStop(context.Background(), stopOf(e.id)); err != nil || d.Answered {
			t.Errorf("SwapInsteadOfStop = %+v, %v; want the stop through (kruise's restart as without inplaced)", d, err)
		}
	})
	t.Run("swap refused", func(t *testing.T) {
		e, eng := newKruiseEnv(t, true)
		eng.refuse = errors.New("test: container busy")
		_ = e.indexer.Update(kruiseUpdate(e.pod, "2", "platinum"))
		if d, err := e.c.SwapInsteadOfStop(context.Background(), stopOf(e.id)); err != nil || d.Answered {
			t.Errorf("SwapInsteadOfStop = %+v, %v; want the stop through", d, err)
		}
	})
}
