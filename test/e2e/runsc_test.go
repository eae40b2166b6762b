package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/test/harness"
)

// requireRunsc skips (or fails under CI=true) unless gVisor can run here:
// containerd 2.4 (among INPLACED_BACKENDS) and gVisor's binaries.
func requireRunsc(t *testing.T) {
	t.Helper()
	harness.RequireRoot(t)
	if !slices.Contains(harness.BackendsFromEnv(), harness.Containerd2) {
		t.Skipf("gVisor runs on %s only, and INPLACED_BACKENDS leaves it out", harness.Containerd2)
	}
	harness.Require(t, string(harness.Containerd2), harness.Containerd2.Available(),
		"containerd 2.4 not found; run hack/install-deps.sh")
	harness.Require(t, "gVisor", harness.RunscAvailable(),
		"runsc and containerd-shim-runsc-v1 not found in "+harness.GVisorBinDir()+"; run hack/install-deps.sh")
}

// runscBackend starts a containerd 2.4 with handler runsc (gVisor): the
// sandboxed-runtime tests need no other backend.
func runscBackend(t *testing.T) *harness.Containerd {
	t.Helper()
	requireRunsc(t)
	c := harness.StartContainerd(t, harness.Containerd2, harness.StartRegistry(t))
	c.RequireRunsc(t)
	return c
}

// sentry is gVisor's sandbox process (the "sentry", runsc-sandbox) of a pod
// sandbox.
func sentry(t *testing.T, sandboxID string) int {
	t.Helper()
	found := harness.RunscSentries(sandboxID)
	if len(found) != 1 {
		t.Fatalf("runsc-sandbox processes of sandbox %s: %v, want exactly one", sandboxID[:13], found)
	}
	return found[0]
}

// TestRunscSwap: a pod on gVisor swapped in place by inplacectl (image and
// env). The sentry keeps its PID, the pod its netns and IP; the new process
// runs v2 with the new env, inside gVisor; the record names the handler and
// says the sandbox was kept.
func TestRunscSwap(t *testing.T) {
	c := runscBackend(t)
	e := newEnv(t, c)
	p := runPod(t, e.cri, "gv-swap", e.imgs.App1, podOpts{handler: harness.RuntimeHandlerRunsc, env: map[string]string{"MODE": "one"}})
	sb, sbInfo := sandboxInfo(t, e.cri, p.sandboxID)
	if sb.GetRuntimeHandler() != harness.RuntimeHandlerRunsc {
		t.Fatalf("sandbox runs on handler %q, want runsc", sb.GetRuntimeHandler())
	}
	ip := sb.GetNetwork().GetIp()
	pid := sentry(t, p.sandboxID)
	ns := netns(t, pid)
	t.Logf("sentry pid %d (containerd's sandbox pid %d), netns %s, ip %s", pid, sbInfo.Pid, ns, ip)
	if r, err := e.cri.Runtime.ExecSync(ctx(t), &runtimeapi.ExecSyncRequest{ContainerId: p.containerID, Cmd: []string{"dmesg"}, Timeout: 10}); err != nil || !strings.Contains(string(r.Stdout), "gVisor") {
		t.Fatalf("dmesg in the container does not show gVisor: %v %q", err, r.GetStdout())
	}
	eventually(t, 20*time.Second, "v1 serving", func() error {
		_, err := httpGet("http://" + ip + ":8080/version")
		return err
	})

	out, err := e.px.Ctl("swap", p.name, "-n", p.ns, "-c", "app", "--image", e.imgs.App2, "--env", "MODE=two", "-o", "json")
	if err != nil {
		t.Fatalf("swap: %v\n%s\ninplaced log:\n%s", err, out, e.px.LogTail(40))
	}
	rec := lastJSONObject(t, out)
	if rec.State != "SWAP_STATE_COMMITTED" {
		t.Fatalf("swap ended %s: %s", rec.State, rec.Error)
	}
	if rec.RuntimeHandler != harness.RuntimeHandlerRunsc || !rec.SandboxKept {
		t.Errorf("record: runtime_handler %q sandbox_kept %v, want runsc and true", rec.RuntimeHandler, rec.SandboxKept)
	}
	if rec.Hold.Mode != "off" || !strings.Contains(rec.Hold.Why, "own network stack") {
		t.Errorf("connection hold %+v: want off, with gVisor's own network stack as the reason", rec.Hold)
	}
	if got := sentry(t, p.sandboxID); got != pid {
		t.Errorf("sentry pid %d → %d: the sandbox was rebuilt", pid, got)
	}
	if got := netns(t, pid); got != ns {
		t.Errorf("sentry netns %s → %s", ns, got)
	}
	sb2, _ := sandboxInfo(t, e.cri, p.sandboxID)
	if sb2.GetNetwork().GetIp() != ip || sb2.GetState() != runtimeapi.PodSandboxState_SANDBOX_READY {
		t.Errorf("sandbox after swap: %s ip %s, want READY ip %s", sb2.GetState(), sb2.GetNetwork().GetIp(), ip)
	}
	if v, err := httpGet("http://" + ip + ":8080/version"); err != nil || v != "v2" {
		t.Errorf("/version after swap: %q %v, want v2", v, err)
	}
	running := p.running(t, e.cri)
	if len(running) != 1 || running[0].Id != rec.NewContainerID {
		t.Fatalf("running app containers %v, want only %s", running, rec.NewContainerID)
	}
	r, err := e.cri.Runtime.ExecSync(ctx(t), &runtimeapi.ExecSyncRequest{ContainerId: rec.NewContainerID,
		Cmd: []string{"sh", "-c", "echo $MODE; cat /VERSION; dmesg | head -1"}, Timeout: 10})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Fields(string(r.Stdout)); len(got) < 2 || got[0] != "two" || got[1] != "v2" || !strings.Contains(string(r.Stdout), "gVisor") {
		t.Errorf("new container: %q, want MODE=two, v2, inside gVisor", r.Stdout)
	}
}

