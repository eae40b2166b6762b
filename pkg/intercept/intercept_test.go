package intercept

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/pkg/fence"
	"github.com/inplaced/inplaced/pkg/internal/fakecri"
	"github.com/inplaced/inplaced/pkg/kubeletview"
	"github.com/inplaced/inplaced/pkg/relay"
	"github.com/inplaced/inplaced/pkg/store"
	"github.com/inplaced/inplaced/pkg/swap"
)

// deterministic makes the fake backend encode its answers the same way
// every time (sorted map entries), so that bytes through the relay can be
// compared with bytes straight from the backend.
type deterministic struct{}

func (deterministic) Name() string { return "proto" }
func (deterministic) Marshal(v any) ([]byte, error) {
	return proto.MarshalOptions{Deterministic: true}.Marshal(v.(proto.Message))
}
func (deterministic) Unmarshal(b []byte, v any) error { return proto.Unmarshal(b, v.(proto.Message)) }

// raw hands the caller the encoded bytes of an answer.
type raw struct{}

func (raw) Name() string { return "proto" }
func (raw) Marshal(v any) ([]byte, error) {
	if f, ok := v.(*relay.Frame); ok {
		return f.Data, nil
	}
	return proto.Marshal(v.(proto.Message))
}
func (raw) Unmarshal(b []byte, v any) error {
	if f, ok := v.(*relay.Frame); ok {
		f.Data = append([]byte(nil), b...)
		return nil
	}
	return proto.Unmarshal(b, v.(proto.Message))
}

// proxy is inplaced's CRI path: a relay with the interceptors, on a temp
// socket, in front of the fake backend.
type proxy struct {
	be     *fakecri.Backend
	st     *store.Store
	fences *fence.Registry
	view   *kubeletview.View
	ics    *Interceptors
	// rt talks to the relay as kubelet does.
	rt runtimeapi.RuntimeServiceClient
	// rawRelay and rawBackend return undecoded answers.
	rawRelay, rawBackend *grpc.ClientConn
	pod                  *runtimeapi.PodSandboxConfig
}

func newProxy(t *testing.T) *proxy {
	t.Helper()
	be := fakecri.Start(t, grpc.ForceServerCodec(deterministic{}))
	st, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	fences, view := fence.NewRegistry(), kubeletview.New()
	ics, err := New(Options{Store: st, Fences: fences, Kubelet: view, Logger: zaptest.NewLogger(t), FenceTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := relay.Dial(be.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	opts := []relay.Option{relay.WithInterceptors(ics.Table())}
	for m, f := range ics.StreamFilters() {
		opts = append(opts, relay.WithStreamFilter(m, f))
	}
	r := relay.New(conn, opts...)
	dir, err := os.MkdirTemp("", "inplaced")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "px.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(r.ServerOptions()...)
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.Serve(lis) // ends at Stop
	}()
	t.Cleanup(func() { srv.Stop(); <-served })

	dial := func(target string, opts ...grpc.DialOption) *grpc.ClientConn {
		c, err := grpc.NewClient(target, append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	p := &proxy{be: be, st: st, fences: fences, view: view, ics: ics,
		rt:         runtimeapi.NewRuntimeServiceClient(dial("unix://" + sock)),
		rawRelay:   dial("unix://"+sock, grpc.WithDefaultCallOptions(grpc.ForceCodec(raw{}))),
		rawBackend: dial(be.Endpoint, grpc.WithDefaultCallOptions(grpc.ForceCodec(raw{}))),
		pod:        fakecri.PodConfig("default", "web", "uid-web"),
	}
	return p
}

func (p *proxy) runPod(t *testing.T) string {
	t.Helper()
	resp, err := p.rt.RunPodSandbox(context.Background(), &runtimeapi.RunPodSandboxRequest{Config: p.pod, RuntimeHandler: "runc"})
	if err != nil {
		t.Fatal(err)
	}
	return resp.PodSandboxId
}

func (p *proxy) createReq(sbID, name string, attempt uint32, hash string) *runtimeapi.CreateContainerRequest {
	return &runtimeapi.CreateContainerRequest{PodSandboxId: sbID, SandboxConfig: p.pod,
		Config: fakecri.ContainerConfig(p.pod, name, attempt, "sha256:v1", "registry.local/"+name+":v1", hash)}
}

// kubeletStart creates and starts a container through the relay.
func (p *proxy) kubeletStart(t *testing.T, req *runtimeapi.CreateContainerRequest) string {
	t.Helper()
	ctx := context.Background()
	resp, err := p.rt.CreateContainer(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.rt.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: resp.ContainerId}); err != nil {
		t.Fatal(err)
	}
	return resp.ContainerId
}

func TestRecordsAndDropsConfigs(t *testing.T) {
	p := newProxy(t)
	ctx := context.Background()
	sbID := p.runPod(t)
	sb, err := p.st.Sandbox(sbID)
	if err != nil {
		t.Fatalf("sandbox not recorded: %v", err)
	}
	if !proto.Equal(sb, &runtimeapi.RunPodSandboxRequest{Config: p.pod, RuntimeHandler: "runc"}) {
		t.Errorf("recorded sandbox = %v", sb)
	}

	req := p.createReq(sbID, "app", 0, "h1")
	id := p.kubeletStart(t, req)
	got, err := p.st.Container(id)
	if err != nil {
		t.Fatalf("container not recorded: %v", err)
	}
	if !proto.Equal(got, req) {
		t.Errorf("recorded container =\n%v\nwant\n%v", got, req)
	}

	if _, err := p.rt.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: id}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.st.Container(id); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("record kept after RemoveContainer: %v", err)
	}

	// A backend NotFound still drops the record, and reaches kubelet as NotFound.
	id2 := p.kubeletStart(t, p.createReq(sbID, "side", 0, "h2"))
	p.be.Runtime.InjectError("RemoveContainer", status.Error(codes.NotFound, "container gone"))
	if _, err := p.rt.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: id2}); status.Code(err) != codes.NotFound {
		t.Errorf("RemoveContainer = %v, want the backend's NotFound", err)
	}
	if _, err := p.st.Container(id2); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("record kept after a NotFound remove: %v", err)
	}

	// A failed create records nothing and keeps the backend's code.
	p.be.Runtime.InjectError("CreateContainer", status.Error(codes.ResourceExhausted, "no space"))
	if _, err := p.rt.CreateContainer(ctx, p.createReq(sbID, "third", 0, "h3")); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("CreateContainer = %v, want ResourceExhausted", err)
	}
	if ids, _ := p.st.ContainerIDs(); len(ids) != 0 {
		t.Errorf("records after a failed create: %v", ids)
	}

	// Removing the sandbox drops it and the containers recorded in it.
	id3 := p.kubeletStart(t, p.createReq(sbID, "app", 1, "h1"))
	if _, err := p.rt.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: sbID}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.st.Sandbox(sbID); err != nil {
		t.Errorf("StopPodSandbox dropped the record: %v", err)
	}
	if _, err := p.rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sbID}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.st.Sandbox(sbID); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("sandbox record kept after RemovePodSandbox: %v", err)
	}
	if _, err := p.st.Container(id3); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("container record kept after its sandbox was removed: %v", err)
	}
}

