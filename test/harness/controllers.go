package harness

import (
	"crypto/tls"
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// KubeControllerManagerPath is the kube-controller-manager built by
// hack/build-control-plane.sh ($INPLACED_KUBE_CONTROLLER_MANAGER overrides
// it).
func KubeControllerManagerPath() string {
	return toolPath("INPLACED_KUBE_CONTROLLER_MANAGER",
		filepath.Join(ToolsDir(), "kube-controller-manager-"+KubeAPIServerVersion, "kube-controller-manager"))
}

// ControllersPrerequisites skips (or fails under CI=true) unless
// kube-controller-manager and kube-scheduler are built.
func ControllersPrerequisites(tb testing.TB) {
	tb.Helper()
	for _, p := range []string{KubeControllerManagerPath(), KubeSchedulerPath()} {
		Require(tb, filepath.Base(p)+" "+KubeAPIServerVersion, isExecutable(p),
			p+" not found; run hack/build-control-plane.sh (or INPLACED_WITH_KUBELET=1 hack/install-deps.sh)")
	}
}

// Controllers are kube-controller-manager (every default controller:
// DaemonSets, Jobs, the garbage collector, node lifecycle, service accounts
// and the root CA publisher) and kube-scheduler, started against a
// ControlPlane by StartControllers: workloads are rolled out by the real
// controllers, and a Node whose kubelet stops posting status turns
// NotReady. Both run as the admin identity, without leader election, their
// secure ports on loopback; their logs are under the control plane's Dir,
// and the control plane's Close stops them first.
type Controllers struct {
	ManagerLog, SchedulerLog string
	managerPort, schedPort   int
	manager, sched           *daemon
}

// StartControllers starts kube-controller-manager and kube-scheduler and
// returns at once: they come up while the caller goes on (WaitHealthy).
func (cp *ControlPlane) StartControllers(tb testing.TB) *Controllers {
	tb.Helper()
	ControllersPrerequisites(tb)
	c := &Controllers{ManagerLog: filepath.Join(cp.Dir, "kube-controller-manager.log"), SchedulerLog: filepath.Join(cp.Dir, "kube-scheduler.log")}
	var err error
	for _, p := range []*int{&c.managerPort, &c.schedPort} {
		if *p, err = freePort(); err != nil {
			tb.Fatal(err)
		}
	}
	kc := cp.AdminKubeconfig
	common := []string{"--kubeconfig=" + kc, "--authentication-kubeconfig=" + kc, "--authorization-kubeconfig=" + kc,
		"--leader-elect=false", "--bind-address=127.0.0.1"}
	c.manager, err = cp.spawn("kube-controller-manager", KubeControllerManagerPath(), c.ManagerLog, append(common,
		"--secure-port="+strconv.Itoa(c.managerPort), "--root-ca-file="+cp.CACertPath,
		"--cluster-name=inplaced", "--profiling=false"), nil)
	if err != nil {
		tb.Fatal(err)
	}
	c.sched, err = cp.spawn("kube-scheduler", KubeSchedulerPath(), c.SchedulerLog, append(common,
		"--secure-port="+strconv.Itoa(c.schedPort), "--profiling=false"), nil)
	if err != nil {
		_ = c.manager.stop(syscall.SIGTERM, 10*time.Second)
		tb.Fatal(err)
	}
	cp.mu.Lock()
	cp.controllers = c
	cp.mu.Unlock()
	return c
}

// WaitHealthy waits until both answer /healthz.
func (c *Controllers) WaitHealthy(timeout time.Duration) error {
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // their self-signed loopback serving certificates
	for _, d := range []struct {
		d    *daemon
		port int
	}{{c.manager, c.managerPort}, {c.sched, c.schedPort}} {
		url := "https://127.0.0.1:" + strconv.Itoa(d.port) + "/healthz"
		if err := waitFor(d.d, timeout, func() error {
			resp, err := client.Get(url)
			if err != nil {
				return err
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("%s: %s", url, resp.Status)
			}
			return nil
		}); err != nil {
			return err
		}
	}
	return nil
}

// stop stops both (SIGTERM, SIGKILL after 10 s).
func (c *Controllers) stop() []error {
	if c == nil {
		return nil
	}
	var errs []error
	for _, d := range []*daemon{c.sched, c.manager} {
		if err := d.stop(syscall.SIGTERM, 10*time.Second); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// LogTails is the last n lines of both logs.
func (c *Controllers) LogTails(n int) string {
	return "kube-controller-manager:\n" + tailFile(c.ManagerLog, n) + "\nkube-scheduler:\n" + tailFile(c.SchedulerLog, n)
}
