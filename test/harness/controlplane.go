package harness

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// ControlPlane is a minimal real Kubernetes control plane started by
// StartControlPlane: etcd and kube-apiserver (built by
// hack/build-control-plane.sh) on loopback, TLS with a PKI made in Go,
// --authorization-mode=Node,RBAC and the NodeRestriction admission plugin.
// There is no scheduler and no controller-manager unless StartControllers
// starts them: pods are bound with spec.nodeName, and the two objects the
// controller-manager would make for them — ServiceAccount default/default and ConfigMap default/kube-root-ca.crt
// — are created by StartControlPlane. Nothing evicts pods or marks a Node
// NotReady when its kubelet stops (no node-lifecycle controller).
//
// What it puts on the machine, and how Close takes it back: Dir holds the
// PKI, the kubeconfigs, etcd's data and both logs; processes with Dir in
// their command line (both daemons have it in a flag) are killed, Dir is
// removed. The daemons run in their own process groups with Pdeathsig, so
// they die with the test binary.
type ControlPlane struct {
	Dir string
	// URL is the API server, "https://127.0.0.1:<APIServerPort>".
	URL           string
	APIServerPort int
	// EtcdURL is etcd's client URL (plain HTTP on loopback).
	EtcdURL string
	// CACertPath is the CA of every certificate here (serving and client).
	CACertPath string
	// AdminKubeconfig is a kubeconfig for a system:masters client with
	// embedded certificates; Admin is a clientset for the same identity.
	AdminKubeconfig string
	Admin           kubernetes.Interface
	AdminConfig     *rest.Config
	// EtcdLogPath and APIServerLogPath are the daemons' stdout+stderr.
	EtcdLogPath      string
	APIServerLogPath string

	tb           testing.TB
	pki          *pki
	etcdArgs     []string
	apiArgs      []string
	mu           sync.Mutex
	etcd, apisrv *daemon
	controllers  *Controllers

	closeOnce sync.Once
	closeErr  error
}

// daemon is one run of a control-plane process.
type daemon struct {
	name   string
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd.Wait returned; err is set then
	err    error
}

// ControlPlanePrerequisites skips (or fails under CI=true) unless etcd and
// kube-apiserver are built.
func ControlPlanePrerequisites(tb testing.TB) {
	tb.Helper()
	for _, t := range []struct{ name, path string }{
		{"kube-apiserver " + KubeAPIServerVersion, KubeAPIServerPath()},
		{"etcd " + EtcdVersion, EtcdPath()},
		{"kubectl " + KubeAPIServerVersion, KubectlPath()},
	} {
		Require(tb, t.name, isExecutable(t.path),
			t.path+" not found; run hack/build-control-plane.sh (or INPLACED_WITH_KUBELET=1 hack/install-deps.sh)")
	}
}

// StartControlPlane starts etcd and kube-apiserver on free loopback ports,
// waits for /readyz and creates ServiceAccount default/default and ConfigMap
// default/kube-root-ca.crt. tb.Cleanup tears it down (Close).
func StartControlPlane(tb testing.TB) *ControlPlane {
	tb.Helper()
	ControlPlanePrerequisites(tb)
	start := time.Now()
	dir, err := os.MkdirTemp(shortTempDir(), "ipcp")
	if err != nil {
		tb.Fatalf("control plane: %v", err)
	}
	cp := &ControlPlane{
		Dir: dir, EtcdLogPath: filepath.Join(dir, "etcd.log"), APIServerLogPath: filepath.Join(dir, "kube-apiserver.log"),
		AdminKubeconfig: filepath.Join(dir, "admin.kubeconfig"), tb: tb,
	}
	tb.Cleanup(func() {
		if err := cp.Close(); err != nil {
			tb.Errorf("control plane %s cleanup: %v", cp.Dir, err)
		}
	})
	if err := cp.setup(); err != nil {
		tb.Fatalf("control plane: %v", err)
	}
	if err := cp.startEtcd(); err != nil {
		tb.Fatalf("start etcd: %v\n%s", err, cp.EtcdLogTail(40))
	}
	if err := cp.StartAPIServer(); err != nil {
		tb.Fatalf("start kube-apiserver: %v\n%s", err, cp.APIServerLogTail(60))
	}
	if err := cp.bootstrapObjects(); err != nil {
		tb.Fatalf("control plane: %v\n%s", err, cp.APIServerLogTail(40))
	}
	tb.Logf("control plane ready in %s: kube-apiserver %s at %s (pid %d), etcd %s at %s (pid %d)",
		time.Since(start).Round(time.Millisecond), KubeAPIServerVersion, cp.URL, cp.APIServerPID(),
		EtcdVersion, cp.EtcdURL, cp.EtcdPID())
	return cp
}

