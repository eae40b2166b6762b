package guest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/test/harness"
)

const (
	mi      = int64(1 << 20)
	burnTwo = "while :; do :; done & while :; do :; done"
)

// TestResize resizes containers of kubelet's static pods in place on cgroup
// v2 with the systemd driver, where a container is the scope
// cri-containerd-<id>.scope in its pod's slice
// kubepods-burstable-pod<uid>.slice, and checks the real files:
//   - cpu: a burner under 0.5 CPU uses about 0.5 (cpu.stat); containerd alone
//     raising it to 1.5 CPU changes the scope's cpu.max but the pod slice's
//     cpu.max, which kubelet set to the pod's limit, still holds it at 0.5;
//     `inplacectl resize --cpu 1500m` raises the slice too: cpu.max
//     "150000 100000", more than 1 CPU, same container ID, PID and StartedAt;
//     lowering back puts both at 0.5;
//   - memory: raising memory.max keeps a process holding 64 MiB running; a
//     limit below memory.current is refused and memory.max stays;
//   - kubelet-path: the same through CRI UpdateContainerResources sent to
//     inplaced's socket as kubelet sends it;
//   - kubelet-resize: a pod created through the API server, resized through
//     its resize subresource: kubelet itself raises the pod slice and sends
//     UpdateContainerResources through inplaced (its resize record and
//     journal show it); a burner at ~0.5 CPU uses more than 1 after the
//     resize to 1.5 CPU, cpu.max "150000 100000", same container ID, PID and
//     StartedAt.
func TestResize(t *testing.T) {
	if cs := kubeIfAny(); cs != nil {
		// Started with the static pods (a pod start takes 20-35 s under
		// TCG); its burner waits for /tmp/go, so it takes no CPU from the
		// other subtests' measurements.
		createPods(t, cs, pod{name: "rz-api", image: imgBusybox, command: []string{"sh", "-c", "until cat /tmp/go 2>/dev/null; do sleep 1; done; " + burnTwo},
			cpuReq: "250m", cpuLim: "500m", memReq: "64Mi", memLim: "128Mi"})
	}
	writePods(t,
		pod{name: "rz-cpu", image: imgBusybox, command: []string{"sh", "-c", burnTwo}, cpuReq: "250m", cpuLim: "500m", memReq: "64Mi", memLim: "128Mi"},
		pod{name: "rz-mem", image: imgBusybox, command: []string{"sh", "-c", `x=$(head -c 67108864 /dev/zero | tr "\0" a); echo held; sleep 2147483647; :`},
			cpuReq: "100m", cpuLim: "1", memReq: "128Mi", memLim: "256Mi"},
		pod{name: "rz-kube", image: imgBusybox, command: []string{"sleep", "2147483647"}, cpuReq: "100m", cpuLim: "500m", memReq: "64Mi", memLim: "128Mi"},
	)
	e := &rzEnv{proxy: harness.DialCRI(t, proxySocket), direct: harness.DialCRI(t, containerdSocket)}
	start := time.Now()
	for _, n := range []string{"rz-cpu", "rz-mem", "rz-kube"} {
		waitPod(t, n, 5*time.Minute, harness.Running(container))
	}
	t.Logf("kubelet runs the 3 pods after %s", time.Since(start).Round(time.Second))
	t.Run("cpu", e.testCPU)
	t.Run("memory", e.testMemory)
	t.Run("kubelet-path", e.testKubeletPath)
	t.Run("kubelet-resize", e.testAPIResize)
}

type rzEnv struct {
	proxy, direct *harness.CRIClient
}

// rzCtr is a static pod's container with its cgroups.
type rzCtr struct {
	id, pod string
	info    ctrInfo
	scope   string // /sys/fs/cgroup/kubepods.slice/.../cri-containerd-<id>.scope
	slice   string // its parent, the pod slice
}

