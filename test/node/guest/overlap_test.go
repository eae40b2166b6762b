package guest

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/inplaced/inplaced/test/harness"
)

// overlapSwapRecord is what TestOverlapRestart reads of a swap record
// (inplacectl -o json).
type overlapSwapRecord struct {
	State              string `json:"state"`
	Error              string `json:"error"`
	Strategy           string `json:"strategy"`
	StrategyWhy        string `json:"strategy_why"`
	RunningContainerID string `json:"running_container_id"`
	Takeover           *struct {
		Ports      []uint32 `json:"ports"`
		HandedOver []uint32 `json:"handed_over"`
		FellBack   bool     `json:"fell_back"`
	} `json:"takeover"`
}

// TestOverlapRestart: a container swapped with overlap keeps its bind trap
// for life, and the notify fd inplaced's takeover agent serves is kept in
// systemd's fd store (the unit's FileDescriptorStoreMax=). After a kill -9
// of inplaced a bind() in the container waits, with no inplaced running,
// until systemd has restarted it (Restart=always) and passed the stored fd
// back; then the bind is answered, later binds work and so does crictl
// exec. The same is measured across `systemctl restart inplaced`. The host
// e2e (TestOverlapAgentRestart) shows this with a stand-in for the store;
// only the guest has systemd's.
func TestOverlapRestart(t *testing.T) {
	// Registered before the pod: runs after its manifest is removed.
	t.Cleanup(func() { waitStoreEmpty(t) })
	writePods(t, pod{name: "ovr", image: imgApp1, readinessHTTP: 8080, cpuLim: "500m", annotations: emulatedHoldMax})
	p := waitPod(t, "ovr", 5*time.Minute, harness.Running(container))
	url := func(port int, path string) string {
		return fmt.Sprintf("http://%s/%s", net.JoinHostPort(p.Status.PodIP, strconv.Itoa(port)), path)
	}
	out, err := inplacectl("swap", podName("ovr"), "-n", "default", "-c", container, "--image", imgApp2,
		"--strategy", "overlap", "--min-runtime", "2s", "-o", "json")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	rec := decodeLast[overlapSwapRecord](t, out)
	t.Logf("swap %s, strategy %s (%s), takeover %+v", rec.State, rec.Strategy, rec.StrategyWhy, rec.Takeover)
	if rec.State != "SWAP_STATE_COMMITTED" || rec.Strategy != "overlap" || rec.Takeover == nil || rec.Takeover.FellBack ||
		fmt.Sprint(rec.Takeover.HandedOver) != "[8080]" {
		t.Fatalf("swap %s %s, strategy %s (%s): want committed with overlap, 8080 handed over", rec.State, rec.Error, rec.Strategy, rec.StrategyWhy)
	}
	id := rec.RunningContainerID
	waitPod(t, "ovr", 2*time.Minute, func(kp *harness.KubePod) error {
		if c := kp.Container(container); c == nil || c.ID() != id || !c.Ready {
			return fmt.Errorf("kubelet does not show container %s ready yet", id)
		}
		return nil
	})
	app := inspect(t, harness.DialCRI(t, proxySocket), id).pid
	if n := storeCount(t, "after the swap"); n == 0 {
		t.Fatal("systemd's fd store is empty after an overlap swap: want the new container's notify fd")
	}
	mustBind(t, url(8080, "listen?port=9091"), "with inplaced serving")

	t.Run("kill -9", func(t *testing.T) {
		bound := killWhileBinding(t, app, url(8080, "listen?port=9092"))
		active := time.Now()
		select {
		case got := <-bound:
			if !strings.Contains(got, "listening") {
				t.Fatalf("the waiting bind after the restart: %s", got)
			}
			t.Logf("the waiting bind answered %s after inplaced was seen active again: %s", time.Since(active).Round(time.Millisecond), got)
		case <-time.After(time.Minute):
			t.Fatal("the waiting bind was not answered within a minute of the restart")
		}
		if v, err := get(url(9092, "version"), 30*time.Second); err != nil || v != "v2" {
			t.Errorf("port 9092, bound while inplaced was down: %q %v", v, err)
		}
		mustBind(t, url(8080, "listen?port=9093"), "after the restart")
		crictlExec(t, id)
		storeCount(t, "after the exec")
	})

	t.Run("systemctl restart", func(t *testing.T) {
		before := unitProps(t, "inplaced", "MainPID")
		systemctl(t, "restart", "inplaced")
		if a := unitProps(t, "inplaced", "MainPID", "ActiveState"); a["ActiveState"] != "active" || a["MainPID"] == before["MainPID"] {
			t.Fatalf("inplaced after systemctl restart: %v, main PID was %s", a, before["MainPID"])
		}
		n := storeCount(t, "after systemctl restart")
		got, err := get(url(8080, "listen?port=9094"), time.Minute)
		t.Logf("a bind after systemctl restart, with %d fds in the store: %q %v", n, got, err)
		// systemd keeps a unit's store while a job for it is queued, and a
		// restart is one job (stop, then start): the store outlives it.
		if n == 0 || err != nil || !strings.Contains(got, "listening") {
			t.Errorf("after systemctl restart: %d fds stored, bind %q %v: want the store kept and the bind answered", n, got, err)
		}
		crictlExec(t, id)
	})
}

