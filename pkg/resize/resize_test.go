package resize

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/pkg/errkind"
	"github.com/inplaced/inplaced/pkg/resources"
	"github.com/inplaced/inplaced/pkg/store"
	"github.com/inplaced/inplaced/pkg/swap"
	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

const (
	mi      = int64(1 << 20)
	podCg   = "/kubepods/pod1"
	ctrCg   = "/kubepods/pod1/c1"
	ctrID   = "c1"
	sandbox = "s1"
)

var appTarget = &inplacedv1.Target{Namespace: "default", Pod: "web", Container: "app"}

// addRunc sets up a runc container c1 of pod web: pod and container CPU
// quotas as given (period 100000), container memory limit mem with usage.
func (f *fixture) addRunc(podQuota, ctrQuota, mem int64, usage uint64) {
	f.fs.cgroup(podCg, podQuota, 1024, -1, usage)
	f.fs.cgroup(ctrCg, ctrQuota, 512, mem, usage)
	f.rt.add(&fakeContainer{
		id: ctrID, sandbox: sandbox, cgroupsPath: ctrCg,
		labels: map[string]string{"io.kubernetes.pod.name": "web", "io.kubernetes.pod.namespace": "default", "io.kubernetes.container.name": "app"},
		res:    &runtimeapi.LinuxContainerResources{CpuPeriod: 100000, CpuQuota: ctrQuota, CpuShares: 512, MemoryLimitInBytes: mem},
		usage:  usage,
	}, "runc")
}

// cpuEvents keeps the runtime calls and the CPU quota writes.
func cpuEvents(ev []string) []string {
	var out []string
	for _, e := range ev {
		if strings.HasPrefix(e, "cri update") || strings.Contains(e, "cfs_quota_us=") {
			out = append(out, e)
		}
	}
	return out
}

func wantEvents(t *testing.T, got, want []string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Errorf("events:\n  got  %q\n  want %q", got, want)
	}
}

// The case: a CPU raise above the pod's quota. containerd alone
// fails there (EINVAL on v1, after changing memory); inplaced raises the pod
// first, then lets the runtime change the container, which now succeeds.
func TestResizeCPURaiseAbovePodQuota(t *testing.T) {
	f := newFixture(t)
	f.addRunc(50000, 50000, 256*mi, 100<<20)

	rec, err := f.r.Resize(context.Background(), &inplacedv1.ResizeRequest{Target: appTarget,
		Resources: &inplacedv1.Resources{CpuLimitMillis: 1500, MemoryLimitBytes: 512 * mi}}, 1000, 77)
	if err != nil {
		t.Fatalf("Resize: %v", err)
	}
	wantEvents(t, cpuEvents(f.ev.all()), []string{
		"write /cpu/kubepods/pod1/cpu.cfs_quota_us=150000",    // pod first: a raise
		"write /cpu/kubepods/pod1/c1/cpu.cfs_quota_us=150000", // then the runtime's own write
		"cri update c1: ok",
	})
	if got := f.fs.get(ctrCg, "memory.limit_in_bytes"); got != "536870912" {
		t.Errorf("container memory %s, want 536870912", got)
	}
	if got := f.fs.get(podCg, "cpu.cfs_quota_us"); got != "150000" {
		t.Errorf("pod quota %s, want 150000", got)
	}
	if r := f.rt.record(ctrID); r.CpuQuota != 150000 || r.MemoryLimitInBytes != 512*mi {
		t.Errorf("runtime record %v: want quota 150000 and memory 512Mi", r)
	}
	if rec.Result != ResultApplied || rec.Method != MethodCgroup || rec.Error != "" {
		t.Errorf("record: result %q method %q error %q", rec.Result, rec.Method, rec.Error)
	}
	if rec.InEffect.GetCpuQuota() != 150000 || rec.InEffect.GetMemoryLimitBytes() != 512*mi || rec.From.GetCpuQuota() != 50000 || rec.To.GetCpuQuota() != 150000 {
		t.Errorf("record values: from %v to %v in effect %v", rec.From, rec.To, rec.InEffect)
	}
	if len(rec.Repaired) != 1 || !strings.HasPrefix(rec.Repaired[0], "pod ") {
		t.Errorf("repaired %q: want the pod's quota only (the runtime changed the container)", rec.Repaired)
	}
	stored := f.rec.all()
	if len(stored) != 1 || stored[0].Id != rec.Id || stored[0].Caller.GetUid() != 1000 || stored[0].Caller.GetPid() != 77 ||
		stored[0].Namespace != "default" || stored[0].Pod != "web" || stored[0].Container != "app" || stored[0].DurationNs <= 0 {
		t.Errorf("stored records %v", stored)
	}
}