// ctr finds pod name's container and checks that it sits where the systemd
// driver puts it.
func (e *rzEnv) ctr(t *testing.T, name string) rzCtr {
	t.Helper()
	p, err := kubeletPod(name)
	if err != nil {
		t.Fatal(err)
	}
	c := rzCtr{id: p.Container(container).ID(), pod: podName(name)}
	c.info = inspect(t, e.proxy, c.id)
	uid := strings.ReplaceAll(p.Metadata.UID, "-", "_")
	wantPath := fmt.Sprintf("kubepods-burstable-pod%s.slice:cri-containerd:%s", uid, c.id)
	if c.info.cgroupsPath != wantPath {
		t.Errorf("cgroupsPath %q, want the systemd driver's %q", c.info.cgroupsPath, wantPath)
	}
	cg := procCgroup(t, c.info.pid)
	want := fmt.Sprintf("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod%s.slice/cri-containerd-%s.scope", uid, c.id)
	if cg != want {
		t.Fatalf("process %d is in cgroup %s, want %s", c.info.pid, cg, want)
	}
	c.scope = filepath.Join(cgroupRoot, cg)
	c.slice = path.Dir(c.scope)
	return c
}

func (c rzCtr) file(t *testing.T, cg, f string) string {
	t.Helper()
	return readFile(t, filepath.Join(cg, f))
}

// same checks that the container was changed in place.
func (e *rzEnv) same(t *testing.T, c rzCtr) {
	t.Helper()
	now := inspect(t, e.proxy, c.id)
	if now.status.State != runtimeapi.ContainerState_CONTAINER_RUNNING || now.pid != c.info.pid || now.status.StartedAt != c.info.status.StartedAt {
		t.Errorf("container %s changed: state %s, pid %d→%d, startedAt %d→%d", c.id[:12], now.status.State,
			c.info.pid, now.pid, c.info.status.StartedAt, now.status.StartedAt)
	}
	p, err := kubeletPod(strings.TrimSuffix(c.pod, "-"+nodeName))
	if err != nil {
		t.Fatal(err)
	}
	if s := p.Container(container); s.ID() != c.id || s.RestartCount != 0 || s.State.Running == nil {
		t.Errorf("kubelet shows container %s restarts %d running %v, want %s unchanged", s.ID(), s.RestartCount, s.State.Running != nil, c.id[:12])
	}
}