// setup makes the ports, the PKI, the admin kubeconfig and client, and the
// daemons' arguments.
func (cp *ControlPlane) setup() error {
	var ports [3]int
	for i := range ports {
		p, err := freePort()
		if err != nil {
			return err
		}
		ports[i] = p
	}
	etcdClient, etcdPeer := ports[0], ports[1]
	cp.APIServerPort = ports[2]
	cp.URL = "https://127.0.0.1:" + strconv.Itoa(cp.APIServerPort)
	cp.EtcdURL = "http://127.0.0.1:" + strconv.Itoa(etcdClient)

	var err error
	if cp.pki, err = newPKI(filepath.Join(cp.Dir, "pki")); err != nil {
		return err
	}
	cp.CACertPath = cp.pki.caPath()
	serving, err := cp.pki.issue("apiserver", "kube-apiserver", nil, true,
		[]net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("10.96.0.1")},
		[]string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"})
	if err != nil {
		return err
	}
	kubeletClient, err := cp.pki.issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client", []string{"system:masters"}, false, nil, nil)
	if err != nil {
		return err
	}
	admin, err := cp.pki.issue("admin", "inplaced-admin", []string{"system:masters"}, false, nil, nil)
	if err != nil {
		return err
	}
	saKey, saPub, err := cp.pki.serviceAccountKeys()
	if err != nil {
		return err
	}
	if err := cp.writeKubeconfig(cp.AdminKubeconfig, "admin", admin); err != nil {
		return err
	}
	cp.AdminConfig = &rest.Config{
		Host:            cp.URL,
		TLSClientConfig: rest.TLSClientConfig{CAData: cp.pki.caPEM, CertData: admin.CertPEM, KeyData: admin.KeyPEM},
		QPS:             200, Burst: 400, Timeout: 30 * time.Second,
	}
	if cp.Admin, err = kubernetes.NewForConfig(cp.AdminConfig); err != nil {
		return err
	}

	etcdData := filepath.Join(cp.Dir, "etcd")
	peerURL := "http://127.0.0.1:" + strconv.Itoa(etcdPeer)
	cp.etcdArgs = []string{
		"--name", "inplaced", "--data-dir", etcdData,
		"--listen-client-urls", cp.EtcdURL, "--advertise-client-urls", cp.EtcdURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "inplaced=" + peerURL, "--initial-cluster-state", "new",
		"--log-level", "warn",
		// A test bed: losing the last writes in a machine crash is fine,
		// waiting for fsync on a shared disk is not.
		"--unsafe-no-fsync",
	}
	cp.apiArgs = []string{
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(cp.APIServerPort),
		// The default reconciler refuses a loopback advertise address; the
		// Service "kubernetes" then has no endpoints.
		"--endpoint-reconciler-type=none",
		"--etcd-servers=" + cp.EtcdURL,
		"--cert-dir=" + filepath.Join(cp.Dir, "apiserver-certs"),
		"--tls-cert-file=" + serving.CertPath, "--tls-private-key-file=" + serving.KeyPath,
		"--client-ca-file=" + cp.CACertPath,
		"--kubelet-client-certificate=" + kubeletClient.CertPath, "--kubelet-client-key=" + kubeletClient.KeyPath,
		"--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + saPub, "--service-account-signing-key-file=" + saKey,
		"--service-cluster-ip-range=10.96.0.0/24", "--allow-privileged=true",
		"--profiling=false",
		// On SIGTERM, wait for the in-flight requests (not kubelet's
		// watches) and then give HTTP shutdown 2 s, instead of
		// --request-timeout (60 s) for the watches to end.
		"--shutdown-send-retry-after=true",
	}
	return nil
}