// A lowering goes through the runtime (the container drops) and leaves the
// pod where kubelet set it: kubelet still creates the container with its
// spec's limit after a restart, which cgroup v1 refuses above the pod's
// quota.
func TestResizeCPULoweringLeavesPod(t *testing.T) {
	f := newFixture(t)
	f.addRunc(150000, 150000, 256*mi, 100<<20)
	rec, err := f.r.Resize(context.Background(), &inplacedv1.ResizeRequest{Target: appTarget,
		Resources: &inplacedv1.Resources{CpuLimitMillis: 500}}, 0, 1)
	if err != nil {
		t.Fatalf("Resize: %v", err)
	}
	wantEvents(t, cpuEvents(f.ev.all()), []string{
		"write /cpu/kubepods/pod1/c1/cpu.cfs_quota_us=50000",
		"cri update c1: ok",
	})
	if len(rec.Repaired) != 0 {
		t.Errorf("repaired %q: want nothing (the pod stays)", rec.Repaired)
	}
	if got := f.fs.get(podCg, "cpu.cfs_quota_us"); got != "150000" {
		t.Errorf("pod quota %s, want 150000 as kubelet set it", got)
	}
	// A raise after it moves the pod by the raise: 500m → 1200m adds 700m.
	if _, err := f.r.Resize(context.Background(), &inplacedv1.ResizeRequest{Target: appTarget,
		Resources: &inplacedv1.Resources{CpuLimitMillis: 1200}}, 0, 1); err != nil {
		t.Fatalf("Resize up: %v", err)
	}
	if got := f.fs.get(podCg, "cpu.cfs_quota_us"); got != "220000" {
		t.Errorf("pod quota %s after the raise, want 220000", got)
	}
}

func TestPodPrev(t *testing.T) {
	i, u := func(v int64) *int64 { return &v }, func(v uint64) *uint64 { return &v }
	cpu := func(q int64) resources.Limits { return resources.Limits{CPUQuota: i(q), CPUPeriod: u(100000)} }
	for _, tc := range []struct {
		name            string
		old, want, decl resources.Limits
		known           bool
		prev            resources.Limits // the pod moves by want - prev
	}{
		{"unknown: a raise moves the pod exactly", cpu(30000), cpu(40000), resources.Limits{}, false, cpu(30000)},
		{"unknown: a lowering leaves the pod", cpu(30000), cpu(25000), resources.Limits{}, false, cpu(25000)},
		{"under the declared limit: the pod stays", cpu(30000), cpu(25000), cpu(30000), true, cpu(25000)},
		{"raise from under it: by what is above it", cpu(25000), cpu(35000), cpu(30000), true, cpu(30000)},
		{"lowering back under it: back to where it was", cpu(35000), cpu(25000), cpu(30000), true, cpu(30000)},
		{"above it both ways: exact", cpu(150000), cpu(50000), cpu(50000), true, cpu(150000)},
		{"declared in another period", cpu(30000), cpu(25000), resources.Limits{CPUQuota: i(60000), CPUPeriod: u(200000)}, true, cpu(25000)},
		{"memory under the declared limit: the pod stays",
			resources.Limits{MemoryLimit: i(64 * mi)}, resources.Limits{MemoryLimit: i(48 * mi)}, resources.Limits{MemoryLimit: i(64 * mi)}, true,
			resources.Limits{MemoryLimit: i(48 * mi)}},
		{"memory raise: exact above the declared limit",
			resources.Limits{MemoryLimit: i(64 * mi)}, resources.Limits{MemoryLimit: i(96 * mi)}, resources.Limits{MemoryLimit: i(64 * mi)}, true,
			resources.Limits{MemoryLimit: i(64 * mi)}},
		{"to unlimited: exact", cpu(30000), cpu(resources.Unlimited), cpu(30000), true, cpu(30000)},
		{"shares move exactly", resources.Limits{CPUShares: u(512)}, resources.Limits{CPUShares: u(2)}, cpu(30000), true, resources.Limits{CPUShares: u(512)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := podPrev(tc.old, tc.want, tc.decl, tc.known)
			if fmt.Sprint(vals(got)) != fmt.Sprint(vals(tc.prev)) {
				t.Errorf("podPrev = %v, want %v", vals(got), vals(tc.prev))
			}
		})
	}
}

