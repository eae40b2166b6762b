package resize

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"path"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/pkg/resources"
	"github.com/inplaced/inplaced/pkg/store"
	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

// events is the ordered log of what the runtime and the cgroup files saw,
// shared by fakeFS and fakeRuntime so a test can assert the interleaving.
type events struct {
	mu  sync.Mutex
	log []string
}

func (e *events) add(format string, args ...any) {
	e.mu.Lock()
	e.log = append(e.log, fmt.Sprintf(format, args...))
	e.mu.Unlock()
}

func (e *events) all() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.log...)
}

const fakeRoot = "/fake"

// fakeFS is a cgroup v1 tree in memory (<root>/<controller>/<cgroup>/<file>)
// that refuses what the v1 kernel refuses: a CPU quota above the parent's
// (or a parent quota below a child's) with EINVAL, a memory limit above
// memsw or memsw below the limit with EINVAL, a memory limit below usage
// with EBUSY. fail injects an error for one path and value, after the
// kernel's own checks passed.
type fakeFS struct {
	ev     *events
	mu     sync.Mutex
	files  map[string]string
	reads  int
	writes int
	fail   map[string]error // "<path>=<value>" → error
}

func newFakeFS(ev *events) *fakeFS {
	return &fakeFS{ev: ev, files: map[string]string{}, fail: map[string]error{}}
}

func (f *fakeFS) file(cg, name string) string {
	controller, _, _ := strings.Cut(name, ".")
	return path.Join(fakeRoot, controller, cg, name)
}

// cgroup creates cg with a v1 CPU and memory setup.
func (f *fakeFS) cgroup(cg string, quota int64, shares uint64, mem int64, usage uint64) {
	f.set(cg, "cpu.cfs_quota_us", strconv.FormatInt(quota, 10))
	f.set(cg, "cpu.cfs_period_us", "100000")
	f.set(cg, "cpu.shares", strconv.FormatUint(shares, 10))
	f.set(cg, "memory.limit_in_bytes", strconv.FormatInt(mem, 10))
	f.set(cg, "memory.memsw.limit_in_bytes", strconv.FormatInt(mem, 10))
	f.set(cg, "memory.usage_in_bytes", strconv.FormatUint(usage, 10))
}

func (f *fakeFS) set(cg, name, v string) {
	f.mu.Lock()
	f.files[f.file(cg, name)] = v
	f.mu.Unlock()
}

func (f *fakeFS) get(cg, name string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.files[f.file(cg, name)]
}

func (f *fakeFS) counts() (reads, writes int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.reads, f.writes
}

func (f *fakeFS) ReadFile(p string) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reads++
	v, ok := f.files[p]
	if !ok {
		return nil, &fs.PathError{Op: "open", Path: p, Err: fs.ErrNotExist}
	}
	return []byte(v + "\n"), nil
}

func (f *fakeFS) WriteFile(p string, data []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.writes++
	v := strings.TrimSpace(string(data))
	if _, ok := f.files[p]; !ok {
		return &fs.PathError{Op: "open", Path: p, Err: fs.ErrNotExist}
	}
	if err := f.kernelCheck(p, v); err != nil {
		return &fs.PathError{Op: "write", Path: p, Err: err}
	}
	if err := f.fail[p+"="+v]; err != nil {
		return &fs.PathError{Op: "write", Path: p, Err: err}
	}
	f.files[p] = v
	f.ev.add("write %s=%s", strings.TrimPrefix(p, fakeRoot), v)
	return nil
}

func (f *fakeFS) num(p string) (int64, bool) {
	s, ok := f.files[p]
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil
}

// kernelCheck applies the v1 rules; all cgroups here use one period.
func (f *fakeFS) kernelCheck(p, v string) error {
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return syscall.EINVAL
	}
	dir, name := path.Dir(p), path.Base(p)
	lim := func(x int64) int64 { // -1 is +∞
		if x < 0 {
			return 1<<63 - 1
		}
		return x
	}
	switch name {
	case "cpu.cfs_quota_us":
		if pq, ok := f.num(path.Join(path.Dir(dir), name)); ok && n != -1 && pq != -1 && n > pq {
			return syscall.EINVAL
		}
		for k := range f.files {
			if path.Base(k) == name && path.Dir(path.Dir(k)) == dir {
				if cq, _ := f.num(k); cq != -1 && lim(n) < cq {
					return syscall.EINVAL
				}
			}
		}
	case "memory.limit_in_bytes":
		if sw, ok := f.num(path.Join(dir, "memory.memsw.limit_in_bytes")); ok && lim(n) > lim(sw) {
			return syscall.EINVAL
		}
		if u, ok := f.num(path.Join(dir, "memory.usage_in_bytes")); ok && lim(n) < u {
			return syscall.EBUSY
		}
	case "memory.memsw.limit_in_bytes":
		if l, ok := f.num(path.Join(dir, "memory.limit_in_bytes")); ok && lim(n) < lim(l) {
			return syscall.EINVAL
		}
	}
	return nil
}