// writeKubeconfig writes a kubeconfig for the client certificate c, with
// everything embedded.
func (cp *ControlPlane) writeKubeconfig(path, user string, c *certPair) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["inplaced"] = &clientcmdapi.Cluster{Server: cp.URL, CertificateAuthorityData: cp.pki.caPEM}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{ClientCertificateData: c.CertPEM, ClientKeyData: c.KeyPEM}
	cfg.Contexts["inplaced"] = &clientcmdapi.Context{Cluster: "inplaced", AuthInfo: user}
	cfg.CurrentContext = "inplaced"
	return clientcmd.WriteToFile(*cfg, path)
}

// NodeKubeconfig writes a kubeconfig with a client certificate for the Node
// nodeName (CN=system:node:<nodeName>, O=system:nodes: what the Node
// authorizer and NodeRestriction expect of a kubelet) and returns its path.
func (cp *ControlPlane) NodeKubeconfig(tb testing.TB, nodeName string) string {
	tb.Helper()
	return cp.UserKubeconfig(tb, "node-"+nodeName, "system:node:"+nodeName, "system:nodes")
}

// ServiceAccountKubeconfig writes a kubeconfig whose client certificate
// authenticates as ServiceAccount ns/name (the user name and groups RBAC
// matches a ServiceAccount subject by) and returns its path.
func (cp *ControlPlane) ServiceAccountKubeconfig(tb testing.TB, ns, name string) string {
	tb.Helper()
	return cp.UserKubeconfig(tb, "sa-"+ns+"-"+name, "system:serviceaccount:"+ns+":"+name,
		"system:serviceaccounts", "system:serviceaccounts:"+ns)
}

// UserKubeconfig writes a kubeconfig (file stem) with a client certificate
// for user in groups and returns its path.
func (cp *ControlPlane) UserKubeconfig(tb testing.TB, stem, user string, groups ...string) string {
	tb.Helper()
	c, err := cp.pki.issue(stem, user, groups, false, nil, nil)
	if err != nil {
		tb.Fatalf("client certificate for %s: %v", user, err)
	}
	path := filepath.Join(cp.Dir, stem+".kubeconfig")
	if err := cp.writeKubeconfig(path, user, c); err != nil {
		tb.Fatalf("kubeconfig for %s: %v", user, err)
	}
	return path
}

// StartKubelet starts a kubelet registered to this control plane as Node
// o.NodeName (a fresh name when empty) with that node's own credentials.
func (cp *ControlPlane) StartKubelet(tb testing.TB, o KubeletOptions) *Kubelet {
	tb.Helper()
	if o.NodeName == "" {
		o.NodeName = newNodeName()
	}
	o.Kubeconfig = cp.NodeKubeconfig(tb, o.NodeName)
	return StartKubelet(tb, o)
}

// controlPlaneEnv is the environment of the daemons: no KUBECONFIG, and no
// ETCD_* or K3S_* variables (etcd and k3s read them as flags).
func controlPlaneEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "KUBECONFIG=") || strings.HasPrefix(kv, "ETCD_") || strings.HasPrefix(kv, "K3S_") || strings.HasPrefix(kv, "NOTIFY_SOCKET=") {
			continue
		}
		out = append(out, kv)
	}
	return out
}

// spawn starts bin with args and env added to controlPlaneEnv, output
// appended to logPath, in its own process group, killed when the test
// binary dies.
func (cp *ControlPlane) spawn(name, bin, logPath string, args, env []string) (*daemon, error) {
	return spawnDaemon(name, bin, cp.Dir, logPath, args, env)
}

