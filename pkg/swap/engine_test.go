package swap

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/pkg/fence"
	"github.com/inplaced/inplaced/pkg/internal/fakecri"
	"github.com/inplaced/inplaced/pkg/kubeletview"
	"github.com/inplaced/inplaced/pkg/store"
	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

// env is an engine on a fake CRI backend served over gRPC, with one ready
// pod sandbox default/web.
type env struct {
	be     *fakecri.Backend
	st     *store.Store
	fences *fence.Registry
	view   *kubeletview.View
	eng    *Engine
	pod    *runtimeapi.PodSandboxConfig
	sbID   string
}

const (
	oldImageID   = "sha256:v1"
	oldUserImage = "registry.local/app:v1"
	appHash      = "3d1f2a7c"
)

func newEnv(t *testing.T) *env {
	t.Helper()
	if v := os.Getenv(CrashAfterEnv); v != "" {
		t.Skipf("%s=%s is set: the engine would kill the test binary", CrashAfterEnv, v)
	}
	be := fakecri.Start(t)
	st := openStore(t)
	fences, view := fence.NewRegistry(), kubeletview.New()
	eng, err := New(Options{Runtime: be.RuntimeClient, Images: be.ImageClient, Store: st, Fences: fences, Kubelet: view,
		Logger: zaptest.NewLogger(t), HealthMinRuntime: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(eng.Wait) // before the store closes and the logger goes
	e := &env{be: be, st: st, fences: fences, view: view, eng: eng, pod: fakecri.PodConfig("default", "web", "uid-web")}
	resp, err := be.RuntimeClient.RunPodSandbox(context.Background(), &runtimeapi.RunPodSandboxRequest{Config: e.pod})
	if err != nil {
		t.Fatal(err)
	}
	e.sbID = resp.PodSandboxId
	if err := st.PutSandbox(e.sbID, &runtimeapi.RunPodSandboxRequest{Config: e.pod}); err != nil {
		t.Fatal(err)
	}
	return e
}

// containerReq is kubelet's CreateContainer for container app at attempt.
func (e *env) containerReq(attempt uint32) *runtimeapi.CreateContainerRequest {
	return &runtimeapi.CreateContainerRequest{PodSandboxId: e.sbID, SandboxConfig: e.pod,
		Config: fakecri.ContainerConfig(e.pod, "app", attempt, oldImageID, oldUserImage, appHash)}
}

// create creates (and, if start, starts) a container from req, recorded in
// the store as the interceptors would.
func (e *env) create(t *testing.T, req *runtimeapi.CreateContainerRequest, start bool) string {
	t.Helper()
	ctx := context.Background()
	resp, err := e.be.RuntimeClient.CreateContainer(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if start {
		if _, err := e.be.RuntimeClient.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: resp.ContainerId}); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.st.PutContainer(resp.ContainerId, req); err != nil {
		t.Fatal(err)
	}
	return resp.ContainerId
}

func (e *env) start(change *inplacedv1.Change, opts *inplacedv1.SwapOptions) (*Subscription, error) {
	return e.eng.Start(context.Background(), &inplacedv1.SwapRequest{
		Target: &inplacedv1.Target{Namespace: "default", Pod: "web", Container: "app"},
		Change: change, Options: opts,
	}, Caller{UID: 1000, PID: 42}, Hooks{})
}

// events reads a subscription.
type events struct {
	t    *testing.T
	sub  *Subscription
	seen []*inplacedv1.SwapEvent
}

// until reads events until one for step with a message starting with msg.
func (ev *events) until(step, msg string) {
	ev.t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case e, ok := <-ev.sub.C:
			if !ok {
				ev.t.Fatalf("swap ended before %s %s; events: %v", step, msg, ev.seen)
			}
			ev.seen = append(ev.seen, e)
			if e.Step == step && strings.HasPrefix(e.Message, msg) {
				return
			}
		case <-timeout:
			ev.t.Fatalf("no %s %s event within 10s; events: %v", step, msg, ev.seen)
		}
	}
}

// end reads to the end and returns the final record.
func (ev *events) end() *inplacedv1.SwapRecord {
	ev.t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case e, ok := <-ev.sub.C:
			if !ok {
				if n := len(ev.seen); n == 0 || ev.seen[n-1].Record == nil {
					ev.t.Fatalf("swap ended without a final record; events: %v", ev.seen)
				}
				return ev.seen[len(ev.seen)-1].Record
			}
			ev.seen = append(ev.seen, e)
		case <-timeout:
			ev.t.Fatalf("swap did not end within 10s; events: %v", ev.seen)
		}
	}
}