func vals(l resources.Limits) []any {
	return []any{deref(l.CPUQuota, 0), deref(l.CPUPeriod, 0), deref(l.CPUShares, 0), deref(l.MemoryLimit, 0)}
}

// newKubelet300m is a fixture whose container kubelet created with 300m
// (and 256 MiB) in a pod of 300m, and a control API CPU resize that checks
// the container's and the pod's quota after it.
func newKubelet300m(t *testing.T) (*fixture, func(milli int64, wantPod string)) {
	f := newFixture(t)
	f.addRunc(30000, 30000, 256*mi, 100<<20)
	if err := f.rec.PutContainer(ctrID, &runtimeapi.CreateContainerRequest{PodSandboxId: sandbox, Config: &runtimeapi.ContainerConfig{
		Linux: &runtimeapi.LinuxContainerConfig{Resources: &runtimeapi.LinuxContainerResources{CpuPeriod: 100000, CpuQuota: 30000, MemoryLimitInBytes: 256 * mi}}}}); err != nil {
		t.Fatal(err)
	}
	return f, func(milli int64, wantPod string) {
		t.Helper()
		if _, err := f.r.Resize(context.Background(), &inplacedv1.ResizeRequest{Target: appTarget,
			Resources: &inplacedv1.Resources{CpuLimitMillis: milli}}, 0, 1); err != nil {
			t.Fatalf("Resize %dm: %v", milli, err)
		}
		if got := f.fs.get(podCg, "cpu.cfs_quota_us"); got != wantPod {
			t.Errorf("after %dm: pod quota %s, want %s", milli, got, wantPod)
		}
		if got, want := f.fs.get(ctrCg, "cpu.cfs_quota_us"), fmt.Sprint(milli*100); got != want {
			t.Errorf("after %dm: container quota %s, want %s", milli, got, want)
		}
	}
}

// The soak's case on a v1 node: kubelet created the container with 300m
// and set the pod to 300m. The control API lowering it to 250m leaves the
// pod, so kubelet's next create with 300m (a restart, a swap's new
// container) fits under it; a raise to 350m moves the pod by what is above
// 300m, and lowering back returns it to 300m. kubelet's own resize moves
// the floor.
func TestResizeKeepsPodAboveKubeletsLimits(t *testing.T) {
	f, resize := newKubelet300m(t)
	resize(250, "30000")
	resize(350, "35000")
	resize(250, "30000")
	resize(300, "30000")

	// kubelet resizes to 500m (it raises the pod first, as it does).
	f.fs.cgroup(podCg, 50000, 1024, -1, 100<<20)
	if _, err := f.r.UpdateContainerResources(context.Background(), &runtimeapi.UpdateContainerResourcesRequest{ContainerId: ctrID,
		Linux: &runtimeapi.LinuxContainerResources{CpuPeriod: 100000, CpuQuota: 50000}}, f.next); err != nil {
		t.Fatalf("kubelet's update: %v", err)
	}
	if req, _ := f.rec.Container(ctrID); req.GetConfig().GetLinux().GetResources().GetCpuQuota() != 50000 ||
		req.GetConfig().GetLinux().GetResources().GetMemoryLimitInBytes() != 256*mi {
		t.Errorf("recorded create after kubelet's resize: %v; want cpu 50000, memory unchanged", req.GetConfig().GetLinux().GetResources())
	}
	resize(250, "50000")
}