func TestStickyOverride(t *testing.T) {
	p := newProxy(t)
	ctx := context.Background()
	sbID := p.runPod(t)
	o := &store.Override{SandboxID: sbID, Namespace: "default", Pod: "web", Container: "app", SwapID: "swap-1",
		Hash: "h1", Image: "registry.local/app:v2", Env: []store.KV{{Key: "MODE", Value: "new"}},
		Command: []string{"/new"}, Args: []string{"--fast"}}
	if err := p.st.PutOverride(o); err != nil {
		t.Fatal(err)
	}

	t.Run("same hash: applied", func(t *testing.T) {
		req := p.createReq(sbID, "app", 1, "h1")
		id := p.kubeletStart(t, req)
		c := p.be.Container(id)
		want := &runtimeapi.ImageSpec{Image: "registry.local/app:v2", UserSpecifiedImage: "registry.local/app:v2", RuntimeHandler: "runc"}
		if !proto.Equal(c.Image, want) {
			t.Errorf("backend got image %v, want %v", c.Image, want)
		}
		rec, err := p.st.Container(id)
		if err != nil {
			t.Fatal(err)
		}
		cfg := rec.Config
		if fmt.Sprint(cfg.Command, cfg.Args) != "[/new] [--fast]" || len(cfg.Envs) != 1 || cfg.Envs[0].Key != "MODE" || string(cfg.Envs[0].Value) != "new" {
			t.Errorf("created with command %q args %q env %v", cfg.Command, cfg.Args, cfg.Envs)
		}
		// What kubelet tracks is untouched.
		if !proto.Equal(&runtimeapi.ContainerConfig{Metadata: cfg.Metadata, Labels: cfg.Labels, Annotations: cfg.Annotations, LogPath: cfg.LogPath, Linux: cfg.Linux},
			&runtimeapi.ContainerConfig{Metadata: req.Config.Metadata, Labels: req.Config.Labels, Annotations: req.Config.Annotations, LogPath: req.Config.LogPath, Linux: req.Config.Linux}) {
			t.Errorf("override changed metadata, labels, annotations, log path or resources: %v", cfg)
		}
		if _, err := p.st.Override(sbID, "app"); err != nil {
			t.Errorf("override dropped after use: %v", err)
		}
	})
	t.Run("other container: untouched", func(t *testing.T) {
		req := p.createReq(sbID, "side", 0, "h1")
		id := p.kubeletStart(t, req)
		if rec, _ := p.st.Container(id); !proto.Equal(rec, req) {
			t.Errorf("another container's create was rewritten: %v", rec)
		}
	})
	t.Run("other hash: dropped", func(t *testing.T) {
		req := p.createReq(sbID, "app", 2, "h2")
		before := time.Now()
		id := p.kubeletStart(t, req)
		after := time.Now()
		if c := p.be.Container(id); c.Image.GetImage() != "sha256:v1" {
			t.Errorf("backend got image %v, want kubelet's", c.Image)
		}
		if rec, _ := p.st.Container(id); !proto.Equal(rec, req) {
			t.Errorf("kubelet's create was rewritten after a spec change: %v", rec)
		}
		if _, err := p.st.Override(sbID, "app"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("override kept after a spec change: %v", err)
		}
		recs, err := p.st.Swaps()
		if err != nil {
			t.Fatal(err)
		}
		var dropped int
		for _, r := range recs {
			if r.Kind == "override-dropped" {
				dropped++
				if r.SandboxId != sbID || r.Container != "app" || r.Pod != "web" || !strings.Contains(r.Error, "h1") || !strings.Contains(r.Error, "h2") || !strings.Contains(r.Error, "swap-1") {
					t.Errorf("history record %v", r)
				}
			}
		}
		if dropped != 1 {
			t.Errorf("%d override-dropped records, want 1: %v", dropped, recs)
		}
		// The store trims history in key order, oldest first: the record's
		// ID must sort in time among the swap engine's IDs (swap.newID:
		// "20060102T150405.000-<hex>").
		engineID := func(at time.Time) string { return at.UTC().Format("20060102T150405.000") + "-00000000" }
		for _, r := range recs {
			if r.Kind == "override-dropped" && !(engineID(before.Add(-time.Millisecond)) < r.Id && r.Id < engineID(after.Add(time.Millisecond))) {
				t.Errorf("record ID %q does not sort between swaps started before (%s) and after (%s) it",
					r.Id, engineID(before.Add(-time.Millisecond)), engineID(after.Add(time.Millisecond)))
			}
		}
		// And the next create is plain kubelet's.
		req3 := p.createReq(sbID, "app", 3, "h2")
		id3, err := p.rt.CreateContainer(ctx, req3)
		if err != nil {
			t.Fatal(err)
		}
		if rec, _ := p.st.Container(id3.ContainerId); !proto.Equal(rec, req3) {
			t.Errorf("create after the drop was rewritten: %v", rec)
		}
	})
}