func (e *env) swap(t *testing.T, change *inplacedv1.Change, opts *inplacedv1.SwapOptions) *inplacedv1.SwapRecord {
	t.Helper()
	sub, err := e.start(change, opts)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	return (&events{t: t, sub: sub}).end()
}

// running returns the running containers named app.
func (e *env) running() []*runtimeapi.ContainerStatus {
	var out []*runtimeapi.ContainerStatus
	for _, c := range e.be.Named(e.sbID, "app") {
		if c.State == runtimeapi.ContainerState_CONTAINER_RUNNING {
			out = append(out, c)
		}
	}
	return out
}

func (e *env) count(call string) int {
	n := 0
	for _, c := range e.be.Calls() {
		if c == call {
			n++
		}
	}
	return n
}

// settled checks what every ended swap leaves: no journal, the fence free,
// the record in history as returned.
func (e *env) settled(t *testing.T, rec *inplacedv1.SwapRecord) {
	t.Helper()
	if j, err := e.st.Journal(); err != nil || len(j) != 0 {
		t.Errorf("journal after the swap: %v, %v", j, err)
	}
	if up := e.fences.All(); len(up) != 0 {
		t.Errorf("%d fences still up after the swap ended", len(up))
	}
	got, err := e.st.Swap(rec.Id)
	if err != nil {
		t.Fatalf("history: %v", err)
	}
	if !proto.Equal(got, rec) {
		t.Errorf("history record differs from the final event's:\n%v\n%v", got, rec)
	}
}

func stepNames(rec *inplacedv1.SwapRecord) string {
	var names []string
	for _, s := range rec.Steps {
		n := s.Name
		if s.Error != "" {
			n += "!"
		}
		names = append(names, n)
	}
	return strings.Join(names, ",")
}

func TestSwapCommits(t *testing.T) {
	e := newEnv(t)
	oldReq := e.containerReq(0)
	oldID := e.create(t, oldReq, true)

	rec := e.swap(t, &inplacedv1.Change{Image: strp("registry.local/app:v2"), SetEnv: map[string]string{"MODE": "new"}}, nil)

	if rec.State != inplacedv1.SwapState_SWAP_STATE_COMMITTED || rec.Error != "" {
		t.Fatalf("state %s error %q, want COMMITTED; steps %s", rec.State, rec.Error, stepNames(rec))
	}
	if got, want := stepNames(rec), "pull,create-new,pre-stop,stop-old,start-new,health-gate,commit"; got != want {
		t.Errorf("steps = %s, want %s", got, want)
	}
	if rec.DowntimeNs <= 0 {
		t.Errorf("downtime = %d, want > 0", rec.DowntimeNs)
	}
	if !rec.SandboxKept {
		t.Error("sandbox_kept = false for a swap in a sandbox that stayed ready")
	}
	if rec.OldContainerId != oldID || rec.NewContainerId == "" || rec.NewContainerId == oldID || rec.RunningContainerId != rec.NewContainerId {
		t.Errorf("old %q new %q running %q", rec.OldContainerId, rec.NewContainerId, rec.RunningContainerId)
	}
	if rec.Namespace != "default" || rec.Pod != "web" || rec.Container != "app" || rec.SandboxId != e.sbID || rec.Caller.GetUid() != 1000 {
		t.Errorf("record identity: %v", rec)
	}
	if rec.From.GetImage() != oldUserImage || rec.To.GetImage() != "registry.local/app:v2" {
		t.Errorf("from %v to %v", rec.From, rec.To)
	}

	old := e.be.Container(oldID)
	if old.State != runtimeapi.ContainerState_CONTAINER_EXITED {
		t.Errorf("old container is %s, want EXITED (stopped, not removed)", old.State)
	}
	nc := e.be.Container(rec.NewContainerId)
	if nc == nil || nc.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("new container %v, want running", nc)
	}
	if nc.Metadata.Attempt != 1 || nc.Metadata.Name != "app" {
		t.Errorf("new metadata %v, want app attempt 1", nc.Metadata)
	}
	if !proto.Equal(&runtimeapi.ContainerStatus{Labels: nc.Labels}, &runtimeapi.ContainerStatus{Labels: old.Labels}) {
		t.Errorf("labels %v, want the old ones %v", nc.Labels, old.Labels)
	}
	if nc.Annotations[AnnotationHash] != appHash || nc.Annotations[AnnotationRestarts] != "1" {
		t.Errorf("hash %q restartCount %q, want %q and 1", nc.Annotations[AnnotationHash], nc.Annotations[AnnotationRestarts], appHash)
	}
	// The fake image service resolves a reference to itself as the image ID.
	if nc.Image.GetImage() != "registry.local/app:v2" || nc.Image.GetUserSpecifiedImage() != "registry.local/app:v2" || nc.Image.GetRuntimeHandler() != "runc" {
		t.Errorf("new image spec %v", nc.Image)
	}
	if n := len(e.running()); n != 1 {
		t.Errorf("%d running containers named app, want 1", n)
	}
	newReq, err := e.st.Container(rec.NewContainerId)
	if err != nil {
		t.Fatalf("new container not recorded: %v", err)
	}
	if newReq.Config.LogPath != "app/1.log" || envString(newReq.Config.Envs) != "MODE=new,KEEP=kept" {
		t.Errorf("recorded new config: log %q env %q", newReq.Config.LogPath, envString(newReq.Config.Envs))
	}

	o, err := e.st.Override(e.sbID, "app")
	if err != nil {
		t.Fatalf("no override after commit: %v", err)
	}
	if o.Hash != appHash || o.Image != "registry.local/app:v2" || o.SwapID != rec.Id || o.Pod != "web" || o.PodUID != "uid-web" {
		t.Errorf("override %+v", o)
	}
	if fmt.Sprint(o.Env) != "[{MODE new} {KEEP kept}]" {
		t.Errorf("override env %v", o.Env)
	}
	declared := &runtimeapi.CreateContainerRequest{}
	if err := proto.Unmarshal(o.Declared, declared); err != nil || !proto.Equal(declared, oldReq) {
		t.Errorf("override declared config is not kubelet's request: %v", err)
	}
	e.settled(t, rec)
}