// kubelet's resizes that the resizer could not record (the state store took
// no writes) still move the pod rule's floor, and are recorded once it does:
// the 30-minute soak's finding. kubelet resized to 500m while the daemon
// passed its calls through; the control API's 250m then lowered the pod to
// 300m, below the 500m kubelet's next create asked, which cgroup v1 refused
// (EINVAL) until the pod crash-looped.
func TestResizeCountsKubeletsUnrecordedResizes(t *testing.T) {
	f, resize := newKubelet300m(t)
	recorded := func() int64 {
		t.Helper()
		req, err := f.rec.Container(ctrID)
		if err != nil {
			t.Fatal(err)
		}
		return req.GetConfig().GetLinux().GetResources().GetCpuQuota()
	}

	// kubelet's resize to 500m past the resizer: kubelet raises the pod, the
	// runtime the container.
	f.fs.cgroup(podCg, 50000, 1024, -1, 100<<20)
	if _, err := f.next(context.Background(), &runtimeapi.UpdateContainerResourcesRequest{ContainerId: ctrID,
		Linux: &runtimeapi.LinuxContainerResources{CpuPeriod: 100000, CpuQuota: 50000}}); err != nil {
		t.Fatal(err)
	}
	f.r.PassedThrough(ctrID, &runtimeapi.LinuxContainerResources{CpuPeriod: 100000, CpuQuota: 50000})
	resize(250, "50000")

	f.rec.putErr = errors.New("write state.db: no space left on device")
	if err := f.r.RecordMissed(); err == nil || !strings.Contains(err.Error(), "no space left") {
		t.Errorf("RecordMissed with a store that takes no writes: %v, want its error", err)
	}
	resize(300, "50000") // still noted

	// kubelet's own resize to 600m, its record refused: noted too, and newer.
	f.fs.cgroup(podCg, 60000, 1024, -1, 100<<20)
	if _, err := f.r.UpdateContainerResources(context.Background(), &runtimeapi.UpdateContainerResourcesRequest{ContainerId: ctrID,
		Linux: &runtimeapi.LinuxContainerResources{CpuPeriod: 100000, CpuQuota: 60000}}, f.next); err != nil {
		t.Fatalf("kubelet's update: %v", err)
	}
	resize(250, "60000")

	f.rec.putErr = nil
	if err := f.r.RecordMissed(); err != nil {
		t.Fatalf("RecordMissed: %v", err)
	}
	if q := recorded(); q != 60000 {
		t.Errorf("recorded create's quota %d after RecordMissed, want kubelet's 60000", q)
	}
	// A note is recorded once: kubelet's next resize (to 400m) is the floor.
	f.fs.cgroup(podCg, 60000, 1024, -1, 100<<20)
	if _, err := f.r.UpdateContainerResources(context.Background(), &runtimeapi.UpdateContainerResourcesRequest{ContainerId: ctrID,
		Linux: &runtimeapi.LinuxContainerResources{CpuPeriod: 100000, CpuQuota: 40000}}, f.next); err != nil {
		t.Fatalf("kubelet's update: %v", err)
	}
	f.fs.cgroup(podCg, 40000, 1024, -1, 100<<20) // kubelet lowers the pod after
	if err := f.r.RecordMissed(); err != nil {
		t.Fatal(err)
	}
	if q := recorded(); q != 40000 {
		t.Errorf("recorded create's quota %d after kubelet's 400m, want 40000", q)
	}
	resize(250, "40000")
}