func (e *rzEnv) testCPU(t *testing.T) {
	c := e.ctr(t, "rz-cpu")
	// kubelet's pod slice carries the pod's limit, the scope the container's.
	for _, cg := range []string{c.slice, c.scope} {
		if got := c.file(t, cg, "cpu.max"); got != "50000 100000" {
			t.Errorf("%s cpu.max %q, want 50000 100000 (500m)", cg, got)
		}
	}
	t.Logf("scope %s: cpu.max %q cpu.weight %s memory.max %s; slice cpu.max %q cpu.weight %s",
		filepath.Base(c.scope), c.file(t, c.scope, "cpu.max"), c.file(t, c.scope, "cpu.weight"), c.file(t, c.scope, "memory.max"),
		c.file(t, c.slice, "cpu.max"), c.file(t, c.slice, "cpu.weight"))
	slow := cpuBest(t, c.scope, 0.4, 5)
	t.Logf("under a 0.5 CPU limit: %s", slow)
	if slow.cpus < 0.35 || slow.cpus > 0.65 {
		t.Errorf("usage %s under a 0.5 CPU limit: want about 0.5", slow)
	}

	// containerd alone: on v2 the kernel takes a scope cpu.max above its
	// parent's, so the call succeeds, but the pod slice still caps the rate.
	_, err := e.direct.Runtime.UpdateContainerResources(ctx(t), &runtimeapi.UpdateContainerResourcesRequest{ContainerId: c.id,
		Linux: &runtimeapi.LinuxContainerResources{CpuPeriod: 100000, CpuQuota: 150000}})
	t.Logf("containerd alone, 1.5 CPU: err %v; scope cpu.max %q, slice cpu.max %q", err, c.file(t, c.scope, "cpu.max"), c.file(t, c.slice, "cpu.max"))
	if got := c.file(t, c.slice, "cpu.max"); got != "50000 100000" {
		t.Fatalf("containerd changed the pod slice's cpu.max to %q: the premise does not hold", got)
	}
	held := cpuBest(t, c.scope, 2, 3)
	t.Logf("after containerd alone: %s", held)
	if held.cpus > 0.65 {
		t.Errorf("usage %s with the pod slice at 0.5 CPU: want at most about 0.5", held)
	}

	out, err := inplacectl("resize", c.pod, "-n", "default", "-c", container, "--cpu", "1500m", "-o", "json")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	rec := resizeRecord(t, out)
	t.Logf("inplacectl resize --cpu 1500m: %s, repaired %v", rec.Result, rec.Repaired)
	if got := c.file(t, c.scope, "cpu.max"); got != "150000 100000" {
		t.Errorf("scope cpu.max %q after resize, want 150000 100000", got)
	}
	if q := quotaOf(t, c.file(t, c.slice, "cpu.max")); q < 150000 {
		t.Errorf("slice cpu.max %q after resize: below the container's 150000", c.file(t, c.slice, "cpu.max"))
	}
	fast := cpuBest(t, c.scope, 1.0, 10)
	t.Logf("after resize --cpu 1500m: %s", fast)
	if fast.cpus <= 1.0 {
		t.Errorf("usage %s after resize to 1.5 CPU: want more than 1", fast)
	}
	e.same(t, c)

	// systemd's record of the slice holds the resize too: setting any of
	// the slice's properties (kubelet does) makes systemd re-apply all of
	// them, and cpu.max stays.
	sl := filepath.Base(c.slice)
	t.Logf("systemd's record of %s: %v", sl, unitProps(t, sl, "CPUQuotaPerSecUSec", "CPUQuotaPeriodUSec", "MemoryMax"))
	systemctl(t, "set-property", "--runtime", sl, "CPUWeight="+c.file(t, c.slice, "cpu.weight"))
	if q := quotaOf(t, c.file(t, c.slice, "cpu.max")); q < 150000 {
		t.Errorf("slice cpu.max %q after systemd re-applied the slice's properties: the resize was lost", c.file(t, c.slice, "cpu.max"))
	}

	// Lowering: the scope first (the runtime), then the slice (inplaced).
	out, err = inplacectl("resize", c.pod, "-n", "default", "-c", container, "--cpu", "500m", "-o", "json")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	rec = resizeRecord(t, out)
	t.Logf("inplacectl resize --cpu 500m: %s, repaired %v", rec.Result, rec.Repaired)
	for _, cg := range []string{c.slice, c.scope} {
		if got := c.file(t, cg, "cpu.max"); got != "50000 100000" {
			t.Errorf("%s cpu.max %q after lowering, want 50000 100000", cg, got)
		}
	}
	e.same(t, c)
}

func (e *rzEnv) testMemory(t *testing.T) {
	c := e.ctr(t, "rz-mem")
	eventually(t, 2*time.Minute, "the container's shell holds 64 MiB", func() error {
		if cur, _ := strconv.ParseInt(c.file(t, c.scope, "memory.current"), 10, 64); cur < 64*mi {
			return fmt.Errorf("memory.current %d", cur)
		}
		return nil
	})
	usage := c.file(t, c.scope, "memory.current")
	t.Logf("memory.current %s, memory.max %s, slice memory.max %s", usage, c.file(t, c.scope, "memory.max"), c.file(t, c.slice, "memory.max"))
	if got := c.file(t, c.scope, "memory.max"); got != strconv.FormatInt(256*mi, 10) {
		t.Errorf("scope memory.max %s, want %d", got, 256*mi)
	}

	out, err := inplacectl("resize", c.pod, "-n", "default", "-c", container, "--memory", "512Mi", "-o", "json")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	rec := resizeRecord(t, out)
	t.Logf("inplacectl resize --memory 512Mi: %s, repaired %v", rec.Result, rec.Repaired)
	if got := c.file(t, c.scope, "memory.max"); got != strconv.FormatInt(512*mi, 10) {
		t.Errorf("scope memory.max %s, want %d", got, 512*mi)
	}
	if got, _ := strconv.ParseInt(c.file(t, c.slice, "memory.max"), 10, 64); got < 512*mi {
		t.Errorf("slice memory.max %d below the container's %d", got, 512*mi)
	}
	e.same(t, c)
	// The kernel may reclaim a little page cache on the way (seen: 64.04 →
	// 63.73 MiB); a holder that died or restarted would be far below.
	if cur, _ := strconv.ParseInt(c.file(t, c.scope, "memory.current"), 10, 64); cur < 60*mi {
		t.Errorf("after the raise memory.current is %d: the holder lost its 64 MiB", cur)
	}

	out, err = inplacectl("resize", c.pod, "-n", "default", "-c", container, "--memory", "32Mi")
	if err == nil {
		t.Fatalf("lowering to 32Mi below %s bytes in use succeeded: %s", usage, out)
	}
	t.Logf("refused as expected: %v", err)
	if !strings.Contains(err.Error(), "FailedPrecondition") {
		t.Errorf("refusal %v: want FailedPrecondition", err)
	}
	if got := c.file(t, c.scope, "memory.max"); got != strconv.FormatInt(512*mi, 10) {
		t.Errorf("scope memory.max %s after the refusal, want unchanged %d", got, 512*mi)
	}
	e.same(t, c)
}