// fakeContainer is what the fake runtime knows of a container.
type fakeContainer struct {
	id, sandbox, cgroupsPath string
	labels                   map[string]string
	state                    runtimeapi.ContainerState
	res                      *runtimeapi.LinuxContainerResources // the runtime's record
	usage                    uint64                              // ContainerStats memory
}

// fakeRuntime is a CRI backend that updates containers the way containerd
// with runc does on cgroup v1: it writes the whole merged resource set into
// the cgroup files (memory, then CPU shares, period, quota), stops at the
// first error without undoing, and keeps its record only on success. For
// other handlers (VM sandboxes, whose containers have no host cgroup) only
// the record changes.
type fakeRuntime struct {
	runtimeapi.RuntimeServiceClient // unimplemented methods panic

	ev         *events
	fs         *fakeFS
	mu         sync.Mutex
	containers map[string]*fakeContainer
	handlers   map[string]string // sandbox ID → runtime handler
	updates    []*runtimeapi.UpdateContainerResourcesRequest
}

func newFakeRuntime(ev *events, fsys *fakeFS) *fakeRuntime {
	return &fakeRuntime{ev: ev, fs: fsys, containers: map[string]*fakeContainer{}, handlers: map[string]string{}}
}

func (r *fakeRuntime) add(c *fakeContainer, handler string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if c.state == 0 {
		c.state = runtimeapi.ContainerState_CONTAINER_RUNNING
	}
	r.containers[c.id] = c
	r.handlers[c.sandbox] = handler
}

func (r *fakeRuntime) record(id string) *runtimeapi.LinuxContainerResources {
	r.mu.Lock()
	defer r.mu.Unlock()
	return proto.Clone(r.containers[id].res).(*runtimeapi.LinuxContainerResources)
}

func (r *fakeRuntime) lookup(id string) (*fakeContainer, error) {
	c, ok := r.containers[id]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "container %q not found", id)
	}
	return c, nil
}

func (r *fakeRuntime) ListContainers(_ context.Context, req *runtimeapi.ListContainersRequest, _ ...grpc.CallOption) (*runtimeapi.ListContainersResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	resp := &runtimeapi.ListContainersResponse{}
	for _, c := range r.containers {
		if id := req.GetFilter().GetId(); id != "" && id != c.id {
			continue
		}
		if sb := req.GetFilter().GetPodSandboxId(); sb != "" && sb != c.sandbox {
			continue
		}
		match := true
		for k, v := range req.GetFilter().GetLabelSelector() {
			match = match && c.labels[k] == v
		}
		if match {
			resp.Containers = append(resp.Containers, &runtimeapi.Container{Id: c.id, PodSandboxId: c.sandbox, State: c.state, Labels: c.labels,
				Metadata: &runtimeapi.ContainerMetadata{Name: c.labels["io.kubernetes.container.name"]}})
		}
	}
	return resp, nil
}

func (r *fakeRuntime) ContainerStatus(_ context.Context, req *runtimeapi.ContainerStatusRequest, _ ...grpc.CallOption) (*runtimeapi.ContainerStatusResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c, err := r.lookup(req.GetContainerId())
	if err != nil {
		return nil, err
	}
	resp := &runtimeapi.ContainerStatusResponse{Status: &runtimeapi.ContainerStatus{
		Id: c.id, State: c.state, Labels: c.labels,
		Resources: &runtimeapi.ContainerResources{Linux: proto.Clone(c.res).(*runtimeapi.LinuxContainerResources)},
	}}
	if req.GetVerbose() {
		info := map[string]any{"sandboxID": c.sandbox, "pid": 4242}
		if c.cgroupsPath != "" {
			info["runtimeSpec"] = map[string]any{"linux": map[string]any{"cgroupsPath": c.cgroupsPath}}
		}
		b, _ := json.Marshal(info)
		resp.Info = map[string]string{"info": string(b)}
	}
	return resp, nil
}

func (r *fakeRuntime) PodSandboxStatus(_ context.Context, req *runtimeapi.PodSandboxStatusRequest, _ ...grpc.CallOption) (*runtimeapi.PodSandboxStatusResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	h, ok := r.handlers[req.GetPodSandboxId()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "sandbox %q not found", req.GetPodSandboxId())
	}
	return &runtimeapi.PodSandboxStatusResponse{Status: &runtimeapi.PodSandboxStatus{Id: req.GetPodSandboxId(), RuntimeHandler: h,
		State: runtimeapi.PodSandboxState_SANDBOX_READY}}, nil
}

func (r *fakeRuntime) ContainerStats(_ context.Context, req *runtimeapi.ContainerStatsRequest, _ ...grpc.CallOption) (*runtimeapi.ContainerStatsResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c, err := r.lookup(req.GetContainerId())
	if err != nil {
		return nil, err
	}
	return &runtimeapi.ContainerStatsResponse{Stats: &runtimeapi.ContainerStats{
		Memory: &runtimeapi.MemoryUsage{UsageBytes: &runtimeapi.UInt64Value{Value: c.usage}}}}, nil
}