// A memory limit at or below usage is refused before anything happens: no
// runtime call, no cgroup write, and the record says so.
func TestResizeBelowUsageTouchesNothing(t *testing.T) {
	f := newFixture(t)
	f.addRunc(-1, 50000, 512*mi, 300<<20)
	_, writesBefore := f.fs.counts()

	_, err := f.r.Resize(context.Background(), &inplacedv1.ResizeRequest{Target: appTarget,
		Resources: &inplacedv1.Resources{MemoryLimitBytes: 100 * mi, CpuLimitMillis: 1000}}, 0, 1)
	if status.Code(errkind.GRPC(err)) != codes.FailedPrecondition {
		t.Fatalf("Resize: %v, want FailedPrecondition", err)
	}
	for _, s := range []string{"314572800", "104857600"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not state %s", err, s)
		}
	}
	if _, w := f.fs.counts(); w != writesBefore {
		t.Errorf("%d cgroup writes, want none", w-writesBefore)
	}
	if len(f.rt.updates) != 0 || len(f.ev.all()) != 0 {
		t.Errorf("runtime updates %d, events %q: want none", len(f.rt.updates), f.ev.all())
	}
	if got := f.fs.get(ctrCg, "memory.limit_in_bytes"); got != "536870912" {
		t.Errorf("memory limit %s, want unchanged 536870912", got)
	}
	rec := RecordOf(err)
	if rec == nil || rec.Result != ResultRefused || rec.InEffect.GetMemoryLimitBytes() != 512*mi {
		t.Errorf("record in the error: %v", rec)
	}
	if s := f.rec.all(); len(s) != 1 || s[0].Result != ResultRefused {
		t.Errorf("stored %v, want one refused record", s)
	}

	// kubelet's own call is refused the same way, without reaching the runtime.
	_, err = f.r.UpdateContainerResources(context.Background(), &runtimeapi.UpdateContainerResourcesRequest{ContainerId: ctrID,
		Linux: &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: 100 * mi}}, f.nextMustNot(t))
	if status.Code(errkind.GRPC(err)) != codes.FailedPrecondition {
		t.Fatalf("kubelet update: %v, want FailedPrecondition", err)
	}
}

// Write 2 of the repair fails: the pod raise is undone by Apply, the memory
// the runtime had changed is put back, and the answer states what is in
// effect: the old values.
func TestResizeFailureRestoresEverything(t *testing.T) {
	f := newFixture(t)
	f.addRunc(50000, 50000, 256*mi, 100<<20)
	f.fs.fail["/fake/cpu"+ctrCg+"/cpu.cfs_quota_us=150000"] = syscall.EIO

	_, err := f.r.Resize(context.Background(), &inplacedv1.ResizeRequest{Target: appTarget,
		Resources: &inplacedv1.Resources{CpuLimitMillis: 1500, MemoryLimitBytes: 512 * mi}}, 0, 1)
	if status.Code(errkind.GRPC(err)) != codes.Aborted {
		t.Fatalf("Resize: %v, want Aborted (failed and undone)", err)
	}
	if !strings.Contains(err.Error(), "in effect: cpu quota 50000/100000 µs, cpu shares 512, memory 268435456 bytes") {
		t.Errorf("error %q does not state the values in effect", err)
	}
	for cg, want := range map[string]string{podCg: "50000", ctrCg: "50000"} {
		if got := f.fs.get(cg, "cpu.cfs_quota_us"); got != want {
			t.Errorf("%s quota %s, want %s", cg, got, want)
		}
	}
	for _, file := range []string{"memory.limit_in_bytes", "memory.memsw.limit_in_bytes"} {
		if got := f.fs.get(ctrCg, file); got != "268435456" {
			t.Errorf("container %s %s, want 268435456 again", file, got)
		}
	}
	if r := f.rt.record(ctrID); r.CpuQuota != 50000 || r.MemoryLimitInBytes != 256*mi {
		t.Errorf("runtime record %v, want the old values", r)
	}
	rec := RecordOf(err)
	if rec == nil || rec.Result != ResultFailed || rec.InEffect.GetCpuQuota() != 50000 || rec.InEffect.GetMemoryLimitBytes() != 256*mi || rec.Error == "" {
		t.Errorf("record %v", rec)
	}
}