// maskedSwap sets the scene a swap leaves while it has the old container
// stopped and the new one running but not yet proven: the fence up, the
// mask on with the old container's snapshot, the new container hidden.
type maskedSwap struct {
	sbID, oldID, newID, sideID string
	oldStatus                  *runtimeapi.ContainerStatus
	oldEntry                   *runtimeapi.Container
	f                          *fence.Fence
	swapCtx                    context.Context
}

func (p *proxy) maskedSwap(t *testing.T) *maskedSwap {
	t.Helper()
	ctx := context.Background()
	m := &maskedSwap{sbID: p.runPod(t)}
	m.oldID = p.kubeletStart(t, p.createReq(m.sbID, "app", 0, "h1"))
	m.sideID = p.kubeletStart(t, p.createReq(m.sbID, "side", 0, "h9"))
	st, err := p.be.RuntimeClient.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: m.oldID})
	if err != nil {
		t.Fatal(err)
	}
	m.oldStatus = st.Status
	l, err := p.be.RuntimeClient.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{Id: m.oldID}})
	if err != nil || len(l.Containers) != 1 {
		t.Fatalf("list old: %v, %v", l, err)
	}
	m.oldEntry = l.Containers[0]

	m.f, m.swapCtx, err = p.fences.Acquire(context.Background(), fence.Key{SandboxID: m.sbID, Name: "app"}, "swap-1", m.oldID)
	if err != nil {
		t.Fatal(err)
	}
	m.f.Mask(p.fences, m.oldStatus, m.oldEntry)
	// The swap talks to the backend directly, not through the relay.
	if _, err := p.be.RuntimeClient.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: m.oldID}); err != nil {
		t.Fatal(err)
	}
	nreq := p.createReq(m.sbID, "app", 1, "h1")
	resp, err := p.be.RuntimeClient.CreateContainer(ctx, nreq)
	if err != nil {
		t.Fatal(err)
	}
	m.newID = resp.ContainerId
	m.f.Hide(p.fences, m.newID)
	if _, err := p.be.RuntimeClient.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: m.newID}); err != nil {
		t.Fatal(err)
	}
	return m
}

func ids(cs []*runtimeapi.Container) map[string]runtimeapi.ContainerState {
	out := map[string]runtimeapi.ContainerState{}
	for _, c := range cs {
		out[c.Id] = c.State
	}
	return out
}

