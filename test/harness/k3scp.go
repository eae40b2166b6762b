package harness

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"
)

// K3sControlPlane is a k3s server without its agent (--disable-agent): the
// control plane (API server, scheduler, controller-manager, kine on sqlite)
// of k3s agents that run elsewhere — the node guest's, under its systemd
// (test/node). It listens on 127.0.0.1 only; agents reach it through a
// forward at Advertise:Port, which is also what it tells them its API
// server's address is (the `kubernetes` Service's endpoint, which an
// agent's load balancer follows).
//
// What it puts on the machine: Dir (data dir, config, log, admin
// kubeconfig), removed by its cleanup after SIGTERM to k3s's process group;
// what k3s writes outside it is taken back as for a K3sNode (k3sMachine).
type K3sControlPlane struct {
	Dir     string
	LogPath string
	// Port is the supervisor's and API server's port, on 127.0.0.1 here
	// and at Advertise for the agents.
	Port      int
	Advertise string
	Token     string
	// AdminKubeconfig names https://127.0.0.1:Port; its certificate also
	// names Advertise.
	AdminKubeconfig string
	Admin           kubernetes.Interface

	d *daemon
}

// StartK3sControlPlane starts a k3s server without agent on 127.0.0.1:port,
// advertised as advertise:port, and returns once its API server is ready.
// The test bed's network is the agents' containerd's: no flannel,
// kube-proxy, network policy or packaged add-ons.
func StartK3sControlPlane(tb testing.TB, advertise string, port int) *K3sControlPlane {
	tb.Helper()
	RequireRoot(tb)
	Require(tb, "k3s "+K3sVersion, isExecutable(K3sPath()),
		K3sPath()+" not found; run hack/build-k3s.sh (or INPLACED_WITH_KUBELET=1 hack/install-deps.sh)")
	start := time.Now()
	dir, err := os.MkdirTemp(shortTempDir(), "ip3c")
	if err != nil {
		tb.Fatalf("k3s control plane: %v", err)
	}
	c := &K3sControlPlane{Dir: dir, LogPath: filepath.Join(dir, "k3s.log"), Port: port, Advertise: advertise,
		Token: randHex(16), AdminKubeconfig: filepath.Join(dir, "admin.kubeconfig")}
	settings := k3sServerSettings(tb)
	for k, v := range map[string]any{
		"disable-agent": true, "data-dir": filepath.Join(dir, "data"), "token": c.Token, "write-kubeconfig": c.AdminKubeconfig,
		"bind-address": "127.0.0.1", "advertise-address": advertise, "tls-san": []string{advertise}, "https-listen-port": port,
	} {
		settings[k] = v
	}
	cfg, err := yaml.Marshal(settings)
	if err != nil {
		tb.Fatal(err)
	}
	config := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(config, cfg, 0o600); err != nil {
		tb.Fatal(err)
	}
	k3sMachineAcquire()
	tb.Cleanup(func() {
		if err := c.close(tb); err != nil {
			tb.Errorf("k3s control plane cleanup: %v", err)
		}
	})
	if c.d, err = spawnDaemon("k3s server", K3sPath(), dir, c.LogPath, []string{"server", "--config", config}, nil); err != nil {
		tb.Fatalf("k3s control plane: %v", err)
	}
	if err := waitFor(c.d, 3*time.Minute, c.apiReady); err != nil {
		tb.Fatalf("k3s control plane: %v\n%s", err, tailFile(c.LogPath, 60))
	}
	tb.Logf("k3s control plane (no agent) ready in %s: pid %d, 127.0.0.1:%d, advertised as %s:%d",
		time.Since(start).Round(time.Millisecond), c.d.pid(), port, advertise, port)
	return c
}

// apiReady makes the admin client once k3s has written its kubeconfig, and
// asks the API server's /readyz.
func (c *K3sControlPlane) apiReady() error { return k3sAPIReady(&c.Admin, c.AdminKubeconfig) }

// LogTail returns the last n lines of k3s's log.
func (c *K3sControlPlane) LogTail(lines int) string { return tailFile(c.LogPath, lines) }

func (c *K3sControlPlane) close(tb testing.TB) error {
	if tb.Failed() {
		tb.Logf("k3s control plane log (last 40 lines):\n%s", c.LogTail(40))
	}
	var errs []error
	if err := c.d.stop(syscall.SIGTERM, 30*time.Second); err != nil {
		errs = append(errs, err)
	}
	if err := unmountUnder(c.Dir); err != nil {
		errs = append(errs, err)
	}
	if err := k3sMachineRelease(); err != nil {
		errs = append(errs, err)
	}
	if len(mountsUnder(c.Dir)) == 0 {
		if err := os.RemoveAll(c.Dir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