// VM sandboxes: host cgroups do not reach the guest, so the resize goes
// through the runtime only and is verified through ContainerStatus.
func TestResizeVMUsesBackendOnly(t *testing.T) {
	f := newFixture(t)
	f.rt.add(&fakeContainer{
		id: "k1", sandbox: "kata-sb", cgroupsPath: "/kubepods/pod2/k1",
		labels: map[string]string{"io.kubernetes.pod.name": "vm", "io.kubernetes.pod.namespace": "default", "io.kubernetes.container.name": "app"},
		res:    &runtimeapi.LinuxContainerResources{CpuPeriod: 100000, CpuQuota: 50000, MemoryLimitInBytes: 256 * mi},
		usage:  100 << 20,
	}, "kata")
	reads, writes := f.fs.counts() // resources.New looked for cgroup.controllers

	rec, err := f.r.Resize(context.Background(), &inplacedv1.ResizeRequest{Target: &inplacedv1.Target{ContainerId: "k1"},
		Resources: &inplacedv1.Resources{CpuLimitMillis: 1500, MemoryLimitBytes: 512 * mi}}, 0, 1)
	if err != nil {
		t.Fatalf("Resize: %v", err)
	}
	if r, w := f.fs.counts(); r != reads || w != writes {
		t.Errorf("cgroup reads %d writes %d: want none for a VM sandbox", r-reads, w-writes)
	}
	if len(f.rt.updates) != 1 {
		t.Errorf("%d runtime updates, want 1", len(f.rt.updates))
	}
	if rec.Method != MethodBackend || rec.Result != ResultApplied || rec.InEffect.GetCpuQuota() != 150000 || rec.InEffect.GetMemoryLimitBytes() != 512*mi ||
		rec.RuntimeClass != "vm" || rec.Enforced != EnforcedRuntime || rec.Verified != VerifiedRuntimeOnly {
		t.Errorf("record %v", rec)
	}

	// Below usage (runtime stats) is refused there too, before the runtime.
	_, err = f.r.Resize(context.Background(), &inplacedv1.ResizeRequest{Target: &inplacedv1.Target{ContainerId: "k1"},
		Resources: &inplacedv1.Resources{MemoryLimitBytes: 50 * mi}}, 0, 1)
	if status.Code(errkind.GRPC(err)) != codes.FailedPrecondition || len(f.rt.updates) != 1 {
		t.Errorf("below usage: %v with %d runtime updates, want FailedPrecondition and no new update", err, len(f.rt.updates))
	}
}

// A running container whose cgroup inplaced cannot see (its own cgroup
// namespace, say) is resized through the runtime only, and the record says so.
func TestResizeCgroupNotVisibleUsesBackend(t *testing.T) {
	f := newFixture(t)
	f.rt.add(&fakeContainer{
		id: "h1", sandbox: "hidden-sb", cgroupsPath: "/elsewhere/pod3/h1",
		res: &runtimeapi.LinuxContainerResources{CpuPeriod: 100000, CpuQuota: 50000, MemoryLimitInBytes: 256 * mi},
	}, "crun") // per-container cgroups, which the fake runtime does not write
	rec, err := f.r.Resize(context.Background(), &inplacedv1.ResizeRequest{Target: &inplacedv1.Target{ContainerId: "h1"},
		Resources: &inplacedv1.Resources{CpuLimitMillis: 1500}}, 0, 1)
	if err != nil {
		t.Fatalf("Resize: %v", err)
	}
	if rec.Method != MethodBackend || rec.Result != ResultApplied || rec.InEffect.GetCpuQuota() != 150000 || !strings.Contains(rec.Error, "not visible") {
		t.Errorf("record %v", rec)
	}
	if _, w := f.fs.counts(); w != 0 {
		t.Errorf("%d cgroup writes, want none", w)
	}
}

func (f *fixture) next(ctx context.Context, req *runtimeapi.UpdateContainerResourcesRequest) (*runtimeapi.UpdateContainerResourcesResponse, error) {
	return f.rt.UpdateContainerResources(ctx, req)
}

func (f *fixture) nextMustNot(t *testing.T) func(context.Context, *runtimeapi.UpdateContainerResourcesRequest) (*runtimeapi.UpdateContainerResourcesResponse, error) {
	return func(context.Context, *runtimeapi.UpdateContainerResourcesRequest) (*runtimeapi.UpdateContainerResourcesResponse, error) {
		t.Error("the request reached the runtime")
		return &runtimeapi.UpdateContainerResourcesResponse{}, nil
	}
}

