package swap

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/pkg/criinfo"
	"github.com/inplaced/inplaced/pkg/holdmode"
	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

func TestPlanHold(t *testing.T) {
	hostNet := &runtimeapi.LinuxPodSandboxConfig{SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{
		NamespaceOptions: &runtimeapi.NamespaceOption{Network: runtimeapi.NamespaceMode_NODE}}}
	for _, tc := range []struct {
		name     string
		def      holdmode.Mode
		holder   bool
		ann      map[string]string
		linux    *runtimeapi.LinuxPodSandboxConfig
		mode     holdmode.Mode
		why      string
		max      time.Duration
		optional bool
	}{
		{name: "default", def: holdmode.Queue, holder: true, mode: holdmode.Queue, max: 10 * time.Second},
		{name: "flag off", def: holdmode.Off, holder: true, mode: holdmode.Off, why: "--connection-hold=off", max: 10 * time.Second},
		{name: "annotation drop, limit", def: holdmode.Queue, holder: true,
			ann: map[string]string{AnnotationConnectionHold: "drop", AnnotationHoldMax: "3s"}, mode: holdmode.Drop, max: 3 * time.Second},
		{name: "annotation off", def: holdmode.Queue, holder: true, ann: map[string]string{AnnotationConnectionHold: "off"},
			mode: holdmode.Off, why: "off by the pod's annotation", max: 10 * time.Second},
		{name: "bad annotations", def: holdmode.Queue, holder: true,
			ann: map[string]string{AnnotationConnectionHold: "park", AnnotationHoldMax: "10"}, mode: holdmode.Queue,
			why: `inplaced.io/connection-hold="park" ignored: use queue, drop or off; annotation inplaced.io/hold-max="10" ignored`, max: 10 * time.Second},
		{name: "hostNetwork", def: holdmode.Queue, holder: true, linux: hostNet, mode: holdmode.Off, why: "hostNetwork pod", max: 10 * time.Second},
		{name: "hostNetwork opted in", def: holdmode.Queue, holder: true, linux: hostNet,
			ann: map[string]string{AnnotationConnectionHold: "queue"}, mode: holdmode.Queue, max: 10 * time.Second},
		{name: "no holder", def: holdmode.Queue, mode: holdmode.Off, why: "no connection holder", max: 10 * time.Second},
		{name: "listeners optional", def: holdmode.Queue, holder: true, ann: map[string]string{AnnotationRequireListeners: "false"},
			mode: holdmode.Queue, max: 10 * time.Second, optional: true},
		{name: "bad require-listeners", def: holdmode.Queue, holder: true, ann: map[string]string{AnnotationRequireListeners: "no"},
			mode: holdmode.Queue, max: 10 * time.Second, why: `inplaced.io/require-listeners="no" ignored`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := planHold(tc.def, 10*time.Second, tc.holder, &runtimeapi.PodSandboxConfig{Annotations: tc.ann, Linux: tc.linux})
			if p.mode != tc.mode || p.max != tc.max || p.requireListeners == tc.optional || !strings.Contains(p.why, tc.why) || (tc.why == "" && p.why != "") {
				t.Errorf("planHold = %+v, want mode %s, max %s, why containing %q", p, tc.mode, tc.max, tc.why)
			}
		})
	}
}

func TestDeclaredPorts(t *testing.T) {
	cfg := &runtimeapi.ContainerConfig{Annotations: map[string]string{"io.kubernetes.container.ports": `[{"name":"http","containerPort":8080,"protocol":"TCP"},{"containerPort":53,"protocol":"UDP"},{"containerPort":9090}]`}}
	if got := fmt.Sprint(declaredPorts(cfg)); got != "[8080 9090]" {
		t.Errorf("declaredPorts = %s", got)
	}
}

// The hold goes into the network namespace the sandbox's spec names, else
// its process's.
func TestNetnsPath(t *testing.T) {
	for _, tc := range []struct {
		info, want string
	}{
		{`{"pid":17,"runtimeSpec":{"linux":{"namespaces":[{"type":"pid"},{"type":"network","path":"/var/run/netns/cni-1"}]}}}`, "/var/run/netns/cni-1"},
		{`{"pid":17}`, "/proc/17/ns/net"},
		{`{}`, ""},
	} {
		id := identityOf(&runtimeapi.PodSandboxStatus{}, criinfo.SandboxOf(map[string]string{"info": tc.info}))
		if got := id.netnsPath(); got != tc.want {
			t.Errorf("%s: netnsPath = %q, want %q", tc.info, got, tc.want)
		}
	}
}