func TestMask(t *testing.T) {
	p := newProxy(t)
	ctx := context.Background()
	m := p.maskedSwap(t)
	running := &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_RUNNING}
	exited := &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_EXITED}

	for _, tc := range []struct {
		name   string
		filter *runtimeapi.ContainerFilter
		want   map[string]runtimeapi.ContainerState
	}{
		{"no filter", nil, map[string]runtimeapi.ContainerState{
			m.oldID: runtimeapi.ContainerState_CONTAINER_RUNNING, m.sideID: runtimeapi.ContainerState_CONTAINER_RUNNING}},
		{"state RUNNING", &runtimeapi.ContainerFilter{State: running}, map[string]runtimeapi.ContainerState{
			m.oldID: runtimeapi.ContainerState_CONTAINER_RUNNING, m.sideID: runtimeapi.ContainerState_CONTAINER_RUNNING}},
		{"sandbox and state RUNNING", &runtimeapi.ContainerFilter{PodSandboxId: m.sbID, State: running}, map[string]runtimeapi.ContainerState{
			m.oldID: runtimeapi.ContainerState_CONTAINER_RUNNING, m.sideID: runtimeapi.ContainerState_CONTAINER_RUNNING}},
		{"state EXITED", &runtimeapi.ContainerFilter{State: exited}, map[string]runtimeapi.ContainerState{}},
		{"kubelet's labels", &runtimeapi.ContainerFilter{LabelSelector: map[string]string{"io.kubernetes.container.name": "app"}}, map[string]runtimeapi.ContainerState{
			m.oldID: runtimeapi.ContainerState_CONTAINER_RUNNING}},
		{"the hidden ID", &runtimeapi.ContainerFilter{Id: m.newID}, map[string]runtimeapi.ContainerState{}},
		{"the old ID", &runtimeapi.ContainerFilter{Id: m.oldID}, map[string]runtimeapi.ContainerState{
			m.oldID: runtimeapi.ContainerState_CONTAINER_RUNNING}},
	} {
		t.Run("ListContainers "+tc.name, func(t *testing.T) {
			resp, err := p.rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: tc.filter})
			if err != nil {
				t.Fatal(err)
			}
			if got := ids(resp.Containers); fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("kubelet sees %v, want %v", got, tc.want)
			}
			for _, c := range resp.Containers {
				if c.Id == m.oldID && !proto.Equal(c, m.oldEntry) {
					t.Errorf("old entry %v, want the snapshot %v", c, m.oldEntry)
				}
			}
		})
	}
	t.Run("ContainerStatus of the old container", func(t *testing.T) {
		resp, err := p.rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: m.oldID})
		if err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(resp.Status, m.oldStatus) {
			t.Errorf("status %v, want the snapshot %v", resp.Status, m.oldStatus)
		}
		if real := p.be.Container(m.oldID); real.State != runtimeapi.ContainerState_CONTAINER_EXITED {
			t.Fatalf("test setup: the old container is %s in the backend", real.State)
		}
	})
	t.Run("ContainerStatus of another container", func(t *testing.T) {
		resp, err := p.rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: m.sideID})
		if err != nil || resp.Status.Id != m.sideID {
			t.Errorf("status = %v, %v", resp, err)
		}
	})
	t.Run("the backend sees the truth", func(t *testing.T) {
		resp, err := p.be.RuntimeClient.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if got := ids(resp.Containers); got[m.oldID] != runtimeapi.ContainerState_CONTAINER_EXITED || got[m.newID] != runtimeapi.ContainerState_CONTAINER_RUNNING {
			t.Errorf("backend %v", got)
		}
	})

	// The swap ends: kubelet sees what is.
	p.fences.Release(m.f, fence.Outcome{RunningID: m.newID, Committed: true})
	resp, err := p.rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if got := ids(resp.Containers); got[m.oldID] != runtimeapi.ContainerState_CONTAINER_EXITED || got[m.newID] != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Errorf("after the swap kubelet sees %v", got)
	}
	st, err := p.rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: m.oldID})
	if err != nil || st.Status.State != runtimeapi.ContainerState_CONTAINER_EXITED {
		t.Errorf("old status after the swap: %v, %v", st, err)
	}
}

// TestOldStatusLingersUntilAListShowsTheTruth: kubelet lists, then asks
// ContainerStatus for each container listed. A swap ending between the two
// must not show it "old exited, nothing else" (it would create the swap's
// attempt itself): the old snapshot stays until a list served after the
// swap has shown the new container, or fence.LingerFor passes.
func TestOldStatusLingersUntilAListShowsTheTruth(t *testing.T) {
	p := newProxy(t)
	ctx := context.Background()
	m := p.maskedSwap(t)
	status := func() runtimeapi.ContainerState {
		t.Helper()
		st, err := p.rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: m.oldID})
		if err != nil {
			t.Fatal(err)
		}
		return st.Status.State
	}
	list := func(f *runtimeapi.ContainerFilter) map[string]runtimeapi.ContainerState {
		t.Helper()
		resp, err := p.rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: f})
		if err != nil {
			t.Fatal(err)
		}
		return ids(resp.Containers)
	}
	if got := list(nil); got[m.newID] != 0 || len(got) != 2 {
		t.Fatalf("under the mask kubelet lists %v", got)
	}
	m.f.LingerOnRelease()
	p.fences.Release(m.f, fence.Outcome{RunningID: m.newID, Committed: true})
	if got := status(); got != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("old container right after the swap: %s, want the RUNNING snapshot its list implied", got)
	}
	running := &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_RUNNING}
	list(&runtimeapi.ContainerFilter{State: running})
	list(&runtimeapi.ContainerFilter{PodSandboxId: "another-pod"})
	if got := status(); got != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("old container after lists that do not name it: %s, want the snapshot still", got)
	}
	got := list(&runtimeapi.ContainerFilter{LabelSelector: map[string]string{"io.kubernetes.container.name": "app"}})
	if got[m.newID] != runtimeapi.ContainerState_CONTAINER_RUNNING || got[m.oldID] != runtimeapi.ContainerState_CONTAINER_EXITED {
		t.Fatalf("list after the swap: %v, want the truth", got)
	}
	if got := status(); got != runtimeapi.ContainerState_CONTAINER_EXITED {
		t.Fatalf("old container after a list showed the new one: %s, want the truth (EXITED)", got)
	}
	if p.fences.Active() {
		t.Error("the registry is still active after the linger ended: reads stay decoded")
	}
}