func TestSwapPullFailureTouchesNothing(t *testing.T) {
	e := newEnv(t)
	oldID := e.create(t, e.containerReq(0), true)
	e.be.FailPull("registry.local/app:nope", status.Error(codes.NotFound, "manifest unknown"))
	stops, creates := e.count("StopContainer"), e.count("CreateContainer")

	rec := e.swap(t, &inplacedv1.Change{Image: strp("registry.local/app:nope")}, nil)

	if rec.State != inplacedv1.SwapState_SWAP_STATE_FAILED {
		t.Fatalf("state %s, want FAILED", rec.State)
	}
	if !strings.Contains(rec.Error, "pull") || !strings.Contains(rec.Error, "manifest unknown") {
		t.Errorf("error %q, want the pull error", rec.Error)
	}
	if got := stepNames(rec); got != "pull!" {
		t.Errorf("steps = %s, want only a failed pull", got)
	}
	if c := e.be.Container(oldID); c.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Errorf("old container %s, want RUNNING", c.State)
	}
	if e.count("StopContainer") != stops || e.count("CreateContainer") != creates {
		t.Errorf("a failed pull stopped or created containers: calls %v", e.be.Calls())
	}
	if n := len(e.be.Named(e.sbID, "app")); n != 1 {
		t.Errorf("%d containers named app, want 1", n)
	}
	if rec.RunningContainerId != oldID || rec.NewContainerId != "" {
		t.Errorf("running %q new %q", rec.RunningContainerId, rec.NewContainerId)
	}
	if _, err := e.st.Override(e.sbID, "app"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("override after a failed swap: %v", err)
	}
	e.settled(t, rec)
}

