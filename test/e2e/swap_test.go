package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/test/harness"
)

// swapRecord is the part of `inplacectl -o json` output the tests read.
type swapRecord struct {
	ID                 string `json:"id"`
	State              string `json:"state"`
	Error              string `json:"error"`
	OldContainerID     string `json:"old_container_id"`
	NewContainerID     string `json:"new_container_id"`
	RunningContainerID string `json:"running_container_id"`
	DowntimeNs         string `json:"downtime_ns"`
	ExitCode           int    `json:"exit_code"`
	RuntimeHandler     string `json:"runtime_handler"`
	SandboxKept        bool   `json:"sandbox_kept"`
	Hold               struct {
		Mode string `json:"mode"`
		Why  string `json:"why"`
	} `json:"hold"`
	Caller struct {
		UID string `json:"uid"`
		PID string `json:"pid"`
	} `json:"caller"`
	Steps []struct {
		Name string `json:"name"`
	} `json:"steps"`
}

func lastJSONObject(t *testing.T, out string) swapRecord { return decodeRecord[swapRecord](t, out) }

// decodeRecord decodes the JSON record that inplacectl -o json printed
// after its progress lines into R (the fields a test reads of it).
func decodeRecord[R any](t *testing.T, out string) R {
	t.Helper()
	i := strings.Index(out, "{")
	if i < 0 {
		t.Fatalf("no JSON record in output:\n%s", out)
	}
	var r R
	if err := json.Unmarshal([]byte(out[i:]), &r); err != nil {
		t.Fatalf("decode record: %v\n%s", err, out)
	}
	return r
}