// killWhileBinding kills inplaced's main process with SIGKILL and asks the
// app (pid, in the swapped container) for a bind at url meanwhile. It
// returns once systemd has started a new inplaced, after seeing the app's
// bind() wait while none ran; the bind's answer comes on the channel.
func killWhileBinding(t *testing.T, pid int, url string) <-chan string {
	t.Helper()
	old := unitProps(t, "inplaced", "MainPID")["MainPID"]
	main, err := strconv.Atoi(old)
	if err != nil || main == 0 {
		t.Fatalf("inplaced's main PID %q: %v", old, err)
	}
	killed := time.Now()
	if err := syscall.Kill(main, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	bound := make(chan string, 1)
	go func() {
		got, err := get(url, 3*time.Minute)
		bound <- fmt.Sprintf("%s %v", got, err)
	}()
	// The proof that the bind waits on systemd's copy of the notify fd: a
	// thread of the app in bind() while the unit has no main process
	// (RestartSec=2 gives the request time to get there).
	for !inBind(pid) {
		select {
		case got := <-bound:
			t.Fatalf("a bind with no inplaced ended at once (%s): want it to wait for the next inplaced", got)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Since(killed) > 30*time.Second {
			t.Fatal("the app's bind() was not seen waiting within 30 s of the kill")
		}
	}
	seen := time.Since(killed)
	if u := unitProps(t, "inplaced", "MainPID", "SubState"); u["MainPID"] != "0" {
		t.Fatalf("the bind was seen waiting %s after the kill, but inplaced already runs again (%v): nothing proven", seen, u)
	}
	t.Logf("kill -9 of inplaced (PID %s): the app's bind() waits %s after it, no inplaced running", old, seen.Round(time.Millisecond))
	eventually(t, 2*time.Minute, "systemd restarts inplaced", func() error {
		u := unitProps(t, "inplaced", "MainPID", "ActiveState", "NRestarts")
		if u["ActiveState"] != "active" || u["MainPID"] == "0" || u["MainPID"] == old {
			return fmt.Errorf("%v", u)
		}
		t.Logf("inplaced active again %s after the kill: %v", time.Since(killed).Round(time.Millisecond), u)
		return nil
	})
	return bound
}

// inBind reports whether a thread of process pid is in the bind syscall
// (/proc/<pid>/task/<tid>/syscall starts with its number).
func inBind(pid int) bool {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/syscall", pid))
	for _, f := range tasks {
		b, err := os.ReadFile(f)
		if err == nil && strings.HasPrefix(string(b), strconv.Itoa(unix.SYS_BIND)+" ") {
			return true
		}
	}
	return false
}

// storeCount is inplaced.service's NFileDescriptorStore, logged with the
// seccomp notify fds PID 1 holds (what the store holds).
func storeCount(t *testing.T, when string) int {
	t.Helper()
	v := unitProps(t, "inplaced", "NFileDescriptorStore")["NFileDescriptorStore"]
	n, err := strconv.Atoi(v)
	if err != nil {
		t.Fatalf("systemctl show inplaced -p NFileDescriptorStore: %q", v)
	}
	notify := 0
	fds, _ := filepath.Glob("/proc/1/fd/*")
	for _, fd := range fds {
		if l, _ := os.Readlink(fd); l == "anon_inode:seccomp notify" {
			notify++
		}
	}
	t.Logf("%s: NFileDescriptorStore=%d, PID 1 holds %d seccomp notify fds", when, n, notify)
	return n
}

// waitStoreEmpty waits for the store to let go of the pod's fds once
// kubelet stopped its containers (inplaced's FDSTOREREMOVE, or systemd
// seeing the fd hang up).
func waitStoreEmpty(t *testing.T) {
	start := time.Now()
	eventually(t, 3*time.Minute, "the fd store empty after the pod's removal", func() error {
		if n := unitProps(t, "inplaced", "NFileDescriptorStore")["NFileDescriptorStore"]; n != "0" {
			return fmt.Errorf("NFileDescriptorStore=%s", n)
		}
		return nil
	})
	t.Logf("fd store empty %s after the pod's removal", time.Since(start).Round(time.Millisecond))
}

func mustBind(t *testing.T, url, when string) {
	t.Helper()
	if got, err := get(url, time.Minute); err != nil || !strings.Contains(got, "listening") {
		t.Fatalf("a bind %s: %q %v", when, got, err)
	}
}

// crictlExec runs cat /VERSION in container id with crictl, through
// inplaced (/etc/crictl.yaml): runc hands the exec's notify fd to the
// agent, so it works only with one serving.
func crictlExec(t *testing.T, id string) {
	t.Helper()
	c, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := time.Now()
	out, err := exec.CommandContext(c, "crictl", "exec", id, "cat", "/VERSION").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "v2" {
		t.Fatalf("crictl exec into the swapped container: %v: %s", err, out)
	}
	t.Logf("crictl exec into the swapped container: %s in %s", strings.TrimSpace(string(out)), time.Since(start).Round(time.Millisecond))
}

// get is the trimmed body of a GET of url; a status other than 200 is an
// error.
func get(url string, timeout time.Duration) (string, error) {
	c := http.Client{Timeout: timeout}
	resp, err := c.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("%s", resp.Status)
	}
	return strings.TrimSpace(string(b)), err
}