func TestSwapHealthGateRollsBack(t *testing.T) {
	e := newEnv(t)
	oldReq := e.containerReq(0)
	oldID := e.create(t, oldReq, true)
	e.be.ExitOnStart("registry.local/app:crash", 3)

	rec := e.swap(t, &inplacedv1.Change{Image: strp("registry.local/app:crash")}, nil)

	if rec.State != inplacedv1.SwapState_SWAP_STATE_FAILED {
		t.Fatalf("state %s (%s), want FAILED", rec.State, rec.Error)
	}
	if got, want := stepNames(rec), "pull,create-new,pre-stop,stop-old,start-new,health-gate!,rollback"; got != want {
		t.Errorf("steps = %s, want %s", got, want)
	}
	if rec.ExitCode != 3 {
		t.Errorf("exit code = %d, want 3", rec.ExitCode)
	}
	if !strings.Contains(rec.Error, "health gate") || !strings.Contains(rec.Error, "rolled back") {
		t.Errorf("error %q", rec.Error)
	}
	if rec.NewContainerId == "" || e.be.Container(rec.NewContainerId) != nil {
		t.Errorf("failed new container %q still exists", rec.NewContainerId)
	}
	if _, err := e.st.Container(rec.NewContainerId); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("failed new container still recorded: %v", err)
	}
	run := e.running()
	if len(run) != 1 {
		t.Fatalf("%d running containers named app, want 1", len(run))
	}
	rb := run[0]
	if rb.Id == oldID || rb.Id != rec.RunningContainerId {
		t.Errorf("running %q, record says %q, old %q: want a third container", rb.Id, rec.RunningContainerId, oldID)
	}
	if rb.Metadata.Attempt != 2 || rb.Annotations[AnnotationRestarts] != "2" || rb.Annotations[AnnotationHash] != appHash {
		t.Errorf("rollback container attempt %d restarts %q hash %q, want 2 2 %s",
			rb.Metadata.Attempt, rb.Annotations[AnnotationRestarts], rb.Annotations[AnnotationHash], appHash)
	}
	if rb.Image.GetImage() != oldImageID || rb.Image.GetUserSpecifiedImage() != oldUserImage {
		t.Errorf("rollback image %v, want the old one", rb.Image)
	}
	rbReq, err := e.st.Container(rb.Id)
	if err != nil {
		t.Fatalf("rollback container not recorded: %v", err)
	}
	want := proto.Clone(oldReq.Config).(*runtimeapi.ContainerConfig)
	want.Metadata.Attempt, want.Annotations[AnnotationRestarts], want.LogPath = 2, "2", "app/2.log"
	if !proto.Equal(rbReq.Config, want) {
		t.Errorf("rollback config is not the old config as attempt 2:\n got %v\nwant %v", rbReq.Config, want)
	}
	if c := e.be.Container(oldID); c.State != runtimeapi.ContainerState_CONTAINER_EXITED {
		t.Errorf("old container %s, want EXITED", c.State)
	}
	if _, err := e.st.Override(e.sbID, "app"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("override after a rolled-back swap: %v", err)
	}
	e.settled(t, rec)
}

func TestSwapStartFailureRollsBack(t *testing.T) {
	e := newEnv(t)
	e.create(t, e.containerReq(0), true)
	e.be.Runtime.InjectError("StartContainer", status.Error(codes.Internal, "OCI runtime create failed"))

	rec := e.swap(t, &inplacedv1.Change{SetEnv: map[string]string{"MODE": "new"}}, nil)

	if rec.State != inplacedv1.SwapState_SWAP_STATE_FAILED || !strings.Contains(rec.Error, "OCI runtime create failed") {
		t.Fatalf("state %s error %q", rec.State, rec.Error)
	}
	if got, want := stepNames(rec), "pull,create-new,pre-stop,stop-old,start-new!,rollback"; got != want {
		t.Errorf("steps = %s, want %s", got, want)
	}
	if run := e.running(); len(run) != 1 || run[0].Id != rec.RunningContainerId || run[0].Metadata.Attempt != 2 {
		t.Errorf("running %v, want one rollback container at attempt 2 (record: %q)", run, rec.RunningContainerId)
	}
	if e.be.Container(rec.NewContainerId) != nil {
		t.Error("the new container that did not start is still there")
	}
	e.settled(t, rec)
}