// TestLingerEndsWithoutAList: with no list after the swap, the snapshot
// goes after fence.LingerFor.
func TestLingerEndsWithoutAList(t *testing.T) {
	p := newProxy(t)
	ctx := context.Background()
	m := p.maskedSwap(t)
	m.f.LingerOnRelease()
	p.fences.Release(m.f, fence.Outcome{RunningID: m.newID, Committed: true})
	if !p.fences.Active() {
		t.Fatal("no linger after a released swap")
	}
	time.Sleep(fence.LingerFor + 100*time.Millisecond)
	st, err := p.rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: m.oldID})
	if err != nil || st.Status.State != runtimeapi.ContainerState_CONTAINER_EXITED {
		t.Fatalf("old status %v after the linger: %v, want EXITED", st, err)
	}
}

func TestMaskOffShowsTheTruth(t *testing.T) {
	p := newProxy(t)
	ctx := context.Background()
	m := p.maskedSwap(t)
	m.f.Unmask() // a failed rollback lets kubelet see the truth
	resp, err := p.rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if got := ids(resp.Containers); got[m.oldID] != runtimeapi.ContainerState_CONTAINER_EXITED || got[m.newID] != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Errorf("unmasked, kubelet sees %v", got)
	}
	p.fences.Release(m.f, fence.Outcome{})
}

// TestPassThroughIsByteExact: with no swap running, the read path kubelet
// relists every second is a byte copy of the backend's answer.
func TestPassThroughIsByteExact(t *testing.T) {
	p := newProxy(t)
	ctx := context.Background()
	sbID := p.runPod(t)
	id := p.kubeletStart(t, p.createReq(sbID, "app", 0, "h1"))
	p.kubeletStart(t, p.createReq(sbID, "side", 0, "h2"))
	for _, c := range []struct {
		method string
		req    proto.Message
	}{
		{runtimeapi.RuntimeService_ListContainers_FullMethodName, &runtimeapi.ListContainersRequest{}},
		{runtimeapi.RuntimeService_ListContainers_FullMethodName, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{
			State: &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_RUNNING}}}},
		{runtimeapi.RuntimeService_ContainerStatus_FullMethodName, &runtimeapi.ContainerStatusRequest{ContainerId: id}},
		{runtimeapi.RuntimeService_PodSandboxStatus_FullMethodName, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: sbID}},
		{runtimeapi.RuntimeService_ListPodSandbox_FullMethodName, &runtimeapi.ListPodSandboxRequest{}},
	} {
		in, err := proto.Marshal(c.req)
		if err != nil {
			t.Fatal(err)
		}
		// Maps (labels, annotations) come out in random order from a Go
		// re-encode: several rounds catch a relay that decodes and re-encodes.
		for round := 0; round < 5; round++ {
			var direct, relayed relay.Frame
			if err := p.rawBackend.Invoke(ctx, c.method, &relay.Frame{Data: in}, &direct); err != nil {
				t.Fatal(err)
			}
			if err := p.rawRelay.Invoke(ctx, c.method, &relay.Frame{Data: in}, &relayed); err != nil {
				t.Fatal(err)
			}
			if len(direct.Data) == 0 {
				t.Fatalf("%s: empty answer", c.method)
			}
			if !bytes.Equal(direct.Data, relayed.Data) {
				t.Fatalf("%s %v: relayed answer differs from the backend's (%d vs %d bytes)", c.method, c.req, len(relayed.Data), len(direct.Data))
			}
		}
	}
}

func TestKubeletCreateDuringSwapGetsTheSwapsContainer(t *testing.T) {
	p := newProxy(t)
	ctx := context.Background()
	m := p.maskedSwap(t)
	creates := count(p.be.Calls(), "CreateContainer")

	type result struct {
		resp *runtimeapi.CreateContainerResponse
		err  error
	}
	done := make(chan result, 1)
	go func() {
		// kubelet restarts "the exited container" with the next attempt.
		resp, err := p.rt.CreateContainer(ctx, p.createReq(m.sbID, "app", 1, "h1"))
		done <- result{resp, err}
	}()
	select {
	case r := <-done:
		t.Fatalf("kubelet's CreateContainer did not wait for the swap: %v, %v", r.resp, r.err)
	case <-time.After(100 * time.Millisecond):
	}
	p.fences.Release(m.f, fence.Outcome{RunningID: m.newID, Committed: true})
	var r result
	select {
	case r = <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("kubelet's CreateContainer still waits after the swap ended")
	}
	if r.err != nil || r.resp.ContainerId != m.newID {
		t.Fatalf("CreateContainer = %v, %v; want the swap's container %s", r.resp, r.err, m.newID)
	}
	if n := count(p.be.Calls(), "CreateContainer"); n != creates {
		t.Errorf("the backend got %d more CreateContainer calls", n-creates)
	}
	// kubelet then starts it: answered, not sent (it runs already).
	starts := count(p.be.Calls(), "StartContainer")
	if _, err := p.rt.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: m.newID}); err != nil {
		t.Errorf("StartContainer of the handed container: %v", err)
	}
	if n := count(p.be.Calls(), "StartContainer"); n != starts {
		t.Errorf("StartContainer of a running container reached the backend")
	}
	if got := p.ics.Counts()[m.sbID+"/app/CreateContainer"]; got != 2 {
		t.Errorf("counted %d CreateContainer calls for app, want 2 (the first create and the racing one)", got)
	}
}