// kubelet raises the pod cgroup itself before its UpdateContainerResources
// (and lowers it after): inplaced must not move the pod a second time.
func TestKubeletUpdateLeavesPodToKubelet(t *testing.T) {
	f := newFixture(t)
	f.addRunc(150000, 50000, 256*mi, 100<<20) // kubelet has raised the pod already
	kubelet := func(quota int64) error {
		_, err := f.r.UpdateContainerResources(context.Background(), &runtimeapi.UpdateContainerResourcesRequest{ContainerId: ctrID,
			Linux: &runtimeapi.LinuxContainerResources{CpuPeriod: 100000, CpuQuota: quota, CpuShares: 512, MemoryLimitInBytes: 256 * mi}}, f.next)
		return err
	}
	if err := kubelet(150000); err != nil {
		t.Fatalf("raise: %v", err)
	}
	if err := kubelet(50000); err != nil {
		t.Fatalf("lower: %v", err)
	}
	wantEvents(t, cpuEvents(f.ev.all()), []string{
		"write /cpu/kubepods/pod1/c1/cpu.cfs_quota_us=150000",
		"cri update c1: ok",
		"write /cpu/kubepods/pod1/c1/cpu.cfs_quota_us=50000",
		"cri update c1: ok",
	})
	if got := f.fs.get(podCg, "cpu.cfs_quota_us"); got != "150000" {
		t.Errorf("pod quota %s, want 150000 as kubelet left it", got)
	}
	recs := f.rec.all()
	if len(recs) != 2 || recs[0].Caller != nil || recs[0].Result != ResultApplied || len(recs[0].Repaired) != 0 {
		t.Errorf("records %v: want two applied, no caller, nothing repaired", recs)
	}
}

// If kubelet's call reaches a pod that is too small (the runtime fails), the
// pod is raised just enough and the runtime is asked again.
func TestKubeletUpdateRepairsRuntimeFailure(t *testing.T) {
	f := newFixture(t)
	f.addRunc(50000, 50000, 256*mi, 100<<20)
	_, err := f.r.UpdateContainerResources(context.Background(), &runtimeapi.UpdateContainerResourcesRequest{ContainerId: ctrID,
		Linux: &runtimeapi.LinuxContainerResources{CpuPeriod: 100000, CpuQuota: 150000}}, f.next)
	if err != nil {
		t.Fatalf("update: %v", err)
	}
	if got := f.fs.get(podCg, "cpu.cfs_quota_us"); got != "150000" {
		t.Errorf("pod quota %s, want 150000", got)
	}
	if r := f.rt.record(ctrID); r.CpuQuota != 150000 {
		t.Errorf("runtime record quota %d, want 150000", r.CpuQuota)
	}
}

// Calls without CPU or memory limits (the CPU manager's cpuset updates) pass
// through untouched and unrecorded.
func TestKubeletUpdatePassThrough(t *testing.T) {
	f := newFixture(t)
	f.addRunc(-1, 50000, 256*mi, 100<<20)
	reads, _ := f.fs.counts()
	called := 0
	_, err := f.r.UpdateContainerResources(context.Background(), &runtimeapi.UpdateContainerResourcesRequest{ContainerId: ctrID,
		Linux: &runtimeapi.LinuxContainerResources{CpusetCpus: "0-1"}},
		func(context.Context, *runtimeapi.UpdateContainerResourcesRequest) (*runtimeapi.UpdateContainerResourcesResponse, error) {
			called++
			return &runtimeapi.UpdateContainerResourcesResponse{}, nil
		})
	if err != nil || called != 1 {
		t.Fatalf("err %v, next called %d times", err, called)
	}
	if r, _ := f.fs.counts(); r != reads || len(f.rec.all()) != 0 {
		t.Errorf("cgroup reads %d, records %d: want none", r-reads, len(f.rec.all()))
	}
	// Unknown container: the backend answers, with its own code.
	_, err = f.r.UpdateContainerResources(context.Background(), &runtimeapi.UpdateContainerResourcesRequest{ContainerId: "nope",
		Linux: &runtimeapi.LinuxContainerResources{CpuQuota: 100000}}, f.next)
	if status.Code(errkind.GRPC(err)) != codes.NotFound {
		t.Errorf("unknown container: %v, want the backend's NotFound", err)
	}
}