func TestSwapRefusedWhileOneRuns(t *testing.T) {
	e := newEnv(t)
	e.create(t, e.containerReq(0), true)

	sub, err := e.start(&inplacedv1.Change{SetEnv: map[string]string{"MODE": "first"}}, &inplacedv1.SwapOptions{MinRuntimeMs: 1000})
	if err != nil {
		t.Fatal(err)
	}
	ev := &events{t: t, sub: sub}
	ev.until(StepHealthGate, "started")

	_, err = e.start(&inplacedv1.Change{SetEnv: map[string]string{"MODE": "second"}}, nil)
	if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), fence.ErrBusy.Error()) {
		t.Fatalf("second swap: %v, want a refusal saying a swap is running", err)
	}

	if rec := ev.end(); rec.State != inplacedv1.SwapState_SWAP_STATE_COMMITTED {
		t.Fatalf("first swap %s: %s", rec.State, rec.Error)
	}
	// The fence is free again: the next swap runs, on the first one's result.
	rec := e.swap(t, &inplacedv1.Change{SetEnv: map[string]string{"MODE": "third"}}, nil)
	if rec.State != inplacedv1.SwapState_SWAP_STATE_COMMITTED {
		t.Fatalf("third swap %s: %s", rec.State, rec.Error)
	}
	if run := e.running(); len(run) != 1 || run[0].Metadata.Attempt != 2 {
		t.Errorf("running %v, want attempt 2", run)
	}
}

func TestSwapAbortedAfterStop(t *testing.T) {
	e := newEnv(t)
	oldID := e.create(t, e.containerReq(0), true)

	sub, err := e.start(&inplacedv1.Change{Image: strp("registry.local/app:v2")}, &inplacedv1.SwapOptions{MinRuntimeMs: 30000})
	if err != nil {
		t.Fatal(err)
	}
	ev := &events{t: t, sub: sub}
	ev.until(StepHealthGate, "started")
	if c := e.be.Container(oldID); c.State != runtimeapi.ContainerState_CONTAINER_EXITED {
		t.Fatalf("old container %s at the health gate, want EXITED", c.State)
	}
	f := e.fences.Lookup(fence.Key{SandboxID: e.sbID, Name: "app"})
	if f == nil {
		t.Fatal("no fence up during the swap")
	}
	start := time.Now()
	f.Abort(errors.New("kubelet stopped the container"))
	rec := ev.end()

	if time.Since(start) > 5*time.Second {
		t.Errorf("abort took %s: the health gate did not end with the context", time.Since(start))
	}
	if rec.State != inplacedv1.SwapState_SWAP_STATE_ABORTED || !strings.Contains(rec.Error, "kubelet stopped the container") {
		t.Fatalf("state %s error %q, want ABORTED with the cause", rec.State, rec.Error)
	}
	if rec.NewContainerId == "" || e.be.Container(rec.NewContainerId) != nil {
		t.Errorf("new container %q not cleaned up", rec.NewContainerId)
	}
	if _, err := e.st.Container(rec.NewContainerId); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("new container still recorded: %v", err)
	}
	if n := len(e.running()); n != 0 {
		t.Errorf("%d containers named app run after an abort, want 0: kubelet's intent wins", n)
	}
	if rec.RunningContainerId != "" {
		t.Errorf("record says %q runs, but nothing does", rec.RunningContainerId)
	}
	if strings.Contains(stepNames(rec), StepRollback) {
		t.Errorf("an aborted swap rolled back: %s", stepNames(rec))
	}
	if _, err := e.st.Override(e.sbID, "app"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("override after an aborted swap: %v", err)
	}
	select {
	case <-f.Done():
		if out := f.Outcome(); out.RunningID != "" || out.Committed {
			t.Errorf("fence outcome %+v, want nothing running", out)
		}
	default:
		t.Error("fence not released")
	}
	e.settled(t, rec)
}