// spawnDaemon starts bin in directory dir with args and env added to
// controlPlaneEnv, output appended to logPath, in its own process group,
// killed when the test binary dies.
func spawnDaemon(name, bin, dir, logPath string, args, env []string) (*daemon, error) {
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(controlPlaneEnv(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := startLocked(cmd); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	d := &daemon{name: name, cmd: cmd, exited: make(chan struct{})}
	go func() {
		d.err = cmd.Wait()
		close(d.exited)
	}()
	return d, nil
}

// stop sends sig to d's process group, waits up to grace, then SIGKILLs it.
func (d *daemon) stop(sig syscall.Signal, grace time.Duration) error {
	if d == nil {
		return nil
	}
	select {
	case <-d.exited:
		return nil
	default:
	}
	pgid := d.cmd.Process.Pid
	_ = syscall.Kill(-pgid, sig)
	select {
	case <-d.exited:
		return nil
	case <-time.After(grace):
	}
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	select {
	case <-d.exited:
		return fmt.Errorf("%s did not stop within %s: killed", d.name, grace)
	case <-time.After(10 * time.Second):
		return fmt.Errorf("%s (pid %d) survived SIGKILL", d.name, pgid)
	}
}

// APIServerPID is kube-apiserver's pid, 0 while it is not running.
func (cp *ControlPlane) APIServerPID() int {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	return cp.apisrv.pid()
}

// EtcdPID is etcd's pid, 0 while it is not running.
func (cp *ControlPlane) EtcdPID() int {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	return cp.etcd.pid()
}

func (d *daemon) pid() int {
	if d == nil {
		return 0
	}
	select {
	case <-d.exited:
		return 0
	default:
		return d.cmd.Process.Pid
	}
}

func (cp *ControlPlane) startEtcd() error {
	d, err := cp.spawn("etcd", EtcdPath(), cp.EtcdLogPath, cp.etcdArgs, nil)
	if err != nil {
		return err
	}
	cp.mu.Lock()
	cp.etcd = d
	cp.mu.Unlock()
	return waitFor(d, 30*time.Second, func() error {
		body, err := httpGetBody(cp.EtcdURL + "/health")
		if err != nil {
			return err
		}
		if !strings.Contains(string(body), `"health":"true"`) {
			return fmt.Errorf("etcd /health: %s", body)
		}
		return nil
	})
}

// StartAPIServer starts kube-apiserver (again, after StopAPIServer: same
// port, same etcd data, same certificates) and waits for /readyz and for the
// Node authorizer's graph.
func (cp *ControlPlane) StartAPIServer() error {
	if cp.APIServerPID() != 0 {
		return errors.New("kube-apiserver is running")
	}
	var logOffset int64
	if st, err := os.Stat(cp.APIServerLogPath); err == nil {
		logOffset = st.Size()
	}
	d, err := cp.spawn("kube-apiserver", KubeAPIServerPath(), cp.APIServerLogPath, cp.apiArgs, nil)
	if err != nil {
		return err
	}
	cp.mu.Lock()
	cp.apisrv = d
	cp.mu.Unlock()
	if err := waitFor(d, 90*time.Second, cp.readyz); err != nil {
		return err
	}
	// /readyz does not wait for the Node authorizer's graph (which pod is on
	// which node, from informers): until it is filled, a node's requests for
	// its own pods are refused with "no relationship found". Its informers
	// log when they have synced.
	if err := waitFor(d, 30*time.Second, func() error {
		if !fileContainsFrom(cp.APIServerLogPath, logOffset, nodeAuthorizerSynced) {
			return errors.New("no " + nodeAuthorizerSynced + " in its log")
		}
		return nil
	}); err != nil {
		cp.tb.Logf("kube-apiserver: Node authorizer graph: %v; going on", err)
	}
	return nil
}

// nodeAuthorizerSynced is what kube-apiserver logs (-v=0) once the Node
// authorizer's informers have delivered every object to its graph.
const nodeAuthorizerSynced = `"Caches are synced" controller="node_authorizer"`

// fileContainsFrom reports whether the file at path holds s after offset.
func fileContainsFrom(path string, offset int64, s string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return false
	}
	b, err := io.ReadAll(f)
	return err == nil && strings.Contains(string(b), s)
}

// StopAPIServer stops kube-apiserver (SIGTERM; SIGKILL after 20 s) and
// leaves etcd running: the API is gone until StartAPIServer.
func (cp *ControlPlane) StopAPIServer() error {
	cp.mu.Lock()
	d := cp.apisrv
	cp.mu.Unlock()
	return d.stop(syscall.SIGTERM, 20*time.Second)
}

func (cp *ControlPlane) readyz() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	body, err := cp.Admin.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
	if err != nil {
		return fmt.Errorf("/readyz: %w: %s", err, strings.TrimSpace(string(body)))
	}
	if strings.TrimSpace(string(body)) != "ok" {
		return fmt.Errorf("/readyz: %s", body)
	}
	return nil
}