func TestResizeRequestErrors(t *testing.T) {
	f := newFixture(t)
	f.addRunc(-1, 50000, 256*mi, 100<<20)
	for _, tc := range []struct {
		name string
		req  *inplacedv1.ResizeRequest
		code codes.Code
	}{
		{"nothing", &inplacedv1.ResizeRequest{Target: appTarget, Resources: &inplacedv1.Resources{}}, codes.InvalidArgument},
		{"negative", &inplacedv1.ResizeRequest{Target: appTarget, Resources: &inplacedv1.Resources{CpuLimitMillis: -5}}, codes.InvalidArgument},
		{"huge", &inplacedv1.ResizeRequest{Target: appTarget, Resources: &inplacedv1.Resources{CpuLimitMillis: 1 << 62}}, codes.InvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := f.r.Resize(context.Background(), tc.req, 0, 1); status.Code(errkind.GRPC(err)) != tc.code {
				t.Errorf("err %v, want %s", err, tc.code)
			}
		})
	}
	// The target is resolved by package swap, whose refusals the control
	// API maps to their codes.
	for _, tc := range []struct {
		name string
		req  *inplacedv1.ResizeRequest
		kind error
	}{
		{"no target", &inplacedv1.ResizeRequest{Resources: &inplacedv1.Resources{CpuLimitMillis: 500}}, swap.ErrInvalid},
		{"unknown", &inplacedv1.ResizeRequest{Target: &inplacedv1.Target{ContainerId: "zz"}, Resources: &inplacedv1.Resources{CpuLimitMillis: 500}}, swap.ErrNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := f.r.Resize(context.Background(), tc.req, 0, 1); !errors.Is(err, tc.kind) {
				t.Errorf("err %v, want %v", err, tc.kind)
			}
		})
	}
	if len(f.rt.updates) != 0 || len(f.rec.all()) != 0 {
		t.Errorf("%d updates, %d records: want none", len(f.rt.updates), len(f.rec.all()))
	}
}

func TestCRIResources(t *testing.T) {
	for _, tc := range []struct {
		in     *inplacedv1.Resources
		period uint64
		want   *runtimeapi.LinuxContainerResources
	}{
		{&inplacedv1.Resources{CpuLimitMillis: 1500}, 100000, &runtimeapi.LinuxContainerResources{CpuPeriod: 100000, CpuQuota: 150000}},
		{&inplacedv1.Resources{CpuLimitMillis: 1500}, 0, &runtimeapi.LinuxContainerResources{CpuPeriod: 100000, CpuQuota: 150000}},
		{&inplacedv1.Resources{CpuLimitMillis: 250}, 50000, &runtimeapi.LinuxContainerResources{CpuPeriod: 50000, CpuQuota: 12500}},
		{&inplacedv1.Resources{CpuLimitMillis: 1}, 100000, &runtimeapi.LinuxContainerResources{CpuPeriod: 100000, CpuQuota: 1000}},
		{&inplacedv1.Resources{CpuRequestMillis: 500, MemoryLimitBytes: 512 * mi}, 100000, &runtimeapi.LinuxContainerResources{CpuShares: 512, MemoryLimitInBytes: 512 * mi}},
	} {
		got := criResources(tc.in, tc.period)
		if got.String() != tc.want.String() {
			t.Errorf("criResources(%v, %d) = %v, want %v", tc.in, tc.period, got, tc.want)
		}
	}
}

// Records land in the real store, newest last.
func TestResizeRecordedInStore(t *testing.T) {
	f := newFixture(t)
	f.addRunc(-1, 50000, 256*mi, 100<<20)
	st, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	f.r.store = st
	for _, m := range []int64{1000, 2000} {
		if _, err := f.r.Resize(context.Background(), &inplacedv1.ResizeRequest{Target: appTarget,
			Resources: &inplacedv1.Resources{CpuLimitMillis: m}}, 0, 9); err != nil {
			t.Fatal(err)
		}
	}
	recs, err := st.Resizes()
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 2 || recs[0].To.GetCpuQuota() != 100000 || recs[1].To.GetCpuQuota() != 200000 || recs[1].From.GetCpuQuota() != 100000 {
		t.Errorf("stored %v", recs)
	}
}