// fakeHolder records when the engine holds, relative to the backend's calls.
type fakeHolder struct {
	e   *env
	err error

	mu            sync.Mutex
	heldAtCall    int  // how many backend calls had been made at Hold
	journaled     bool // the journal had the hold when Hold was called
	heldMode      holdmode.Mode
	releaseResult HoldResult
	// missing is what each Listen returns in turn (nil past the end).
	missing [][]uint16
	active  *fakeActive
}

func (f *fakeHolder) Ports(string, int, []uint16) (HoldPorts, error) {
	return HoldPorts{Hold: []uint16{8080}, Listened: []uint16{8080}}, nil
}
func (f *fakeHolder) Remove(string) ([]string, error) { return nil, nil }
func (f *fakeHolder) Hold(_ context.Context, _ string, ports []uint16, mode holdmode.Mode) (ActiveHold, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.heldAtCall = len(f.e.be.Calls())
	js, _ := f.e.st.Journal()
	f.journaled = len(js) == 1 && js[0].Hold != nil && fmt.Sprint(js[0].Hold.Ports) == fmt.Sprint(ports)
	f.heldMode = mode
	if f.err != nil {
		return nil, f.err
	}
	f.active = &fakeActive{mode: mode, res: f.releaseResult, missing: f.missing}
	return f.active, nil
}

type fakeActive struct {
	mode holdmode.Mode
	res  HoldResult

	mu        sync.Mutex
	missing   [][]uint16
	listens   int
	endReason string
}

func (a *fakeActive) Mode() holdmode.Mode                                  { return a.mode }
func (a *fakeActive) Why() string                                          { return "" }
func (a *fakeActive) Start() time.Time                                     { return time.Now() }
func (a *fakeActive) Quiesce(context.Context, time.Duration) time.Duration { return time.Millisecond }
func (a *fakeActive) Listen(context.Context, time.Time) []uint16 {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.listens++
	if a.listens > len(a.missing) {
		return nil
	}
	return a.missing[a.listens-1]
}
func (a *fakeActive) End(reason string) HoldResult {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.endReason = reason
	r := a.res
	r.Reason = reason
	return r
}

func (a *fakeActive) calls() (int, string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.listens, a.endReason
}

func TestSwapHoldsConnections(t *testing.T) {
	e := newEnv(t)
	f := &fakeHolder{e: e, releaseResult: HoldResult{Duration: 160 * time.Millisecond,
		Ports: []HoldPortResult{{Port: 8080, Parked: 31, Reason: "listening", Batches: 7, MaxBatch: 5, Backlog: 5}}}}
	e.eng.holder = f
	e.create(t, e.containerReq(0), true)
	rec := e.swap(t, &inplacedv1.Change{Image: strp("registry.local/app:v2")}, nil)
	e.settled(t, rec)
	if rec.State != inplacedv1.SwapState_SWAP_STATE_COMMITTED {
		t.Fatalf("state %s: %s", rec.State, rec.Error)
	}
	if !f.journaled {
		t.Error("the hold was installed before the journal had it")
	}
	calls := e.be.Calls()
	stopAt := -1
	for i, c := range calls {
		if c == "StopContainer" && stopAt < 0 {
			stopAt = i
		}
	}
	if stopAt < 0 || f.heldAtCall > stopAt {
		t.Errorf("held at call %d, old container stopped at call %d of %v", f.heldAtCall, stopAt, calls)
	}
	h := rec.Hold
	if h == nil || h.Mode != string(holdmode.Queue) || fmt.Sprint(h.Ports) != "[8080]" || h.Parked != 31 || h.Reason != "listening" || h.DurationNs != int64(160*time.Millisecond) {
		t.Errorf("hold record %v", h)
	}
	if len(h.PortResults) != 1 || h.PortResults[0].Batches != 7 || h.PortResults[0].Backlog != 5 || !h.PortResults[0].Listened || len(h.NeverListened) != 0 {
		t.Errorf("per port %v, never listened %v", h.PortResults, h.NeverListened)
	}
	if got := h.Summary(); !strings.Contains(got, "8080: 31 parked, 7 batches of at most 5 (backlog 5), released: listening") {
		t.Errorf("summary %q", got)
	}
	if !strings.Contains(stepNames(rec), StepConnectionHold) {
		t.Errorf("steps %s: no %s", stepNames(rec), StepConnectionHold)
	}
}

func TestSwapHoldFailureDoesNotFailTheSwap(t *testing.T) {
	e := newEnv(t)
	e.eng.holder = &fakeHolder{e: e, err: errors.New("no netfilter")}
	e.create(t, e.containerReq(0), true)
	rec := e.swap(t, &inplacedv1.Change{Image: strp("registry.local/app:v2")}, nil)
	if rec.State != inplacedv1.SwapState_SWAP_STATE_COMMITTED {
		t.Fatalf("state %s: %s", rec.State, rec.Error)
	}
	if rec.Hold.GetMode() != string(holdmode.Off) || !strings.Contains(rec.Hold.GetWhy(), "no netfilter") {
		t.Errorf("hold record %v", rec.Hold)
	}
}