// testKubeletPath sends UpdateContainerResources to inplaced's socket as
// kubelet's in-place resize does (kubelet raises the pod slice itself before
// it; a static pod's kubelet does not, so this is the case where it did not).
func (e *rzEnv) testKubeletPath(t *testing.T) {
	c := e.ctr(t, "rz-kube")
	update := func(quota, mem int64) error {
		_, err := e.proxy.Runtime.UpdateContainerResources(ctx(t), &runtimeapi.UpdateContainerResourcesRequest{ContainerId: c.id,
			Linux: &runtimeapi.LinuxContainerResources{CpuPeriod: 100000, CpuQuota: quota, CpuShares: 1536, MemoryLimitInBytes: mem}})
		return err
	}
	if err := update(150000, 256*mi); err != nil {
		t.Fatalf("UpdateContainerResources through inplaced: %v", err)
	}
	if got := c.file(t, c.scope, "cpu.max"); got != "150000 100000" {
		t.Errorf("scope cpu.max %q, want 150000 100000", got)
	}
	if q := quotaOf(t, c.file(t, c.slice, "cpu.max")); q < 150000 {
		t.Errorf("slice cpu.max %q below the container's 150000", c.file(t, c.slice, "cpu.max"))
	}
	if got := c.file(t, c.scope, "memory.max"); got != strconv.FormatInt(256*mi, 10) {
		t.Errorf("scope memory.max %s, want %d", got, 256*mi)
	}
	// cpu.weight from 1536 shares: kubelet's linear formula gives 59, the
	// quadratic one of newer runtimes 69; either is the runtime's choice.
	if w := c.file(t, c.scope, "cpu.weight"); w != "59" && w != "69" {
		t.Errorf("scope cpu.weight %s for 1536 shares, want 59 or 69", w)
	}
	t.Logf("after UpdateContainerResources: scope cpu.max %q cpu.weight %s memory.max %s; slice cpu.max %q cpu.weight %s memory.max %s",
		c.file(t, c.scope, "cpu.max"), c.file(t, c.scope, "cpu.weight"), c.file(t, c.scope, "memory.max"),
		c.file(t, c.slice, "cpu.max"), c.file(t, c.slice, "cpu.weight"), c.file(t, c.slice, "memory.max"))
	if r := inspect(t, e.proxy, c.id).status.GetResources().GetLinux(); r != nil && r.CpuQuota != 150000 {
		t.Errorf("containerd reports cpu quota %d, want 150000", r.CpuQuota)
	}

	usage := c.file(t, c.scope, "memory.current")
	err := update(150000, 4096)
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("memory limit of 4096 bytes with %s bytes in use: %v, want FailedPrecondition", usage, err)
	}
	t.Logf("lowering below memory.current (%s) refused: %v", usage, err)
	if got := c.file(t, c.scope, "memory.max"); got != strconv.FormatInt(256*mi, 10) {
		t.Errorf("scope memory.max %s after the refusal, want unchanged %d", got, 256*mi)
	}

	// Unlimited: cpu.max reads "max 100000".
	if err := update(-1, 256*mi); err != nil {
		t.Fatalf("UpdateContainerResources to no CPU limit: %v", err)
	}
	if got := c.file(t, c.scope, "cpu.max"); got != "max 100000" {
		t.Errorf("scope cpu.max %q with no CPU limit, want \"max 100000\"", got)
	}
	if got := c.file(t, c.slice, "cpu.max"); got != "max 100000" {
		t.Errorf("slice cpu.max %q with a container without CPU limit, want \"max 100000\"", got)
	}
	e.same(t, c)
}