func swaps(t *testing.T, e *env) []swapRecord {
	t.Helper()
	out, err := e.px.Ctl("swaps", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var l struct {
		Swaps []swapRecord `json:"swaps"`
	}
	if err := json.Unmarshal([]byte(out), &l); err != nil {
		t.Fatalf("decode swaps: %v\n%s", err, out)
	}
	return l.Swaps
}

func httpGet(url string) (string, error) {
	c := &http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return strings.TrimSpace(string(b)), err
}

// TestSwap proves a swap v1 → v2 keeps the sandbox, IP, netns and volume,
// runs v2's binary with the new env, and runs preStop/postStart in order.
func TestSwap(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c *harness.Containerd) {
		e := newEnv(t, c)
		// The marker's content says which image ran the hook; its mtime (set by
		// the host filesystem, in ns) says when.
		preStop := `{"exec":{"command":["sh","-c","cat /VERSION > /data/prestop"]}}`
		p := runPod(t, e.cri, "swap-main", e.imgs.App1, podOpts{preStop: preStop, env: map[string]string{"KEEP": "1", "DROP": "x"}})
		oldStatus, oldInfo := containerInfo(t, e.cri, p.containerID)
		sbStatus, sbInfo := sandboxInfo(t, e.cri, p.sandboxID)
		ip := sbStatus.GetNetwork().GetIp()
		oldNetns := netns(t, sbInfo.Pid)
		if got := netns(t, oldInfo.Pid); got != oldNetns {
			t.Fatalf("old container netns %s, sandbox %s", got, oldNetns)
		}
		// v1 writes a file into the shared host directory.
		if _, err := e.cri.Runtime.ExecSync(ctx(t), &runtimeapi.ExecSyncRequest{ContainerId: p.containerID,
			Cmd: []string{"sh", "-c", "echo written-by-v1 > /data/state"}, Timeout: 10}); err != nil {
			t.Fatal(err)
		}
		if v, err := httpGet("http://" + ip + ":8080/version"); err != nil || v != "v1" {
			t.Fatalf("v1 /version: %q %v", v, err)
		}

		out, err := e.px.Ctl("swap", p.name, "-n", p.ns, "-c", "app", "--image", e.imgs.App2,
			"--env", "NEW_VAR=hello", "--unset-env", "DROP",
			"--post-start-exec", "sh", "--post-start-exec", "-c", "--post-start-exec", "cat /VERSION > /data/poststart")
		if err != nil {
			t.Fatalf("swap: %v\n%s\ninplaced log:\n%s", err, out, e.px.LogTail(40))
		}
		t.Logf("inplacectl swap:\n%s", out)
		for _, step := range []string{"pull", "pre-stop", "stop-old", "create-new", "start-new", "post-start", "health-gate", "commit", "downtime:"} {
			if !strings.Contains(out, step) {
				t.Errorf("inplacectl output lacks step %q", step)
			}
		}

		running := p.running(t, e.cri)
		if len(running) != 1 {
			t.Fatalf("%d running app containers after swap, want 1", len(running))
		}
		newID := running[0].Id
		if newID == p.containerID {
			t.Fatal("the old container still runs")
		}
		newStatus, newInfo := containerInfo(t, e.cri, newID)
		// Same sandbox, IP and network namespace.
		if running[0].PodSandboxId != p.sandboxID {
			t.Fatalf("new container in sandbox %s, want %s", running[0].PodSandboxId, p.sandboxID)
		}
		sb2, _ := sandboxInfo(t, e.cri, p.sandboxID)
		if sb2.GetNetwork().GetIp() != ip {
			t.Fatalf("pod IP %s → %s", ip, sb2.GetNetwork().GetIp())
		}
		if got := netns(t, newInfo.Pid); got != oldNetns {
			t.Fatalf("new container netns %s, want the sandbox's %s", got, oldNetns)
		}
		// The volume kept v1's file.
		if b, err := os.ReadFile(filepath.Join(p.hostDir, "state")); err != nil || strings.TrimSpace(string(b)) != "written-by-v1" {
			t.Fatalf("file written by v1: %q %v", b, err)
		}
		if r, err := e.cri.Runtime.ExecSync(ctx(t), &runtimeapi.ExecSyncRequest{ContainerId: newID, Cmd: []string{"cat", "/data/state"}, Timeout: 10}); err != nil || strings.TrimSpace(string(r.Stdout)) != "written-by-v1" {
			t.Fatalf("v2 reading v1's file: %v %q", err, r.GetStdout())
		}
		// The process is v2's binary: it answers v2 on the same IP.
		eventually(t, 10*time.Second, "v2 answering on the pod IP", func() error {
			v, err := httpGet("http://" + ip + ":8080/version")
			if err != nil || v != "v2" {
				return fmt.Errorf("/version: %q %v", v, err)
			}
			return nil
		})
		// Env change in the new process.
		environ, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(newInfo.Pid), "environ"))
		if err != nil {
			t.Fatal(err)
		}
		vars := strings.Split(string(environ), "\x00")
		if !contains(vars, "NEW_VAR=hello") || !contains(vars, "KEEP=1") || containsPrefix(vars, "DROP=") {
			t.Fatalf("new process env %q: want NEW_VAR=hello and KEEP=1, no DROP", vars)
		}
		// Old container exited; attempt + 1; labels and hash kept.
		old, _ := containerInfo(t, e.cri, p.containerID)
		if old.State != runtimeapi.ContainerState_CONTAINER_EXITED {
			t.Fatalf("old container is %s", old.State)
		}
		if newStatus.Metadata.Attempt != oldStatus.Metadata.Attempt+1 {
			t.Fatalf("attempt %d → %d", oldStatus.Metadata.Attempt, newStatus.Metadata.Attempt)
		}
		if newStatus.Annotations["io.kubernetes.container.hash"] != oldStatus.Annotations["io.kubernetes.container.hash"] ||
			newStatus.Annotations["io.kubernetes.container.restartCount"] != "1" ||
			newStatus.Labels["io.kubernetes.pod.uid"] != p.uid {
			t.Fatalf("labels/annotations not kept: %v %v", newStatus.Labels, newStatus.Annotations)
		}
		if !strings.HasSuffix(newStatus.LogPath, "app/1.log") {
			t.Fatalf("log path %q, want .../app/1.log", newStatus.LogPath)
		}
		// preStop ran in v1 before it stopped; postStart in v2 after it started.
		preV, preT := marker(t, filepath.Join(p.hostDir, "prestop"))
		postV, postT := marker(t, filepath.Join(p.hostDir, "poststart"))
		if preV != "v1" || postV != "v2" {
			t.Fatalf("hook markers ran in %q (preStop) and %q (postStart), want v1 and v2", preV, postV)
		}
		if !(preT <= old.FinishedAt && newStatus.StartedAt <= postT) {
			t.Fatalf("hook order wrong: preStop %d, old finished %d, new started %d, postStart %d", preT, old.FinishedAt, newStatus.StartedAt, postT)
		}
		// The history records it.
		hist := swaps(t, e)
		if len(hist) != 1 || hist[0].State != "SWAP_STATE_COMMITTED" || hist[0].RunningContainerID != newID || hist[0].DowntimeNs == "" || hist[0].Caller.UID != "0" {
			t.Fatalf("swap history: %+v", hist)
		}
	})
}

