package resize

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/pkg/errkind"
	"github.com/inplaced/inplaced/pkg/runtimeclass"
	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

// addRunsc sets up container c1 of pod web on gVisor: the pod cgroup contains
// the sandbox (memory podMem, usage), the container's own host cgroup exists
// but governs nothing, and runsc's update only changes its record.
func (f *fixture) addRunsc(podMem, usage int64) {
	f.fs.cgroup("/kubepods", -1, 2048, -1, uint64(usage))
	f.fs.cgroup(podCg, -1, 1024, podMem, uint64(usage))
	f.fs.cgroup(ctrCg, -1, 2, -1, 0)
	f.rt.add(&fakeContainer{
		id: ctrID, sandbox: sandbox, cgroupsPath: ctrCg,
		labels: map[string]string{"io.kubernetes.pod.name": "web", "io.kubernetes.pod.namespace": "default", "io.kubernetes.container.name": "app"},
		res:    &runtimeapi.LinuxContainerResources{CpuPeriod: 100000, CpuShares: 2},
	}, "runsc")
	tab, err := runtimeclass.New([]runtimeclass.Class{{Handler: "runsc", Enforcement: runtimeclass.SandboxCgroup,
		Overhead: runtimeclass.Overhead{CPUMillis: 100, MemoryBytes: 32 * mi}}})
	if err != nil {
		panic(err)
	}
	f.r.classes = tab
}

// On runsc the pod cgroup is resized to the container's limits plus the pod
// overhead, the runtime is told, the container's own cgroup (which has no
// process) is not written, and the record says where the limit is enforced.
func TestResizeSandboxAlone(t *testing.T) {
	f := newFixture(t)
	f.addRunsc(128*mi, 60*mi)
	rec, err := f.r.Resize(context.Background(), &inplacedv1.ResizeRequest{Target: appTarget,
		Resources: &inplacedv1.Resources{CpuLimitMillis: 700, MemoryLimitBytes: 200 * mi}}, 0, 1)
	if err != nil {
		t.Fatalf("Resize: %v", err)
	}
	if got := f.fs.get(podCg, "memory.limit_in_bytes"); got != "243269632" { // 200Mi + 32Mi
		t.Errorf("pod memory %s, want 243269632", got)
	}
	if got := f.fs.get(podCg, "cpu.cfs_quota_us"); got != "80000" { // 700m + 100m
		t.Errorf("pod quota %s, want 80000", got)
	}
	if got := f.fs.get(ctrCg, "memory.limit_in_bytes"); got != "-1" {
		t.Errorf("container cgroup memory %s: written, but it governs nothing", got)
	}
	wantEvents(t, f.ev.all(), []string{ // a raise: the pod first, then the runtime
		"write /memory/kubepods/pod1/memory.memsw.limit_in_bytes=243269632",
		"write /memory/kubepods/pod1/memory.limit_in_bytes=243269632",
		"write /cpu/kubepods/pod1/cpu.cfs_quota_us=80000",
		"cri update c1: ok",
	})
	if rec.Method != MethodSandbox || rec.Result != ResultApplied || rec.RuntimeHandler != "runsc" || rec.RuntimeClass != "sandbox-cgroup" {
		t.Errorf("record: method %q result %q handler %q class %q", rec.Method, rec.Result, rec.RuntimeHandler, rec.RuntimeClass)
	}
	if rec.InEffect.GetMemoryLimitBytes() != 232*mi || rec.InEffect.GetCpuQuota() != 80000 || rec.From.GetMemoryLimitBytes() != 128*mi ||
		rec.Requested.GetMemoryLimitBytes() != 200*mi || rec.Requested.GetCpuQuota() != 70000 {
		t.Errorf("record values: from %v requested %v in effect %v", rec.From, rec.Requested, rec.InEffect)
	}
	if rec.Enforced != EnforcedSandbox || !strings.Contains(rec.EnforcedBy, "pod cgroup /kubepods/pod1") || rec.Verified != VerifiedReadBack {
		t.Errorf("words: enforced %q by %q verified %q", rec.Enforced, rec.EnforcedBy, rec.Verified)
	}
}