// testAPIResize resizes a pod through the API server's resize subresource
// (InPlacePodVerticalScaling, GA): kubelet raises the pod slice and calls
// UpdateContainerResources on its runtime endpoint, inplaced's socket.
func (e *rzEnv) testAPIResize(t *testing.T) {
	cs := kube(t)
	p := waitAPIPod(t, cs, "rz-api", 5*time.Minute, harness.PodRunning(container))
	id := criID(apiContainer(p))
	info := inspect(t, e.proxy, id)
	uid := strings.ReplaceAll(string(p.UID), "-", "_")
	cg := procCgroup(t, info.pid)
	if want := fmt.Sprintf("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod%s.slice/cri-containerd-%s.scope", uid, id); cg != want {
		t.Fatalf("process %d is in cgroup %s, want %s", info.pid, cg, want)
	}
	scope := filepath.Join(cgroupRoot, cg)
	slice := path.Dir(scope)
	for _, c := range []string{slice, scope} {
		if got := readFile(t, filepath.Join(c, "cpu.max")); got != "50000 100000" {
			t.Errorf("%s cpu.max %q, want 50000 100000 (500m)", c, got)
		}
	}
	// The other burner (rz-cpu, 0.5 CPU) is frozen while this one is
	// measured: together they would ask for all of the guest's 2 CPUs.
	other := e.ctr(t, "rz-cpu").scope
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/root/tmp/go", info.pid), nil, 0o644); err != nil {
		t.Fatalf("start the burner: %v", err)
	}
	slow := cpuBest(t, scope, 0.4, 5, other)
	t.Logf("pod %s (API), container %s under a 0.5 CPU limit: %s", p.Name, id[:12], slow)
	if slow.cpus < 0.35 || slow.cpus > 0.65 {
		t.Errorf("usage %s under a 0.5 CPU limit: want about 0.5", slow)
	}

	patch := `{"spec":{"containers":[{"name":"` + container + `","resources":{"requests":{"cpu":"250m","memory":"64Mi"},"limits":{"cpu":"1500m","memory":"128Mi"}}}]}}`
	start := time.Now()
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	_, err := cs.CoreV1().Pods("default").Patch(c, p.Name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}, "resize")
	cancel()
	if err != nil {
		t.Fatalf("patch pods/%s/resize to 1500m: %v", p.Name, err)
	}
	p = waitAPIPod(t, cs, p.Name, 3*time.Minute, func(p *corev1.Pod) error {
		if p == nil {
			return errors.New("pod gone")
		}
		for _, c := range p.Status.Conditions {
			if (c.Type == corev1.PodResizePending || c.Type == corev1.PodResizeInProgress) && c.Status == corev1.ConditionTrue {
				return fmt.Errorf("%s: %s: %s", c.Type, c.Reason, c.Message)
			}
		}
		s := apiContainer(p)
		if s == nil || s.Resources == nil || s.Resources.Limits.Cpu().MilliValue() != 1500 {
			b, _ := json.Marshal(s)
			return fmt.Errorf("container status %s", b)
		}
		if got := readFile(t, filepath.Join(scope, "cpu.max")); got != "150000 100000" {
			return fmt.Errorf("scope cpu.max %q", got)
		}
		return nil
	})
	t.Logf("kubelet resized it in %s: status limits cpu %s; scope cpu.max %q, slice cpu.max %q", time.Since(start).Round(time.Millisecond),
		apiContainer(p).Resources.Limits.Cpu(), readFile(t, filepath.Join(scope, "cpu.max")), readFile(t, filepath.Join(slice, "cpu.max")))
	if q := quotaOf(t, readFile(t, filepath.Join(slice, "cpu.max"))); q < 150000 {
		t.Errorf("slice cpu.max %q after the resize: below the container's 150000", readFile(t, filepath.Join(slice, "cpu.max")))
	}

	// The call went through inplaced: its resize record for the container
	// (no control-API caller: it came in on the CRI socket) and its journal.
	out, err := inplacectl("resizes", "-o", "json")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var list struct {
		Resizes []map[string]any `json:"resizes"`
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatalf("decode inplacectl resizes: %v\n%s", err, out)
	}
	var rec map[string]any
	for _, r := range list.Resizes {
		to, _ := r["to"].(map[string]any)
		if r["container_id"] == id && to != nil && fmt.Sprint(to["cpu_quota"]) == "150000" {
			rec = r
		}
	}
	if rec == nil {
		t.Fatalf("inplaced has no resize record of container %s to cpu quota 150000: kubelet's call did not go through it\n%s", id[:12], out)
	}
	t.Logf("inplaced's record: id %v, result %v, method %v, caller %v, from %v, to %v, in effect %v, repaired %v",
		rec["id"], rec["result"], rec["method"], rec["caller"], rec["from"], rec["to"], rec["in_effect"], rec["repaired"])
	if rec["result"] != "applied" || rec["caller"] != nil {
		t.Errorf("record result %v caller %v: want applied, from the CRI socket (no control-API caller)", rec["result"], rec["caller"])
	}
	jout, _ := exec.Command("journalctl", "-b", "-u", "inplaced", "--no-pager", "-o", "cat").CombinedOutput()
	var logged string
	for _, line := range strings.Split(string(jout), "\n") {
		if strings.Contains(line, fmt.Sprint(rec["id"])) && strings.Contains(line, id) {
			logged = line
		}
	}
	if logged == "" {
		t.Errorf("inplaced's journal has no line for resize %v of container %s", rec["id"], id[:12])
	}
	t.Logf("inplaced's journal: %s", logged)

	fast := cpuBest(t, scope, 1.0, 10, other)
	t.Logf("after the resize to 1.5 CPU: %s", fast)
	if fast.cpus <= 1.0 {
		t.Errorf("usage %s after the resize to 1.5 CPU: want more than 1", fast)
	}
	now := inspect(t, e.proxy, id)
	if now.status.State != runtimeapi.ContainerState_CONTAINER_RUNNING || now.pid != info.pid || now.status.StartedAt != info.status.StartedAt {
		t.Errorf("container %s changed: state %s, pid %d→%d, startedAt %d→%d", id[:12], now.status.State,
			info.pid, now.pid, info.status.StartedAt, now.status.StartedAt)
	}
	p = waitAPIPod(t, cs, p.Name, time.Minute, harness.PodRunning(container))
	if s := apiContainer(p); criID(s) != id || s.RestartCount != 0 {
		t.Errorf("the API shows container %s restarts %d, want %s unchanged", criID(s), s.RestartCount, id[:12])
	}
}