func TestKubeletStopAbortsTheSwap(t *testing.T) {
	p := newProxy(t)
	ctx := context.Background()
	m := p.maskedSwap(t)
	done := make(chan error, 1)
	go func() {
		_, err := p.rt.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: m.oldID, Timeout: 30})
		done <- err
	}()
	select {
	case <-m.swapCtx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("kubelet's StopContainer did not abort the swap")
	}
	if cause := context.Cause(m.swapCtx); cause == nil || !strings.Contains(cause.Error(), "kubelet stopped the container") {
		t.Errorf("cause = %v", cause)
	}
	select {
	case err := <-done:
		t.Fatalf("StopContainer returned before the swap cleaned up: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	p.fences.Release(m.f, fence.Outcome{})
	if err := <-done; err != nil {
		t.Errorf("StopContainer after the abort: %v", err)
	}
}

func TestRemovePodSandboxAbortsSwapsIn(t *testing.T) {
	p := newProxy(t)
	ctx := context.Background()
	m := p.maskedSwap(t)
	go func() {
		<-m.swapCtx.Done()
		p.fences.Release(m.f, fence.Outcome{}) // the swap cleans up and ends
	}()
	if _, err := p.rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: m.sbID}); err != nil {
		t.Fatal(err)
	}
	if cause := context.Cause(m.swapCtx); cause == nil || !strings.Contains(cause.Error(), "removed") {
		t.Errorf("cause = %v", cause)
	}
	if p.fences.Active() {
		t.Error("fence still up")
	}
}

func count(calls []string, name string) int {
	n := 0
	for _, c := range calls {
		if c == name {
			n++
		}
	}
	return n
}

// TestMaskHidesTheSwapsContainerBeforeItIsRegistered: between the runtime
// creating the swap's new container and the swap registering it (Hide),
// kubelet must not see it: as the newest container of the name in state
// CREATED it would make kubelet start a container of its own at once. Older
// containers of the name and newer ones of other names stay visible.
func TestMaskHidesTheSwapsContainerBeforeItIsRegistered(t *testing.T) {
	p := newProxy(t)
	ctx := context.Background()
	sbID := p.runPod(t)
	prevID := p.kubeletStart(t, p.createReq(sbID, "app", 0, "h1"))
	if _, err := p.rt.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: prevID}); err != nil {
		t.Fatal(err)
	}
	oldID := p.kubeletStart(t, p.createReq(sbID, "app", 1, "h1"))
	st, err := p.be.RuntimeClient.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: oldID})
	if err != nil {
		t.Fatal(err)
	}
	l, err := p.be.RuntimeClient.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{Id: oldID}})
	if err != nil || len(l.Containers) != 1 {
		t.Fatalf("list old: %v, %v", l, err)
	}
	f, _, err := p.fences.Acquire(ctx, fence.Key{SandboxID: sbID, Name: "app"}, "swap-1", oldID)
	if err != nil {
		t.Fatal(err)
	}
	f.Mask(p.fences, st.Status, l.Containers[0])
	if _, err := p.be.RuntimeClient.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: oldID}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Millisecond) // distinct CreatedAt
	resp, err := p.be.RuntimeClient.CreateContainer(ctx, p.createReq(sbID, "app", 2, "h1"))
	if err != nil {
		t.Fatal(err)
	}
	newID := resp.ContainerId // created by the runtime, not yet registered with Hide
	sideID := p.kubeletStart(t, p.createReq(sbID, "side", 0, "h9"))

	for _, filter := range []*runtimeapi.ContainerFilter{
		nil,
		{PodSandboxId: sbID},
		{LabelSelector: map[string]string{"io.kubernetes.container.name": "app"}},
	} {
		l, err := p.rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: filter})
		if err != nil {
			t.Fatal(err)
		}
		got := ids(l.Containers)
		if _, ok := got[newID]; ok {
			t.Errorf("filter %v: kubelet sees the swap's unregistered container: %v", filter, got)
		}
		if got[oldID] != runtimeapi.ContainerState_CONTAINER_RUNNING || got[prevID] != runtimeapi.ContainerState_CONTAINER_EXITED {
			t.Errorf("filter %v: kubelet sees %v, want the old container running and the one before it exited", filter, got)
		}
		if filter == nil && got[sideID] != runtimeapi.ContainerState_CONTAINER_RUNNING {
			t.Errorf("a newer container of another name was hidden: %v", got)
		}
	}
	// The event stream drops the unregistered container's events too.
	ev := &runtimeapi.ContainerEventResponse{ContainerId: newID, ContainerEventType: runtimeapi.ContainerEventType_CONTAINER_CREATED_EVENT,
		PodSandboxStatus: &runtimeapi.PodSandboxStatus{Id: sbID}}
	if nst, err := p.be.RuntimeClient.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: newID}); err == nil {
		ev.ContainersStatuses = []*runtimeapi.ContainerStatus{nst.Status}
	}
	msg, _ := proto.Marshal(ev)
	if p.ics.containerEvent(ctx, msg) {
		t.Error("the event of the swap's unregistered container reached kubelet")
	}
	sideEv, _ := proto.Marshal(&runtimeapi.ContainerEventResponse{ContainerId: sideID, PodSandboxStatus: &runtimeapi.PodSandboxStatus{Id: sbID}})
	if !p.ics.containerEvent(ctx, sideEv) {
		t.Error("another container's event was dropped")
	}

	p.fences.Release(f, fence.Outcome{RunningID: newID, Committed: true})
	l, err = p.rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := ids(l.Containers)[newID]; !ok {
		t.Errorf("after the swap kubelet does not see its container: %v", ids(l.Containers))
	}
}