// A lowering: the runtime first, then the pod cgroup; below the sandbox's
// usage it is refused before anything changes.
func TestResizeSandboxLowering(t *testing.T) {
	f := newFixture(t)
	f.addRunsc(512*mi, 100*mi)
	if _, err := f.r.Resize(context.Background(), &inplacedv1.ResizeRequest{Target: appTarget,
		Resources: &inplacedv1.Resources{MemoryLimitBytes: 256 * mi}}, 0, 1); err != nil {
		t.Fatalf("Resize: %v", err)
	}
	wantEvents(t, f.ev.all(), []string{
		"cri update c1: ok",
		"write /memory/kubepods/pod1/memory.limit_in_bytes=301989888",
		"write /memory/kubepods/pod1/memory.memsw.limit_in_bytes=301989888",
	})

	_, err := f.r.Resize(context.Background(), &inplacedv1.ResizeRequest{Target: appTarget,
		Resources: &inplacedv1.Resources{MemoryLimitBytes: 50 * mi}}, 0, 1)
	if status.Code(errkind.GRPC(err)) != codes.FailedPrecondition || !strings.Contains(err.Error(), "uses 104857600 bytes") {
		t.Errorf("below the sandbox's usage: %v, want FailedPrecondition stating usage", err)
	}
	if got := f.fs.get(podCg, "memory.limit_in_bytes"); got != "301989888" || len(f.rt.updates) != 1 {
		t.Errorf("after the refusal: pod memory %s, %d runtime updates; want 301989888 and 1", got, len(f.rt.updates))
	}
}

// With another container in the sandbox, a limit for one container would be
// enforced by nothing: refused, with what to do instead, and nothing changed.
func TestResizeSandboxRefusesPerContainer(t *testing.T) {
	f := newFixture(t)
	f.addRunsc(256*mi, 10*mi)
	f.rt.add(&fakeContainer{id: "c2", sandbox: sandbox, cgroupsPath: "/kubepods/pod1/c2",
		labels: map[string]string{"io.kubernetes.container.name": "sidecar"}, res: &runtimeapi.LinuxContainerResources{}}, "runsc")
	rec, err := f.r.Resize(context.Background(), &inplacedv1.ResizeRequest{Target: appTarget,
		Resources: &inplacedv1.Resources{MemoryLimitBytes: 100 * mi}}, 0, 1)
	if status.Code(errkind.GRPC(err)) != codes.FailedPrecondition {
		t.Fatalf("Resize: %v, want FailedPrecondition", err)
	}
	for _, s := range []string{"only for the whole sandbox", "(sidecar)", "nothing was changed", "--subresource resize", "in a pod of its own"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("message lacks %q: %v", s, err)
		}
	}
	if _, w := f.fs.counts(); w != 0 || len(f.rt.updates) != 0 {
		t.Errorf("%d cgroup writes and %d runtime updates, want none", w, len(f.rt.updates))
	}
	if RecordOf(err).GetResult() != ResultRefused || rec.GetInEffect().GetMemoryLimitBytes() != 256*mi {
		t.Errorf("record: %v", rec)
	}
}

// kubelet's own resize of a sandboxed pod passes through: kubelet sets the
// pod cgroup itself; inplaced writes nothing and records the pod's values.
func TestResizeSandboxKubeletPassesThrough(t *testing.T) {
	f := newFixture(t)
	f.addRunsc(256*mi, 10*mi)
	f.fs.set(podCg, "memory.limit_in_bytes", "402653184") // kubelet raised the pod first
	_, err := f.r.UpdateContainerResources(context.Background(), &runtimeapi.UpdateContainerResourcesRequest{ContainerId: ctrID,
		Linux: &runtimeapi.LinuxContainerResources{CpuPeriod: 100000, CpuQuota: 50000, MemoryLimitInBytes: 384 * mi}}, f.next)
	if err != nil {
		t.Fatal(err)
	}
	if _, w := f.fs.counts(); w != 0 || len(f.rt.updates) != 1 {
		t.Errorf("%d cgroup writes and %d runtime updates, want none and kubelet's", w, len(f.rt.updates))
	}
	recs := f.rec.all()
	if len(recs) != 1 || recs[0].Method != MethodSandbox || recs[0].InEffect.GetMemoryLimitBytes() != 384*mi || recs[0].Verified != VerifiedKubeletSandbox {
		t.Errorf("records %v", recs)
	}
}