type resizeRec struct {
	ID       string   `json:"id"`
	Result   string   `json:"result"`
	Method   string   `json:"method"`
	Repaired []string `json:"repaired"`
	Error    string   `json:"error"`
}

func resizeRecord(t *testing.T, out string) resizeRec {
	t.Helper()
	i := strings.Index(out, "{")
	var r resizeRec
	if i < 0 || json.Unmarshal([]byte(out[i:]), &r) != nil {
		t.Fatalf("no resize record in %q", out)
	}
	return r
}

func quotaOf(t *testing.T, cpuMax string) int64 {
	t.Helper()
	q, _, _ := strings.Cut(cpuMax, " ")
	if q == "max" {
		return 1 << 62
	}
	n, err := strconv.ParseInt(q, 10, 64)
	if err != nil {
		t.Fatalf("cpu.max %q: %v", cpuMax, err)
	}
	return n
}

// cpuWindow is one measurement of a cgroup's CPU use from cpu.stat, with how
// busy the whole guest was (/proc/stat) over the same window.
type cpuWindow struct{ cpus, throttled, guest float64 }

func (w cpuWindow) String() string {
	return fmt.Sprintf("%.3f CPU, throttled in %.0f%% of periods (guest busy %.2f of 2 CPUs)", w.cpus, 100*w.throttled, w.guest)
}

