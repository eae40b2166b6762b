package swap

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/pkg/strategy"
	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

// fakeTaker stands for the takeover agent: on Register it answers the
// new container's binds as told, once the backend has started it.
type fakeTaker struct {
	e    *env
	down string
	// answer is what the new container's binds get, in turn; none: it
	// never binds.
	answer []TakeoverEvent

	mu           sync.Mutex
	registered   []string
	unregistered []string
	profileSeen  bool // the profile file was there at Register
}

func (f *fakeTaker) Running() string { return f.down }
func (f *fakeTaker) Profile(base SeccompBase, swap string) ([]byte, error) {
	return []byte(`{"defaultAction":"SCMP_ACT_ALLOW","listenerPath":"/run/t.sock","listenerMetadata":"` + swap + `"}`), nil
}
func (f *fakeTaker) Register(swap string, pid int, deadline time.Time, events func(TakeoverEvent)) error {
	_, err := os.Stat(filepath.Join(f.e.eng.profileDir, swap+".json"))
	f.mu.Lock()
	f.registered = append(f.registered, swap)
	f.profileSeen = err == nil
	f.mu.Unlock()
	go func() {
		for f.e.count("StartContainer") < 2 { // the old one's, then the new one's
			time.Sleep(5 * time.Millisecond)
		}
		for _, ev := range f.answer {
			events(ev)
		}
	}()
	return nil
}
func (f *fakeTaker) Unregister(swap string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.unregistered = append(f.unregistered, swap)
}

// overlapEnv is an engine with a fake agent and holder, and a running
// container whose pod asks for overlap.
func overlapEnv(t *testing.T, answer ...TakeoverEvent) (*env, *fakeTaker, *fakeHolder, string) {
	e := newEnv(t)
	f := &fakeTaker{e: e, answer: answer}
	h := &fakeHolder{e: e}
	e.eng.taker, e.eng.profileDir, e.eng.holder = f, t.TempDir(), h
	req := e.containerReq(0)
	req.SandboxConfig.Annotations = map[string]string{strategy.Annotation: "overlap", AnnotationHoldMax: "300ms"}
	return e, f, h, e.create(t, req, true)
}

