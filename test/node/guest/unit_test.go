package guest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/test/harness"
)

// TestUnit checks systemd/inplaced.service as shipped and installed from the
// README: Type=notify reaches active, the hardening leaves inplaced its
// sockets, state and cgroup writes (the resize and swap suites write through
// it), `systemctl restart containerd` leaves inplaced's main PID and
// NRestarts alone (kubelet's calls get Unavailable meanwhile), and `systemctl
// restart inplaced` under a running kubelet leaves the pods running (a static
// pod and one created through the API server: the same containers, Ready),
// kubelet healthy and not restarted, and the Node Ready through the API —
// its Ready condition never changed, and kubelet renews its lease.
func TestUnit(t *testing.T) {
	if cs := kubeIfAny(); cs != nil {
		createPods(t, cs, pod{name: "keep-api", image: imgApp1, readinessHTTP: 8080, cpuLim: "200m", memLim: "64Mi"})
	}
	writePods(t, pod{name: "keep", image: imgApp1, readinessHTTP: 8080, cpuLim: "200m", memLim: "64Mi"})
	proxy := harness.DialCRI(t, proxySocket)

	t.Run("notify", func(t *testing.T) {
		p := unitProps(t, "inplaced", "Type", "ActiveState", "SubState", "NRestarts", "FragmentPath", "Wants", "Requires", "After", "Before")
		t.Logf("inplaced.service: %v", p)
		if p["Type"] != "notify" || p["ActiveState"] != "active" || p["SubState"] != "running" {
			t.Errorf("inplaced: %v, want Type=notify, active (running)", p)
		}
		if strings.Contains(p["Requires"], "containerd") {
			t.Errorf("inplaced Requires= containerd: a containerd restart would stop it")
		}
		for _, s := range []string{proxySocket, controlSocket} {
			fi, err := os.Stat(s)
			if err != nil {
				t.Fatalf("socket: %v", err)
			}
			if fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != 0o600 {
				t.Errorf("%s: mode %s, want a socket 0600", s, fi.Mode())
			}
		}
		entries, err := os.ReadDir(stateDir)
		if err != nil || len(entries) == 0 {
			t.Errorf("state dir %s: %v entries, err %v: inplaced did not write its state", stateDir, len(entries), err)
		}
		if fi, err := os.Stat(stateDir); err == nil && fi.Mode().Perm() != 0o700 {
			t.Errorf("state dir mode %s, want 0700", fi.Mode())
		}
		out, _ := exec.Command("systemd-analyze", "security", "inplaced.service", "--no-pager").CombinedOutput()
		score := regexp.MustCompile(`Overall exposure level for inplaced.service: .*`).FindString(string(out))
		t.Logf("systemd-analyze security: %s", score)
		_ = os.WriteFile("security.txt", out, 0o644)
		if score == "" {
			t.Errorf("no score from systemd-analyze security:\n%s", out)
		}
	})

	keep := waitPod(t, "keep", 5*time.Minute, harness.Running(container))
	keepID := keep.Container(container).ID()
	if cs := kubeIfAny(); cs != nil {
		// Running before containerd's restart, so that it cannot catch the
		// pod half started.
		waitAPIPod(t, cs, "keep-api", 5*time.Minute, harness.PodRunning(container))
	}

	t.Run("containerd restart", func(t *testing.T) {
		before := unitProps(t, "inplaced", "MainPID", "NRestarts")
		systemctl(t, "stop", "containerd")
		c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_, err := proxy.Runtime.Version(c, &runtimeapi.VersionRequest{})
		cancel()
		t.Logf("Version through inplaced while containerd is stopped: %v", err)
		if status.Code(err) != codes.Unavailable {
			t.Errorf("with containerd stopped, a call through inplaced got %v, want Unavailable", err)
		}
		systemctl(t, "start", "containerd")
		systemctl(t, "restart", "containerd")
		eventually(t, time.Minute, "CRI through inplaced after containerd's restart", func() error {
			c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err := proxy.Runtime.Version(c, &runtimeapi.VersionRequest{})
			return err
		})
		after := unitProps(t, "inplaced", "MainPID", "NRestarts", "ActiveState")
		t.Logf("inplaced before %v, after %v", before, after)
		if after["MainPID"] != before["MainPID"] || after["NRestarts"] != "0" || after["ActiveState"] != "active" {
			t.Errorf("inplaced after restarts of containerd: %v, was %v: want the same main PID and NRestarts=0", after, before)
		}
		waitPod(t, "keep", 2*time.Minute, harness.Running(container))
	})

	t.Run("inplaced restart", func(t *testing.T) {
		cs := kube(t)
		apiPod := waitAPIPod(t, cs, "keep-api", 5*time.Minute, harness.PodRunning(container))
		apiID := criID(apiContainer(apiPod))
		waitNodeReady(t, cs, 2*time.Minute)
		_, ready, err := nodeReady(cs)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("before: Node %s Ready=%s since %s; pod keep-api (API) container %s, static pod keep container %s", nodeName, ready.Status,
			ready.LastTransitionTime.Format(time.TimeOnly), apiID[:12], keepID[:12])

		before := unitProps(t, "inplaced", "MainPID")
		kubelet := unitProps(t, "kubelet", "MainPID", "NRestarts")
		restarted := time.Now()
		systemctl(t, "restart", "inplaced")
		after := unitProps(t, "inplaced", "MainPID", "ActiveState", "SubState")
		if after["ActiveState"] != "active" || after["MainPID"] == before["MainPID"] {
			t.Errorf("inplaced after restart: %v (main PID was %s)", after, before["MainPID"])
		}
		if k := unitProps(t, "kubelet", "MainPID", "NRestarts"); k["MainPID"] != kubelet["MainPID"] || k["NRestarts"] != kubelet["NRestarts"] {
			t.Errorf("kubelet was restarted with inplaced: %v, was %v", k, kubelet)
		}
		eventually(t, time.Minute, "kubelet healthy", kubeletHealthy)
		// Two sync periods and more: kubelet keeps the same container running.
		time.Sleep(12 * time.Second)
		p := waitPod(t, "keep", 2*time.Minute, harness.Running(container))
		if c := p.Container(container); c.ID() != keepID || c.RestartCount != 0 || p.Condition("Ready") != "True" {
			t.Errorf("after inplaced's restart kubelet shows container %s restarts %d, pod Ready %s; want %s, 0, True",
				c.ID(), c.RestartCount, p.Condition("Ready"), keepID)
		}
		if st := inspect(t, proxy, keepID); st.status.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
			t.Errorf("container %s is %s after inplaced's restart", keepID, st.status.State)
		}
		if out, err := exec.Command("crictl", "ps").CombinedOutput(); err != nil || !strings.Contains(string(out), keepID[:13]) {
			t.Errorf("crictl ps through inplaced (/etc/crictl.yaml): %v\n%s", err, out)
		}

		// Through the API: the Node stayed Ready (its condition did not
		// transition) and kubelet renewed its lease after the restart; both
		// pods run the same containers, Ready, not restarted.
		_, readyAfter, err := nodeReady(cs)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("after: Node %s Ready=%s since %s (%s: %s)", nodeName, readyAfter.Status, readyAfter.LastTransitionTime.Format(time.TimeOnly), readyAfter.Reason, readyAfter.Message)
		if readyAfter.Status != corev1.ConditionTrue || !readyAfter.LastTransitionTime.Equal(&ready.LastTransitionTime) {
			t.Errorf("Node %s Ready=%s since %s after inplaced's restart, was True since %s: want Ready throughout",
				nodeName, readyAfter.Status, readyAfter.LastTransitionTime, ready.LastTransitionTime)
		}
		eventually(t, time.Minute, "kubelet renews its node lease after inplaced's restart", func() error {
			if r := leaseRenewed(t, cs); !r.After(restarted) {
				return fmt.Errorf("lease renewed %s, inplaced restarted %s", r.Format(time.StampMilli), restarted.Format(time.StampMilli))
			}
			return nil
		})
		for _, w := range []struct{ name, id string }{{"keep-api", apiID}, {podName("keep"), keepID}} {
			p := waitAPIPod(t, cs, w.name, time.Minute, harness.PodRunning(container))
			s := apiContainer(p)
			t.Logf("pod %s (API): phase %s, Ready %s, container %s restarts %d", w.name, p.Status.Phase, podCondition(p, corev1.PodReady), criID(s)[:12], s.RestartCount)
			if criID(s) != w.id || s.RestartCount != 0 || podCondition(p, corev1.PodReady) != "True" {
				t.Errorf("after inplaced's restart the API shows pod %s container %s restarts %d Ready %s; want %s, 0, True",
					w.name, criID(s), s.RestartCount, podCondition(p, corev1.PodReady), w.id)
			}
		}
	})
}

// TestUnitJournal runs last: whatever the suites did through inplaced, its
// hardening denied it nothing (a filtered syscall returns EPERM, a read-only
// path EROFS).
func TestUnitJournal(t *testing.T) {
	out, err := exec.Command("journalctl", "-b", "-u", "inplaced", "--no-pager", "-o", "cat").CombinedOutput()
	if err != nil {
		t.Fatalf("journalctl: %v\n%s", err, out)
	}
	for _, bad := range []string{"operation not permitted", "read-only file system", "permission denied"} {
		for _, line := range strings.Split(string(out), "\n") {
			if strings.Contains(strings.ToLower(line), bad) {
				t.Errorf("inplaced's journal: %s", line)
			}
		}
	}
}