// resizeRecord is the part of a ResizeRecord (inplacectl -o json) the
// sandboxed-runtime tests read.
type resizeRecord struct {
	Result       string `json:"result"`
	Method       string `json:"method"`
	Error        string `json:"error"`
	RuntimeClass string `json:"runtime_class"`
	Enforced     string `json:"enforced"`
	EnforcedBy   string `json:"enforced_by"`
	Verified     string `json:"verified"`
	InEffect     struct {
		MemoryLimitBytes string `json:"memory_limit_bytes"`
		CPUQuota         string `json:"cpu_quota"`
	} `json:"in_effect"`
	Requested struct {
		MemoryLimitBytes string `json:"memory_limit_bytes"`
	} `json:"requested"`
}

// allocIn makes a process inside the container hold a string of n bytes
// (busybox awk: in-process, where a shell pipe through gVisor takes a
// minute for 32 MiB on a loaded machine) and returns its exit code (137
// when it was OOM-killed) and output.
func allocIn(t *testing.T, cri *harness.CRIClient, id string, n int64) (int32, string) {
	t.Helper()
	prog := fmt.Sprintf(`BEGIN { x = sprintf("%%%ds", ""); print "held", length(x) }`, n)
	r, err := cri.Runtime.ExecSync(ctx(t), &runtimeapi.ExecSyncRequest{ContainerId: id, Cmd: []string{"awk", prog}, Timeout: 60})
	if err != nil {
		t.Fatalf("exec alloc %d: %v", n, err)
	}
	return r.ExitCode, strings.TrimSpace(string(r.Stdout) + string(r.Stderr))
}