// TestSwapAbortedDuringStart: a pod removal that lands while the new
// container is starting. containerd finishes a start it began even when its
// caller gives up, and refuses to remove a container until then; the swap
// must wait for the start before it cleans up, or it leaves the container
// behind (and RemovePodSandbox fails on it).
func TestSwapAbortedDuringStart(t *testing.T) {
	e := newEnv(t)
	e.create(t, e.containerReq(0), true)
	const slowImage = "registry.local/app:slow"
	e.be.SlowStart(slowImage, 700*time.Millisecond)

	sub, err := e.start(&inplacedv1.Change{Image: strp(slowImage)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ev := &events{t: t, sub: sub}
	ev.until(StepStartNew, "started")
	f := e.fences.Lookup(fence.Key{SandboxID: e.sbID, Name: "app"})
	if f == nil {
		t.Fatal("no fence up during the swap")
	}
	time.Sleep(100 * time.Millisecond) // the start is under way in the backend
	f.Abort(errors.New("the pod sandbox is being removed"))
	rec := ev.end()

	if rec.State != inplacedv1.SwapState_SWAP_STATE_ABORTED {
		t.Fatalf("state %s error %q, want ABORTED", rec.State, rec.Error)
	}
	if rec.NewContainerId == "" || e.be.Container(rec.NewContainerId) != nil {
		t.Errorf("new container %q left behind after the abort", rec.NewContainerId)
	}
	if n := len(e.running()); n != 0 {
		t.Errorf("%d containers named app run after an abort, want 0", n)
	}
	e.settled(t, rec)
}

func TestStartRefusesBeforeTouching(t *testing.T) {
	e := newEnv(t)
	oldID := e.create(t, e.containerReq(0), true)
	for _, tc := range []struct {
		name   string
		req    *inplacedv1.SwapRequest
		kind   error
		substr string
	}{
		{"immutable field", &inplacedv1.SwapRequest{Target: &inplacedv1.Target{ContainerId: oldID}, Change: &inplacedv1.Change{Mounts: []string{"/a:/b"}}}, ErrInvalid, "mounts"},
		{"empty change", &inplacedv1.SwapRequest{Target: &inplacedv1.Target{ContainerId: oldID}}, ErrInvalid, "empty"},
		{"no target", &inplacedv1.SwapRequest{Change: &inplacedv1.Change{Image: strp("x:1")}}, ErrInvalid, "no target"},
		{"unknown pod", &inplacedv1.SwapRequest{Target: &inplacedv1.Target{Pod: "nope", Container: "app"}, Change: &inplacedv1.Change{Image: strp("x:1")}}, ErrNotFound, "nope"},
		{"unknown id", &inplacedv1.SwapRequest{Target: &inplacedv1.Target{ContainerId: "zzz"}, Change: &inplacedv1.Change{Image: strp("x:1")}}, ErrNotFound, "zzz"},
	} {
		_, err := e.eng.Start(context.Background(), tc.req, Caller{}, Hooks{})
		if !errors.Is(err, tc.kind) || !strings.Contains(err.Error(), tc.substr) {
			t.Errorf("%s: %v, want %v mentioning %q", tc.name, err, tc.kind, tc.substr)
		}
	}
	// Not running.
	if _, err := e.be.RuntimeClient.StopContainer(context.Background(), &runtimeapi.StopContainerRequest{ContainerId: oldID}); err != nil {
		t.Fatal(err)
	}
	_, err := e.eng.Start(context.Background(), &inplacedv1.SwapRequest{Target: &inplacedv1.Target{ContainerId: oldID}, Change: &inplacedv1.Change{Image: strp("x:1")}}, Caller{}, Hooks{})
	if !errors.Is(err, ErrRefused) {
		t.Errorf("stopped container: %v, want a refusal", err)
	}
	if e.count("CreateContainer") != 1 || e.fences.Active() {
		t.Errorf("a refused request touched the backend or the fences: %v", e.be.Calls())
	}
	if recs, _ := e.st.Swaps(); len(recs) != 0 {
		t.Errorf("refused requests left history: %v", recs)
	}
}

// TestSwapHealthGateWaitsForRuntime: a runtime that answers Unavailable
// during the health gate (containerd restarting; the shim keeps the new
// container running) is not the new container failing: the gate asks again
// and the swap commits.
func TestSwapHealthGateWaitsForRuntime(t *testing.T) {
	e := newEnv(t)
	e.create(t, e.containerReq(0), true)
	const slowImage = "registry.local/app:slow"
	e.be.SlowStart(slowImage, 300*time.Millisecond)

	sub, err := e.start(&inplacedv1.Change{Image: strp(slowImage)}, &inplacedv1.SwapOptions{MinRuntimeMs: 500})
	if err != nil {
		t.Fatal(err)
	}
	ev := &events{t: t, sub: sub}
	ev.until(StepStartNew, "started")
	// The next ContainerStatus is the health gate's first look.
	e.be.Runtime.InjectError("ContainerStatus", status.Error(codes.Unavailable, "connection refused"))
	rec := ev.end()

	if rec.State != inplacedv1.SwapState_SWAP_STATE_COMMITTED {
		t.Fatalf("state %s error %q, want COMMITTED", rec.State, rec.Error)
	}
	if run := e.running(); len(run) != 1 || run[0].Id != rec.NewContainerId {
		t.Errorf("running %v, want the new container %s alone", run, rec.NewContainerId)
	}
	e.settled(t, rec)
}