func TestSwapHoldOffByAnnotation(t *testing.T) {
	e := newEnv(t)
	f := &fakeHolder{e: e}
	e.eng.holder = f
	req := e.containerReq(0)
	req.SandboxConfig.Annotations = map[string]string{AnnotationConnectionHold: "off"}
	e.create(t, req, true)
	rec := e.swap(t, &inplacedv1.Change{Image: strp("registry.local/app:v2")}, nil)
	if f.heldMode != "" || rec.Hold.GetMode() != string(holdmode.Off) || !strings.Contains(rec.Hold.GetWhy(), "annotation") {
		t.Errorf("held %q, record %v", f.heldMode, rec.Hold)
	}
}

// A new container that never listens on the old one's port by the hold's
// limit (counted from the hold, then again from its own start) fails the
// health gate: the swap rolls back, and the port stays held until the
// rolled-back container listens (the third Listen).
func TestSwapRollsBackWhenNeverListening(t *testing.T) {
	e := newEnv(t)
	f := &fakeHolder{e: e, missing: [][]uint16{{8080}, {8080}}}
	e.eng.holder = f
	e.create(t, e.containerReq(0), true)
	rec := e.swap(t, &inplacedv1.Change{Image: strp("registry.local/app:v2")}, nil)
	e.settled(t, rec)
	if rec.State != inplacedv1.SwapState_SWAP_STATE_FAILED || !strings.Contains(rec.Error, "did not listen on port 8080") || !strings.Contains(rec.Error, "rolled back") {
		t.Fatalf("state %s: %s", rec.State, rec.Error)
	}
	if listens, reason := f.active.calls(); listens != 3 || reason != HoldReleasedListening {
		t.Errorf("Listen called %d times, ended %q: want the port held on until the rolled-back container listened", listens, reason)
	}
	if fmt.Sprint(rec.Hold.GetNeverListened()) != "[8080]" {
		t.Errorf("never listened %v", rec.Hold.GetNeverListened())
	}
}

// With the pod's opt-out, the same swap commits and the record says which
// port never came; the rest is released at the limit.
func TestSwapNeverListeningOptOut(t *testing.T) {
	for _, c := range []struct {
		name string
		ann  map[string]string
		opt  bool
	}{{"annotation", map[string]string{AnnotationRequireListeners: "false"}, false}, {"engine option", nil, true}} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t)
			e.eng.listenersOptional = c.opt
			f := &fakeHolder{e: e, missing: [][]uint16{{8080}}}
			e.eng.holder = f
			req := e.containerReq(0)
			req.SandboxConfig.Annotations = c.ann
			e.create(t, req, true)
			rec := e.swap(t, &inplacedv1.Change{Image: strp("registry.local/app:v2")}, nil)
			e.settled(t, rec)
			if rec.State != inplacedv1.SwapState_SWAP_STATE_COMMITTED {
				t.Fatalf("state %s: %s", rec.State, rec.Error)
			}
			if listens, reason := f.active.calls(); listens != 1 || reason != HoldReleasedLimit {
				t.Errorf("Listen called %d times, ended %q", listens, reason)
			}
			if fmt.Sprint(rec.Hold.GetNeverListened()) != "[8080]" || !strings.Contains(rec.Hold.Summary(), "never listened on 8080") {
				t.Errorf("record %v", rec.Hold)
			}
		})
	}
}

// A new container that listens within the limit counted from its own start
// commits, even when the old one's stop took most of the limit counted from
// the hold's install.
func TestSwapListeningAfterASlowStopCommits(t *testing.T) {
	e := newEnv(t)
	f := &fakeHolder{e: e, missing: [][]uint16{{8080}}}
	e.eng.holder = f
	e.create(t, e.containerReq(0), true)
	rec := e.swap(t, &inplacedv1.Change{Image: strp("registry.local/app:v2")}, nil)
	e.settled(t, rec)
	if rec.State != inplacedv1.SwapState_SWAP_STATE_COMMITTED || len(rec.Hold.GetNeverListened()) != 0 {
		t.Fatalf("state %s: %s; never listened %v", rec.State, rec.Error, rec.Hold.GetNeverListened())
	}
	if listens, reason := f.active.calls(); listens != 2 || reason != HoldReleasedListening {
		t.Errorf("Listen called %d times, ended %q: want a second Listen from the new container's start", listens, reason)
	}
}