// waitFor polls ready every 200 ms until it returns nil, d exits, or timeout.
func waitFor(d *daemon, timeout time.Duration, ready func() error) error {
	deadline := time.Now().Add(timeout)
	var last error
	for {
		select {
		case <-d.exited:
			return fmt.Errorf("%s exited during start: %v", d.name, d.err)
		default:
		}
		if last = ready(); last == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after %s: %v", d.name, timeout, last)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// bootstrapObjects creates what kube-controller-manager would: the default
// ServiceAccount (pods are refused without it) and kube-root-ca.crt (mounted
// into pods with a service-account token). The default namespace may appear
// a moment after /readyz.
func (cp *ControlPlane) bootstrapObjects() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	create := func(what string, f func() error) error {
		for {
			err := f()
			if err == nil || apierrors.IsAlreadyExists(err) {
				return nil
			}
			if !apierrors.IsNotFound(err) || ctx.Err() != nil {
				return fmt.Errorf("create %s: %w", what, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	if err := create("ServiceAccount default/default", func() error {
		_, err := cp.Admin.CoreV1().ServiceAccounts("default").Create(ctx,
			&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{})
		return err
	}); err != nil {
		return err
	}
	return create("ConfigMap default/kube-root-ca.crt", func() error {
		_, err := cp.Admin.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: "kube-root-ca.crt"},
			Data:       map[string]string{"ca.crt": string(cp.pki.caPEM)},
		}, metav1.CreateOptions{})
		return err
	})
}

// WaitNodeReady polls Node name until its Ready condition is True.
func (cp *ControlPlane) WaitNodeReady(tb testing.TB, name string, timeout time.Duration) *corev1.Node {
	tb.Helper()
	return waitNodeReady(tb, cp.Admin, name, timeout)
}

// waitNodeReady polls Node name through client until its Ready condition is
// True.
func waitNodeReady(tb testing.TB, client kubernetes.Interface, name string, timeout time.Duration) *corev1.Node {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	var last error
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		n, err := client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		cancel()
		if err != nil {
			last = err
		} else {
			last = fmt.Errorf("node %s has no Ready condition", name)
			for _, c := range n.Status.Conditions {
				if c.Type == corev1.NodeReady {
					if c.Status == corev1.ConditionTrue {
						return n
					}
					last = fmt.Errorf("node %s Ready=%s: %s: %s", name, c.Status, c.Reason, c.Message)
				}
			}
		}
		if time.Now().After(deadline) {
			tb.Fatalf("node %s not Ready within %s: %v", name, timeout, last)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// WaitPod polls pod ns/name through the API until cond returns nil, and
// returns it. A pod that does not exist (yet) is passed to cond as nil, so
// that a condition can also wait for a pod to be gone (see PodGone).
func (cp *ControlPlane) WaitPod(tb testing.TB, ns, name string, timeout time.Duration, cond func(*corev1.Pod) error) *corev1.Pod {
	tb.Helper()
	return waitPod(tb, cp.Admin, ns, name, timeout, cond)
}

// waitPod is ControlPlane.WaitPod through client.
func waitPod(tb testing.TB, client kubernetes.Interface, ns, name string, timeout time.Duration, cond func(*corev1.Pod) error) *corev1.Pod {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	var last error
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		p, err := client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		cancel()
		switch {
		case apierrors.IsNotFound(err):
			if last = cond(nil); last == nil {
				return nil
			}
		case err != nil:
			last = err
		default:
			if last = cond(p); last == nil {
				return p
			}
		}
		if time.Now().After(deadline) {
			tb.Fatalf("pod %s/%s: not within %s: %v", ns, name, timeout, last)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// PodRunning is a ControlPlane.WaitPod condition: the pod exists, has an IP,
// and its container name is running and ready.
func PodRunning(name string) func(*corev1.Pod) error {
	return func(p *corev1.Pod) error {
		if p == nil {
			return errors.New("no such pod")
		}
		for _, c := range p.Status.ContainerStatuses {
			if c.Name != name {
				continue
			}
			if c.State.Running == nil || !c.Ready {
				return fmt.Errorf("container %q not running and ready: %+v", name, c.State)
			}
			if p.Status.PodIP == "" {
				return errors.New("no pod IP yet")
			}
			return nil
		}
		return fmt.Errorf("no status for container %q yet (phase %s)", name, p.Status.Phase)
	}
}

// PodGone is a ControlPlane.WaitPod condition: the pod no longer exists.
func PodGone(p *corev1.Pod) error {
	if p != nil {
		return fmt.Errorf("pod still exists (phase %s, deletionTimestamp %v)", p.Status.Phase, p.DeletionTimestamp)
	}
	return nil
}

// EtcdLogTail returns the last n lines of etcd's log.
func (cp *ControlPlane) EtcdLogTail(n int) string { return tailFile(cp.EtcdLogPath, n) }

// APIServerLogTail returns the last n lines of kube-apiserver's log.
func (cp *ControlPlane) APIServerLogTail(n int) string { return tailFile(cp.APIServerLogPath, n) }

func tailFile(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Close stops kube-apiserver, then etcd (SIGTERM, SIGKILL after a grace
// period), kills whatever else has Dir in its command line, and removes Dir
// (tb.Cleanup calls it; it runs once). On a failed test it logs the tails of
// both logs and copies them to $INPLACED_ARTIFACTS.
func (cp *ControlPlane) Close() error {
	cp.closeOnce.Do(func() { cp.closeErr = cp.close() })
	return cp.closeErr
}

func (cp *ControlPlane) close() error {
	if cp.tb.Failed() {
		cp.tb.Logf("kube-apiserver log (last 40 lines):\n%s", cp.APIServerLogTail(40))
		cp.tb.Logf("etcd log (last 20 lines):\n%s", cp.EtcdLogTail(20))
		logs := []string{cp.EtcdLogPath, cp.APIServerLogPath}
		if c := cp.controllers; c != nil {
			logs = append(logs, c.ManagerLog, c.SchedulerLog)
		}
		saveArtifacts(cp.tb, "-controlplane-"+filepath.Base(cp.Dir), logs...)
	}
	cp.mu.Lock()
	apisrv, etcd, controllers := cp.apisrv, cp.etcd, cp.controllers
	cp.mu.Unlock()
	errs := controllers.stop()
	if err := apisrv.stop(syscall.SIGTERM, 20*time.Second); err != nil {
		errs = append(errs, err)
	}
	if err := etcd.stop(syscall.SIGTERM, 10*time.Second); err != nil {
		errs = append(errs, err)
	}
	if err := killProcsOf(cp.Dir, 10*time.Second); err != nil {
		errs = append(errs, err)
	}
	if err := os.RemoveAll(cp.Dir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Leftovers describes what of the control plane is still on the machine:
// processes with Dir in their command line, and Dir. Empty after Close.
func (cp *ControlPlane) Leftovers() []string {
	var out []string
	for _, p := range procsOf(cp.Dir) {
		out = append(out, fmt.Sprintf("process %d: %s", p.pid, p.cmdline))
	}
	if exists(cp.Dir) {
		out = append(out, "dir "+cp.Dir)
	}
	return out
}