// checkEnded: the swap's profile file is gone and its registration ended.
func (f *fakeTaker) checkEnded(t *testing.T, rec *inplacedv1.SwapRecord) {
	t.Helper()
	if ents, _ := os.ReadDir(f.e.eng.profileDir); len(ents) > 0 {
		t.Errorf("%d profile files outlived the swap", len(ents))
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if !slices.Equal(f.registered, []string{rec.Id}) || !slices.Equal(f.unregistered, []string{rec.Id}) || !f.profileSeen {
		t.Errorf("registered %v (profile there: %v), unregistered %v; want %s once each", f.registered, f.profileSeen, f.unregistered, rec.Id)
	}
}

// stoppedAt is the index of the first StopContainer among the backend's
// calls (-1: none).
func stoppedAt(calls []string) int { return slices.Index(calls, "StopContainer") }

func TestOverlapCommits(t *testing.T) {
	e, f, h, oldID := overlapEnv(t, TakeoverEvent{HandedOver: true, Port: 8080})
	rec := e.swap(t, &inplacedv1.Change{Image: strp("registry.local/app:v2")}, nil)
	e.settled(t, rec)
	if rec.State != inplacedv1.SwapState_SWAP_STATE_COMMITTED || rec.Strategy != "overlap" {
		t.Fatalf("state %s (%s), strategy %s (%s)", rec.State, rec.Error, rec.Strategy, rec.StrategyWhy)
	}
	if got, want := stepNames(rec), "pull,create-new,start-new,handover,health-gate,pre-stop,stop-old,commit"; got != want {
		t.Errorf("steps %s, want %s", got, want)
	}
	calls := e.be.Calls()
	starts := 0
	for _, c := range calls[:max(stoppedAt(calls), 0)] {
		if c == "StartContainer" {
			starts++
		}
	}
	if starts != 2 {
		t.Errorf("calls %v: want the new container started before the old one's stop", calls)
	}
	if tk := rec.Takeover; tk == nil || !slices.Equal(tk.HandedOver, []uint32{8080}) || tk.FellBack || tk.HandoverNs <= 0 {
		t.Errorf("takeover record %v", tk)
	}
	if h.active != nil || rec.Hold.GetMode() != "" {
		t.Errorf("an overlap swap held connections: %v", rec.Hold)
	}
	if c := e.be.Container(oldID); c.State != runtimeapi.ContainerState_CONTAINER_EXITED {
		t.Errorf("old container %s", c.State)
	}
	// What is recorded of the new container is the pod's own seccomp,
	// not the trap's file, which is gone.
	req, err := e.st.Container(rec.NewContainerId)
	if err != nil || req.Config.GetLinux().GetSecurityContext().GetSeccomp().GetProfileType() == runtimeapi.SecurityProfile_Localhost {
		t.Errorf("recorded new container: %v, %v", req.GetConfig().GetLinux().GetSecurityContext(), err)
	}
	f.checkEnded(t, rec)
}

// A new container that fails its health gate goes; the old one was never
// stopped.
func TestOverlapHealthGateRemovesNew(t *testing.T) {
	e, f, _, oldID := overlapEnv(t, TakeoverEvent{HandedOver: true, Port: 8080})
	e.be.ExitOnStart("registry.local/app:crash", 3)
	rec := e.swap(t, &inplacedv1.Change{Image: strp("registry.local/app:crash")}, nil)
	e.settled(t, rec)
	if rec.State != inplacedv1.SwapState_SWAP_STATE_FAILED || rec.RunningContainerId != oldID ||
		!strings.Contains(rec.Error, "the old container was not stopped and runs on") {
		t.Fatalf("state %s (%s), running %s", rec.State, rec.Error, rec.RunningContainerId)
	}
	if e.be.Container(oldID).State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Errorf("old container %s", e.be.Container(oldID).State)
	}
	if e.be.Container(rec.NewContainerId) != nil {
		t.Errorf("the new container is still there")
	}
	f.checkEnded(t, rec)
}

// A new container that does not bind the old one's port by the deadline:
// the swap goes on as stop-first with the hold, and says why.
func TestOverlapFallsBackAtTheDeadline(t *testing.T) {
	e, f, h, _ := overlapEnv(t)
	rec := e.swap(t, &inplacedv1.Change{Image: strp("registry.local/app:v2")}, nil)
	e.settled(t, rec)
	if rec.State != inplacedv1.SwapState_SWAP_STATE_COMMITTED || rec.Strategy != "stop-first" || !rec.Takeover.GetFellBack() ||
		!strings.Contains(rec.StrategyWhy, "the new container did not bind port 8080 within 300ms") {
		t.Fatalf("state %s (%s), strategy %s (%s), takeover %v", rec.State, rec.Error, rec.Strategy, rec.StrategyWhy, rec.Takeover)
	}
	if got, want := stepNames(rec), "pull,create-new,start-new,handover!,pre-stop,hold,stop-old,health-gate,commit"; got != want {
		t.Errorf("steps %s, want %s", got, want)
	}
	if h.active == nil || rec.Hold.GetMode() != "queue" {
		t.Errorf("no hold in the fallback: %v", rec.Hold)
	}
	f.checkEnded(t, rec)
}

// A bind that cannot be handed over falls back at once.
func TestOverlapRefusedFallsBack(t *testing.T) {
	e, f, _, _ := overlapEnv(t, TakeoverEvent{Port: 8080, Reason: "the old socket's blocking mode differs"})
	e.eng.holdMax = time.Minute // the deadline is not what ends the handover
	rec := e.swap(t, &inplacedv1.Change{Image: strp("registry.local/app:v2")}, nil)
	e.settled(t, rec)
	if rec.State != inplacedv1.SwapState_SWAP_STATE_COMMITTED || rec.Strategy != "stop-first" ||
		!strings.Contains(rec.StrategyWhy, "port 8080 cannot be handed over: the old socket's blocking mode differs") {
		t.Fatalf("state %s (%s), strategy %s (%s)", rec.State, rec.Error, rec.Strategy, rec.StrategyWhy)
	}
	f.checkEnded(t, rec)
}