// TestOverridesEndWithTheirSandbox: kubelet never creates containers in a
// stopped sandbox, so a successful StopPodSandbox ends its overrides (and
// says so in the history); a failed one, or another sandbox, keeps them.
func TestOverridesEndWithTheirSandbox(t *testing.T) {
	p := newProxy(t)
	ctx := context.Background()
	sbID, otherID := p.twoPodsWithOverrides(t)
	p.be.Runtime.InjectError("StopPodSandbox", status.Error(codes.Internal, "cni teardown failed"))
	if _, err := p.rt.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: sbID}); status.Code(err) != codes.Internal {
		t.Fatalf("StopPodSandbox = %v, want the backend's Internal", err)
	}
	if _, err := p.st.Override(sbID, "app"); err != nil {
		t.Errorf("a failed StopPodSandbox dropped the override: %v", err)
	}
	if _, err := p.rt.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: sbID}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.st.Override(sbID, "app"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("override kept after its sandbox stopped: %v", err)
	}
	if _, err := p.st.Override(otherID, "app"); err != nil {
		t.Errorf("another sandbox's override dropped: %v", err)
	}
	recs, err := p.st.Swaps()
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 || recs[0].Kind != "override-dropped" || recs[0].SandboxId != sbID || recs[0].Container != "app" ||
		!strings.Contains(recs[0].Error, "stopped") || !strings.Contains(recs[0].Error, "swap-"+sbID) {
		t.Errorf("history %v, want one override-dropped record for the stopped sandbox", recs)
	}
	// Removing the other sandbox without a stop ends its override too.
	if _, err := p.rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: otherID}); err != nil {
		t.Fatal(err)
	}
	if o, err := p.st.Overrides(); err != nil || len(o) != 0 {
		t.Errorf("overrides left: %v, %v", o, err)
	}
	if recs, _ := p.st.Swaps(); len(recs) != 2 {
		t.Errorf("history %v, want two override-dropped records", recs)
	}
}

// TestMaskNewShowsOldTruth: before the swap stops the old container
// (pre-created new container, preStop), kubelet sees the old container as
// it really is — if it dies on its own, kubelet must see that — while the
// swap's new container stays hidden.
func TestMaskNewShowsOldTruth(t *testing.T) {
	p := newProxy(t)
	ctx := context.Background()
	sbID := p.runPod(t)
	oldID := p.kubeletStart(t, p.createReq(sbID, "app", 0, "h1"))
	st, err := p.be.RuntimeClient.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: oldID})
	if err != nil {
		t.Fatal(err)
	}
	l, err := p.be.RuntimeClient.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{Id: oldID}})
	if err != nil || len(l.Containers) != 1 {
		t.Fatalf("list old: %v, %v", l, err)
	}
	f, _, err := p.fences.Acquire(ctx, fence.Key{SandboxID: sbID, Name: "app"}, "swap-1", oldID)
	if err != nil {
		t.Fatal(err)
	}
	f.MaskNew(p.fences, st.Status, l.Containers[0])
	time.Sleep(time.Millisecond)
	resp, err := p.be.RuntimeClient.CreateContainer(ctx, p.createReq(sbID, "app", 1, "h1"))
	if err != nil {
		t.Fatal(err)
	}
	// The old container dies by itself.
	if _, err := p.be.RuntimeClient.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: oldID}); err != nil {
		t.Fatal(err)
	}
	got, err := p.rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
	if err != nil {
		t.Fatal(err)
	}
	states := ids(got.Containers)
	if _, ok := states[resp.ContainerId]; ok {
		t.Errorf("the swap's pre-created container is visible: %v", states)
	}
	if states[oldID] != runtimeapi.ContainerState_CONTAINER_EXITED {
		t.Errorf("old container shown %v, want its truth (EXITED) before the swap stops it", states[oldID])
	}
	cs, err := p.rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: oldID})
	if err != nil || cs.Status.State != runtimeapi.ContainerState_CONTAINER_EXITED {
		t.Errorf("ContainerStatus(old) = %v, %v; want EXITED", cs.GetStatus().GetState(), err)
	}
	// From the stop on, the snapshot is shown.
	f.Mask(p.fences, st.Status, l.Containers[0])
	got, _ = p.rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
	if s := ids(got.Containers)[oldID]; s != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Errorf("after Mask the old container is shown %v, want the RUNNING snapshot", s)
	}
	p.fences.Release(f, fence.Outcome{})
}