func cpuStat(t *testing.T, cg string) map[string]float64 {
	t.Helper()
	m := map[string]float64{}
	for _, line := range strings.Split(readFile(t, filepath.Join(cg, "cpu.stat")), "\n") {
		k, v, _ := strings.Cut(line, " ")
		m[k], _ = strconv.ParseFloat(v, 64)
	}
	return m
}

// guestBusy is the CPU time (s) the guest spent not idle (/proc/stat, USER_HZ 100).
func guestBusy(t *testing.T) float64 {
	t.Helper()
	line, _, _ := strings.Cut(readFile(t, "/proc/stat"), "\n")
	var total, idle float64
	for i, f := range strings.Fields(line)[1:] {
		v, _ := strconv.ParseFloat(f, 64)
		if i < 8 {
			total += v
		}
		if i == 3 || i == 4 {
			idle += v
		}
	}
	return (total - idle) / 100
}

func cpuRate(t *testing.T, cg string, window time.Duration) cpuWindow {
	t.Helper()
	s0, b0, t0 := cpuStat(t, cg), guestBusy(t), time.Now()
	time.Sleep(window)
	s1, b1, t1 := cpuStat(t, cg), guestBusy(t), time.Now()
	secs := t1.Sub(t0).Seconds()
	w := cpuWindow{cpus: (s1["usage_usec"] - s0["usage_usec"]) / 1e6 / secs, guest: (b1 - b0) / secs}
	if p := s1["nr_periods"] - s0["nr_periods"]; p > 0 {
		w.throttled = (s1["nr_throttled"] - s0["nr_throttled"]) / p
	}
	return w
}

// quiet freezes kubelet (the cgroup v2 freezer of kubelet.service), and the
// cgroups also, while f runs: under TCG kubelet's housekeeping takes a good
// part of the guest's two CPUs, and in the guest's CPU shares system.slice
// outweighs a burstable pod by far, so a measurement of what a pod may use
// waits until it is still. Pods keep running; kubelet resumes where it was.
func quiet(t *testing.T, f func(), also ...string) {
	t.Helper()
	for _, cg := range append([]string{"/sys/fs/cgroup/system.slice/kubelet.service"}, also...) {
		if err := os.WriteFile(cg+"/cgroup.freeze", []byte("1"), 0); err != nil {
			t.Fatalf("freeze %s: %v", cg, err)
		}
		defer func() {
			if err := os.WriteFile(cg+"/cgroup.freeze", []byte("0"), 0); err != nil {
				t.Errorf("thaw %s: %v", cg, err)
			}
		}()
		eventually(t, 30*time.Second, cg+" frozen", func() error {
			if !strings.Contains(readFile(t, cg+"/cgroup.events"), "frozen 1") {
				return errNotYet
			}
			return nil
		})
	}
	f()
}

// cpuBest measures up to n 3 s windows, kubelet (and the cgroups also)
// frozen, and returns the busiest, stopping once one exceeds enough: other
// work in the guest (and on the host, which runs the guest's CPUs) can only
// take CPU away.
func cpuBest(t *testing.T, cg string, enough float64, n int, also ...string) (best cpuWindow) {
	t.Helper()
	quiet(t, func() { best = cpuBestNow(t, cg, enough, n) }, also...)
	return best
}

func cpuBestNow(t *testing.T, cg string, enough float64, n int) cpuWindow {
	t.Helper()
	var best cpuWindow
	for i := range n {
		w := cpuRate(t, cg, 3*time.Second)
		t.Logf("  window %d: %s", i+1, w)
		if w.cpus > best.cpus {
			best = w
		}
		if best.cpus > enough {
			break
		}
	}
	return best
}