func marker(t *testing.T, path string) (string, int64) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("hook marker: %v", err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b)), fi.ModTime().UnixNano()
}

func contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

func containsPrefix(l []string, p string) bool {
	for _, x := range l {
		if strings.HasPrefix(x, p) {
			return true
		}
	}
	return false
}

// TestSwapFailures: a bad image fails at pull with the old container
// untouched; a crashing image fails the health gate and rolls back; a mount
// or privileged change is refused and nothing changes.
func TestSwapFailures(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c *harness.Containerd) {
		e := newEnv(t, c)
		p := runPod(t, e.cri, "swap-fail", e.imgs.App1, podOpts{})
		before, _ := containerInfo(t, e.cri, p.containerID)

		t.Run("nonexistent image", func(t *testing.T) {
			out, err := e.px.Ctl("swap", p.name, "-c", "app", "--image", c.Registry.Ref("does-not-exist:v9"), "-o", "json")
			if err == nil {
				t.Fatalf("swap to a missing image succeeded:\n%s", out)
			}
			r := lastJSONObject(t, out)
			if r.State != "SWAP_STATE_FAILED" || !strings.Contains(r.Error, "pull") {
				t.Fatalf("record: %+v", r)
			}
			for _, s := range r.Steps {
				if s.Name == "stop-old" {
					t.Fatal("the old container was stopped for a failed pull")
				}
			}
			now, _ := containerInfo(t, e.cri, p.containerID)
			if now.State != runtimeapi.ContainerState_CONTAINER_RUNNING || now.StartedAt != before.StartedAt {
				t.Fatalf("old container touched: %s started %d (was %d)", now.State, now.StartedAt, before.StartedAt)
			}
		})

		t.Run("refused changes", func(t *testing.T) {
			for _, args := range [][]string{
				{"--mount", "/etc:/host-etc"},
				{"--privileged"},
				{"--device", "/dev/kvm:/dev/kvm"},
				{},
			} {
				full := append([]string{"swap", p.name, "-c", "app"}, args...)
				out, err := e.px.Ctl(full...)
				if err == nil || !strings.Contains(err.Error(), "InvalidArgument") {
					t.Fatalf("%v: want InvalidArgument, got %v\n%s", args, err, out)
				}
				if len(args) > 0 && !strings.Contains(err.Error(), "recreated") {
					t.Fatalf("%v: error does not say the pod must be recreated: %v", args, err)
				}
			}
			now, _ := containerInfo(t, e.cri, p.containerID)
			if now.State != runtimeapi.ContainerState_CONTAINER_RUNNING || now.StartedAt != before.StartedAt || len(p.containers(t, e.cri)) != 1 {
				t.Fatal("a refused request changed something")
			}
		})

		t.Run("crashing image rolls back", func(t *testing.T) {
			out, err := e.px.Ctl("swap", p.name, "-c", "app", "--image", e.imgs.Crash, "--min-runtime", "2s", "-o", "json")
			if err == nil {
				t.Fatalf("swap to a crashing image committed:\n%s", out)
			}
			r := lastJSONObject(t, out)
			if r.State != "SWAP_STATE_FAILED" || r.ExitCode != harness.CrashExitCode || !strings.Contains(r.Error, "rolled back") {
				t.Fatalf("record: %+v", r)
			}
			running := p.running(t, e.cri)
			if len(running) != 1 || running[0].Id != r.RunningContainerID {
				t.Fatalf("after rollback: %d running, record says %s", len(running), r.RunningContainerID)
			}
			st, in := containerInfo(t, e.cri, running[0].Id)
			if st.Image.GetImage() == "" || st.Metadata.Attempt != before.Metadata.Attempt+2 {
				t.Fatalf("rollback container attempt %d, want %d", st.Metadata.Attempt, before.Metadata.Attempt+2)
			}
			root, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(in.Pid), "root", "VERSION"))
			if err != nil || strings.TrimSpace(string(root)) != "v1" {
				t.Fatalf("rollback runs %q (%v), want v1", root, err)
			}
			for _, ctr := range p.containers(t, e.cri) {
				if ctr.Id == r.NewContainerID {
					t.Fatal("the failed new container was left behind: kubelet would chase it")
				}
			}
		})
	})
}