// TestPresentedHash: while a hash is presented for a container (an image
// swap whose spec write is pending), kubelet's List/ContainerStatus show
// it, the first ContainerStatus marks the container inspected, and after
// EndPresent the container's own hash shows again.
func TestPresentedHash(t *testing.T) {
	p := newProxy(t)
	ctx := context.Background()
	sb := p.runPod(t)
	id := p.kubeletStart(t, p.createReq(sb, "app", 0, "h-new"))
	other := p.kubeletStart(t, p.createReq(sb, "side", 0, "h-side"))
	hashes := func() map[string]string {
		resp, err := p.rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		for _, c := range resp.Containers {
			out[c.Id] = c.Annotations[swap.AnnotationHash]
		}
		return out
	}
	p.view.PresentHash(id, "h-old")
	relist := p.view.NextRelist()
	if _, err := p.rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{PodSandboxId: sb}}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-relist:
		t.Fatal("a filtered ListContainers counted as kubelet's relist")
	default:
	}
	if !p.ics.active() {
		t.Fatal("a presented hash must open the read interceptors' gate")
	}
	if h := hashes(); h[id] != "h-old" || h[other] != "h-side" {
		t.Fatalf("list while presented: %v", h)
	}
	select {
	case <-relist:
	default:
		t.Fatal("an unfiltered ListContainers (kubelet's relist) did not count")
	}
	select {
	case <-p.view.WhenInspected(id):
		t.Fatal("inspected before any ContainerStatus")
	default:
	}
	st, err := p.rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id})
	if err != nil {
		t.Fatal(err)
	}
	if got := st.Status.Annotations[swap.AnnotationHash]; got != "h-old" {
		t.Fatalf("ContainerStatus shows hash %q while h-old is presented", got)
	}
	select {
	case <-p.view.WhenInspected(id):
	case <-time.After(time.Second):
		t.Fatal("ContainerStatus did not mark the container inspected")
	}
	p.view.EndPresent(id)
	if p.ics.active() {
		t.Fatal("gate still open after EndPresent")
	}
	if h := hashes(); h[id] != "h-new" {
		t.Fatalf("list after EndPresent: %v", h)
	}
	if st, _ := p.rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id}); st.Status.Annotations[swap.AnnotationHash] != "h-new" {
		t.Fatalf("ContainerStatus after EndPresent: %v", st.Status.Annotations)
	}
}

// TestSweepOverrides: a sandbox stopped while the override could not be
// dropped (the stop went to the backend directly here, as it did through
// inplaced while the state store was full) loses its override at the sweep;
// a ready sandbox keeps its own; and nothing goes when the runtime cannot
// be asked.
func TestSweepOverrides(t *testing.T) {
	p := newProxy(t)
	ctx := context.Background()
	goneID, readyID := p.twoPodsWithOverrides(t)
	if _, err := p.be.RuntimeClient.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: goneID}); err != nil {
		t.Fatal(err)
	}
	p.be.Runtime.InjectError("ListPodSandbox", status.Error(codes.Unavailable, "containerd restarting"))
	p.ics.SweepOverrides(ctx, p.be.RuntimeClient)
	if o, _ := p.st.Overrides(); len(o) != 2 {
		t.Fatalf("overrides after a sweep that could not list the sandboxes: %v, want both kept", o)
	}
	p.ics.SweepOverrides(ctx, p.be.RuntimeClient)
	if _, err := p.st.Override(goneID, "app"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("override of the stopped sandbox kept: %v", err)
	}
	if _, err := p.st.Override(readyID, "app"); err != nil {
		t.Errorf("override of the ready sandbox dropped: %v", err)
	}
	if recs, _ := p.st.Swaps(); len(recs) != 1 || recs[0].Kind != "override-dropped" || recs[0].SandboxId != goneID {
		t.Errorf("history %v, want one override-dropped record for the stopped sandbox", recs)
	}
}

// twoPodsWithOverrides runs two pods ("web", then "other") and records an
// override of container app (swap "swap-<sandbox>") in each sandbox.
func (p *proxy) twoPodsWithOverrides(t *testing.T) (first, second string) {
	t.Helper()
	first = p.runPod(t)
	p.pod = fakecri.PodConfig("default", "other", "uid-other")
	second = p.runPod(t)
	for _, sb := range []string{first, second} {
		if err := p.st.PutOverride(&store.Override{SandboxID: sb, Namespace: "default", Pod: "web", Container: "app",
			SwapID: "swap-" + sb, Hash: "h1", Image: "registry.local/app:v2"}); err != nil {
			t.Fatal(err)
		}
	}
	return first, second
}