// TestRunscResize: inplacectl resize of a gVisor container sets the limit
// where gVisor can be governed, the pod cgroup that holds the sentry, and
// says so; a process in the sandbox that allocates past it is OOM-killed,
// one below it is not; a limit for one of two containers in the sandbox is
// refused and nothing changes.
func TestRunscResize(t *testing.T) {
	c := runscBackend(t)
	e := newEnv(t, c)
	p := runPod(t, e.cri, "gv-rz", e.imgs.App1, podOpts{handler: harness.RuntimeHandlerRunsc})
	podCg := harness.CgroupParent(p.name)
	sentryPID := sentry(t, p.sandboxID)
	usage, err := strconv.ParseInt(readCgroup(t, "memory", podCg, "memory.usage_in_bytes"), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	// Room for the sentry and a shell, and a limit far below the machine's.
	limitMi := usage>>20 + 160
	limit := limitMi << 20
	t.Logf("sandbox uses %d MiB before the resize; resizing to %d MiB", usage>>20, limitMi)

	out, err := e.px.Ctl("resize", p.name, "-n", p.ns, "-c", "app", "--memory", fmt.Sprintf("%dMi", limitMi), "--cpu", "700m", "-o", "json")
	if err != nil {
		t.Fatalf("resize: %v\n%s\n%s", err, out, e.px.LogTail(30))
	}
	var rec resizeRecord
	if err := json.Unmarshal([]byte(out), &rec); err != nil {
		t.Fatalf("decode record: %v\n%s", err, out)
	}
	t.Logf("record: %+v", rec)
	if rec.Result != "applied" || rec.Method != "sandbox" || rec.RuntimeClass != "sandbox-cgroup" ||
		rec.Enforced != "on the host, for the whole sandbox" || !strings.Contains(rec.EnforcedBy, "pod cgroup "+podCg) ||
		rec.Verified != "read back from the cgroup files" {
		t.Errorf("record does not say the sandbox-level limit: %+v", rec)
	}
	got := readCgroup(t, "memory", podCg, "memory.limit_in_bytes")
	if got != strconv.FormatInt(limit, 10) || rec.InEffect.MemoryLimitBytes != got {
		t.Errorf("pod cgroup memory.limit_in_bytes %s, record in effect %s; want both %d", got, rec.InEffect.MemoryLimitBytes, limit)
	}
	if q := readCgroup(t, "cpu", podCg, "cpu.cfs_quota_us"); q != "70000" || rec.InEffect.CPUQuota != q {
		t.Errorf("pod cgroup cpu.cfs_quota_us %s, record %s; want 70000", q, rec.InEffect.CPUQuota)
	}
	// The container's own host cgroup, if runsc made one, holds no process:
	// inplaced writes nothing there.
	if _, err := os.Stat(cgroupFile("memory", podCg+"/"+p.containerID, "memory.limit_in_bytes")); err == nil {
		if l := readCgroup(t, "memory", podCg+"/"+p.containerID, "memory.limit_in_bytes"); l == strconv.FormatInt(limit, 10) {
			t.Errorf("the container's empty host cgroup was given the limit %s", l)
		}
	}
	hist, err := e.px.Ctl("resizes")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"runtime handler runsc (sandbox-cgroup): enforced on the host, for the whole sandbox, by pod cgroup " + podCg,
		"verified: read back from the cgroup files", "in effect (whole sandbox): cpu quota 70000/100000, shares ", fmt.Sprintf("memory %d\n", limit)} {
		if !strings.Contains(hist, s) {
			t.Errorf("inplacectl resizes lacks %q:\n%s", s, hist)
		}
	}

	// Below the sandbox's limit: the process keeps its memory.
	if code, out := allocIn(t, e.cri, p.containerID, 32<<20); code != 0 || out != fmt.Sprintf("held %d", 32<<20) {
		t.Errorf("32 MiB under a %d MiB sandbox: exit %d %q, want it held", limitMi, code, out)
	}

	// A second container in the sandbox: a limit for one of them would be
	// enforced by nothing, so it is refused and nothing changes.
	side := harness.ContainerConfig("side", e.imgs.App1) // pulled already; busybox applets in /bin
	side.Command = []string{"sleep", "3600"}
	side.Labels = map[string]string{"io.kubernetes.pod.name": p.name, "io.kubernetes.pod.namespace": p.ns, "io.kubernetes.container.name": "side"}
	cr, err := e.cri.Runtime.CreateContainer(ctx(t), &runtimeapi.CreateContainerRequest{PodSandboxId: p.sandboxID, Config: side, SandboxConfig: p.sandboxConfig})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.cri.Runtime.StartContainer(ctx(t), &runtimeapi.StartContainerRequest{ContainerId: cr.ContainerId}); err != nil {
		t.Fatal(err)
	}
	out, err = e.px.Ctl("resize", p.name, "-n", p.ns, "-c", "app", "--memory", fmt.Sprintf("%dMi", limitMi+64))
	if err == nil {
		t.Fatalf("a per-container limit beside another container was applied:\n%s", out)
	}
	t.Logf("refused: %v", err)
	for _, s := range []string{"FailedPrecondition", "only for the whole sandbox", "(side)", "nothing was changed", "--subresource resize", "in a pod of its own"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("refusal lacks %q: %v", s, err)
		}
	}
	if got := readCgroup(t, "memory", podCg, "memory.limit_in_bytes"); got != strconv.FormatInt(limit, 10) {
		t.Errorf("pod cgroup memory.limit_in_bytes %s after the refusal, want %d", got, limit)
	}
	_, _ = e.cri.Runtime.StopContainer(ctx(t), &runtimeapi.StopContainerRequest{ContainerId: cr.ContainerId, Timeout: 1})
	_, _ = e.cri.Runtime.RemoveContainer(ctx(t), &runtimeapi.RemoveContainerRequest{ContainerId: cr.ContainerId})

	// Past the sandbox's limit: the process is OOM-killed.
	failBefore := readCgroup(t, "memory", podCg, "memory.failcnt")
	code, out := allocIn(t, e.cri, p.containerID, limit)
	t.Logf("allocating %d MiB under a %d MiB sandbox: exit %d %q; pod memory.failcnt %s → %s, max_usage %s",
		limitMi, limitMi, code, out, failBefore, readCgroup(t, "memory", podCg, "memory.failcnt"), readCgroup(t, "memory", podCg, "memory.max_usage_in_bytes"))
	if code != 137 {
		t.Errorf("allocating past the sandbox limit: exit %d %q, want 137 (OOM-killed)", code, out)
	}
	// The process was killed, not the sandbox: the sentry and the app run on.
	if got := sentry(t, p.sandboxID); got != sentryPID {
		t.Errorf("sentry pid %d → %d after the OOM kill", sentryPID, got)
	}
	if st, _ := containerInfo(t, e.cri, p.containerID); st.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Errorf("app container %s after the OOM kill of a process in it", st.State)
	}
}