// Without an agent the swap runs stop-first, today's way, saying why.
func TestOverlapWithoutAgent(t *testing.T) {
	e, f, _, _ := overlapEnv(t)
	f.down = "listen: permission denied"
	rec := e.swap(t, &inplacedv1.Change{Image: strp("registry.local/app:v2")}, nil)
	e.settled(t, rec)
	if rec.State != inplacedv1.SwapState_SWAP_STATE_COMMITTED || rec.Strategy != "stop-first" ||
		!strings.Contains(rec.StrategyWhy, "agent not running: listen: permission denied") || rec.Takeover != nil {
		t.Fatalf("state %s (%s), strategy %s (%s)", rec.State, rec.Error, rec.Strategy, rec.StrategyWhy)
	}
	if got, want := stepNames(rec), "pull,create-new,pre-stop,hold,stop-old,start-new,health-gate,commit"; got != want {
		t.Errorf("steps %s, want %s", got, want)
	}
	if len(f.registered) != 0 {
		t.Errorf("registered %v", f.registered)
	}
}

// A request's bad strategy is refused before anything is touched.
func TestStartRefusesABadStrategy(t *testing.T) {
	e, _, _, _ := overlapEnv(t)
	_, err := e.start(&inplacedv1.Change{Image: strp("registry.local/app:v2")}, &inplacedv1.SwapOptions{Strategy: "blue-green"})
	if err == nil || !strings.Contains(err.Error(), `strategy "blue-green": use stop-first or overlap; nothing was changed`) {
		t.Fatalf("err %v", err)
	}
	if !errors.Is(err, ErrInvalid) {
		t.Errorf("%v is not ErrInvalid (InvalidArgument at the edge)", err)
	}
	if n := e.count("CreateContainer"); n != 1 {
		t.Errorf("%d creates: want only the test's own", n)
	}
}

// A kubelet-driven swap of a pod that asks for overlap: after kubelet's
// StopContainer, the new container is started while the old one runs,
// takes the port over, and only then is the old one stopped; kubelet's
// stop is answered with the old container stopped and the new one for its
// create.
func TestPrepareProceedOverlap(t *testing.T) {
	for _, tc := range []struct {
		name     string
		answer   []TakeoverEvent
		strategy string
		steps    string
	}{
		{"handed over", []TakeoverEvent{{HandedOver: true, Port: 8080}}, "overlap", "pull,create-new,start-new,handover,stop-old,commit"},
		{"never bound: falls back", nil, "stop-first", "pull,create-new,start-new,handover!,hold,stop-old,commit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, f, _, oldID := overlapEnv(t, tc.answer...)
			p, err := e.eng.Prepare(context.Background(), KubeletChange{ContainerID: oldID, Image: "registry.local/app:v2", Hash: newHash})
			if err != nil {
				t.Fatal(err)
			}
			waitClosed(t, p.Pulled(), "pull")
			res, err := p.Proceed(context.Background(), 7)
			if err != nil || res.Err != nil || !res.Stopped || res.NewID == "" {
				t.Fatalf("proceed: %+v %v", res, err)
			}
			rec, err := e.st.Swap(res.SwapID)
			if err != nil {
				t.Fatal(err)
			}
			if rec.State != inplacedv1.SwapState_SWAP_STATE_COMMITTED || rec.Strategy != tc.strategy || stepNames(rec) != tc.steps {
				t.Fatalf("record %s (%s), strategy %s (%s), steps %s; want %s, %s", rec.State, rec.Error, rec.Strategy, rec.StrategyWhy,
					stepNames(rec), tc.strategy, tc.steps)
			}
			if st := e.be.Container(oldID); st.State != runtimeapi.ContainerState_CONTAINER_EXITED {
				t.Errorf("old container %s", st.State)
			}
			if res.NewRequest.Config.GetLinux().GetSecurityContext().GetSeccomp().GetProfileType() == runtimeapi.SecurityProfile_Localhost {
				t.Errorf("kubelet's create is answered with the trap's profile, whose file is gone")
			}
			f.checkEnded(t, rec)
		})
	}
}
