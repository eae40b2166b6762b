package daemon

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/pkg/health"
	"github.com/inplaced/inplaced/pkg/resize"
	"github.com/inplaced/inplaced/pkg/store"
	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

// While the state store is unusable kubelet's UpdateContainerResources goes
// to the backend as it came, and the resizer notes its limits; the keeper's
// sweep (once the store is back) records them in the container's create.
func TestPassedThroughResizeIsRecordedLater(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "state.db"), []byte("damaged"), 0o600); err != nil {
		t.Fatal(err)
	}
	st := store.OpenOrDegrade(dir)
	defer st.Close()
	if st.Problem() == nil {
		t.Fatal("a damaged state.db opened without a problem")
	}
	rec := &memRecorder{containers: map[string]*runtimeapi.CreateContainerRequest{"c1": {Config: &runtimeapi.ContainerConfig{
		Linux: &runtimeapi.LinuxContainerConfig{Resources: &runtimeapi.LinuxContainerResources{CpuPeriod: 100000, CpuQuota: 30000}}}}}}
	r, err := resize.New(resize.Options{Runtime: runtimeapi.NewRuntimeServiceClient(nil), Store: rec})
	if err != nil {
		t.Fatal(err)
	}
	g := guardedResizer{r: r, k: &stateKeeper{st: st, board: health.New()}}
	var passed int
	next := func(context.Context, *runtimeapi.UpdateContainerResourcesRequest) (*runtimeapi.UpdateContainerResourcesResponse, error) {
		passed++
		return &runtimeapi.UpdateContainerResourcesResponse{}, nil
	}
	if _, err := g.UpdateContainerResources(context.Background(), &runtimeapi.UpdateContainerResourcesRequest{ContainerId: "c1",
		Linux: &runtimeapi.LinuxContainerResources{CpuPeriod: 100000, CpuQuota: 50000}}, next); err != nil || passed != 1 {
		t.Fatalf("kubelet's resize with the store unusable: %v, %d calls to the backend; want it passed through", err, passed)
	}
	if q := rec.quota("c1"); q != 30000 {
		t.Fatalf("recorded quota %d while the store is unusable, want 30000 (nothing written)", q)
	}
	if err := r.RecordMissed(); err != nil {
		t.Fatal(err)
	}
	if q := rec.quota("c1"); q != 50000 {
		t.Errorf("recorded quota %d after the sweep, want kubelet's 50000", q)
	}
}

// memRecorder is an in-memory resize.Recorder.
type memRecorder struct {
	mu         sync.Mutex
	containers map[string]*runtimeapi.CreateContainerRequest
}

func (m *memRecorder) PutResize(*inplacedv1.ResizeRecord) error { return nil }

func (m *memRecorder) Container(id string) (*runtimeapi.CreateContainerRequest, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	c, ok := m.containers[id]
	if !ok {
		return nil, store.ErrNotFound
	}
	return proto.Clone(c).(*runtimeapi.CreateContainerRequest), nil
}

func (m *memRecorder) PutContainer(id string, req *runtimeapi.CreateContainerRequest) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.containers[id] = proto.Clone(req).(*runtimeapi.CreateContainerRequest)
	return nil
}

func (m *memRecorder) quota(id string) int64 {
	c, _ := m.Container(id)
	return c.GetConfig().GetLinux().GetResources().GetCpuQuota()
}