func (r *fakeRuntime) UpdateContainerResources(_ context.Context, req *runtimeapi.UpdateContainerResourcesRequest, _ ...grpc.CallOption) (*runtimeapi.UpdateContainerResourcesResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.updates = append(r.updates, proto.Clone(req).(*runtimeapi.UpdateContainerResourcesRequest))
	c, err := r.lookup(req.GetContainerId())
	if err != nil {
		return nil, err
	}
	merged := proto.Clone(c.res).(*runtimeapi.LinuxContainerResources)
	l := req.GetLinux()
	if l.GetCpuPeriod() != 0 {
		merged.CpuPeriod = l.CpuPeriod
	}
	if l.GetCpuQuota() != 0 {
		merged.CpuQuota = l.CpuQuota
	}
	if l.GetCpuShares() != 0 {
		merged.CpuShares = l.CpuShares
	}
	if l.GetMemoryLimitInBytes() != 0 {
		merged.MemoryLimitInBytes = l.MemoryLimitInBytes
	}
	if r.handlers[c.sandbox] == "runc" { // others: a VM, or a cgroup this test cannot see
		if err := r.runcUpdate(c.cgroupsPath, merged); err != nil {
			r.ev.add("cri update %s: %v", short(c.id), err)
			return nil, status.Errorf(codes.Unknown, "failed to update resources: runc update: %v", err)
		}
	}
	c.res = merged
	r.ev.add("cri update %s: ok", short(c.id))
	return &runtimeapi.UpdateContainerResourcesResponse{}, nil
}

// runcUpdate writes like runc's v1 fs driver: memory (memsw first when it
// grows), then shares, period, quota; the first error stops it.
func (r *fakeRuntime) runcUpdate(cg string, res *runtimeapi.LinuxContainerResources) error {
	w := func(name string, v int64) error {
		return r.fs.WriteFile(r.fs.file(cg, name), []byte(strconv.FormatInt(v, 10)))
	}
	if m := res.GetMemoryLimitInBytes(); m != 0 {
		cur, _ := strconv.ParseInt(r.fs.get(cg, "memory.limit_in_bytes"), 10, 64)
		order := []string{"memory.limit_in_bytes", "memory.memsw.limit_in_bytes"}
		if m == -1 || cur < m {
			order[0], order[1] = order[1], order[0]
		}
		for _, name := range order {
			if err := w(name, m); err != nil {
				return err
			}
		}
	}
	for _, s := range []struct {
		name string
		v    int64
	}{{"cpu.shares", res.GetCpuShares()}, {"cpu.cfs_period_us", res.GetCpuPeriod()}, {"cpu.cfs_quota_us", res.GetCpuQuota()}} {
		if s.v == 0 {
			continue
		}
		if err := w(s.name, s.v); err != nil {
			return err
		}
	}
	return nil
}

// recorder is an in-memory Recorder.
type recorder struct {
	mu         sync.Mutex
	recs       []*inplacedv1.ResizeRecord
	containers map[string]*runtimeapi.CreateContainerRequest
	putErr     error // PutContainer's answer when set: a store that takes no writes
}

func (s *recorder) Container(id string) (*runtimeapi.CreateContainerRequest, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.containers[id]; ok {
		return proto.Clone(c).(*runtimeapi.CreateContainerRequest), nil
	}
	return nil, store.ErrNotFound
}

func (s *recorder) PutContainer(id string, req *runtimeapi.CreateContainerRequest) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.putErr != nil {
		return s.putErr
	}
	if s.containers == nil {
		s.containers = map[string]*runtimeapi.CreateContainerRequest{}
	}
	s.containers[id] = proto.Clone(req).(*runtimeapi.CreateContainerRequest)
	return nil
}

func (s *recorder) PutResize(r *inplacedv1.ResizeRecord) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.recs = append(s.recs, proto.Clone(r).(*inplacedv1.ResizeRecord))
	return nil
}

func (s *recorder) all() []*inplacedv1.ResizeRecord {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*inplacedv1.ResizeRecord(nil), s.recs...)
}

// fixture is a resizer over a fake runtime and a fake cgroup tree.
type fixture struct {
	ev  *events
	fs  *fakeFS
	rt  *fakeRuntime
	rec *recorder
	r   *Resizer
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	ev := &events{}
	f := &fixture{ev: ev, fs: newFakeFS(ev), rec: &recorder{}}
	f.rt = newFakeRuntime(ev, f.fs)
	cg, err := resources.New(fakeRoot, resources.WithFS(f.fs))
	if err != nil {
		t.Fatal(err)
	}
	if cg.Version() != 1 {
		t.Fatalf("fake tree detected as cgroup v%d", cg.Version())
	}
	f.r, err = New(Options{Runtime: f.rt, Cgroups: cg, Store: f.rec})
	if err != nil {
		t.Fatal(err)
	}
	return f
}
