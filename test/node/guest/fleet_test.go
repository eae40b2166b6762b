package guest

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/inplaced/inplaced/test/harness"
)

// The fleet suite's release, as docs/upgrade.md installs it.
const (
	fleetRelease   = "inplaced"
	fleetNamespace = "kube-system"
	fleetDaemonSet = "inplaced-installer"
	fleetMetrics   = "127.0.0.1:9470"
	fleetRepo      = registryAddr + "/inplaced"
	fleetPods      = 20
	kubeletConfig  = "/etc/kubernetes/kubelet-config.yaml"
	annotationKey  = "inplaced.io/installed"
	criPerSecond   = 50 // each of Version and ListContainers, as test/e2e's restart tests
)

// fleetTags are the image's two versions in $INPLACED_FLEET_DIR/images
// (test/node's fleetTags).
var fleetTags = [2]string{"fleet-v1", "fleet-v2"}

// TestFleet is docs/upgrade.md on a node: kubelet on containerd (run.sh runs
// this suite before it installs inplaced by hand), 20 pods running and a
// client polling one of them; `helm install` of deploy/helm/inplaced with
// the image from the guest's registry, rolled out by the real DaemonSet
// controller and scheduler; `kubectl set image` in place on another pod;
// an upgrade to another tag under a CRI client (Version and ListContainers,
// 50 times a second each, through inplaced's socket) with a swap in
// flight; `kill -9` of inplaced under the same client; `helm uninstall`.
// Each step: no container restarted but the swapped pod's (same IDs, same
// restart counts), no failed request of the polling client; the figures are logged ("fleet:"
// lines) for docs/upgrade.md and docs/reliability.md.
func TestFleet(t *testing.T) {
	f := newFleet(t, kubeadmNode)
	f.run(t, fleetStep{"install", f.install}, fleetStep{"set image", f.setImage}, fleetStep{"upgrade", f.upgrade},
		fleetStep{"kill", f.kill}, fleetStep{"uninstall", f.uninstall})
}

// TestFleetK3s is TestFleet's install, set image and uninstall on a k3s
// agent node: k3s-agent.service on the node's containerd (run.sh starts
// it, joined to a k3s server the host test runs without an agent), the
// chart with kubeletLayout=k3s. The install points k3s at inplaced with a
// file in k3s's config.yaml.d and restarts k3s-agent once; the uninstall
// takes the file away and restarts it once more.
func TestFleetK3s(t *testing.T) {
	f := newFleet(t, k3sAgentNode)
	f.run(t, fleetStep{"install", f.install}, fleetStep{"set image", f.setImage}, fleetStep{"uninstall", f.uninstall})
}

// fleetStep is a step of a fleet suite, a subtest.
type fleetStep struct {
	name string
	run  func(*testing.T)
}

// run starts the pods and the polling client, runs the steps and judges the
// client's requests.
func (f *fleet) run(t *testing.T, steps ...fleetStep) {
	f.startPods()
	f.poll = startPoller("http://"+f.appIP+":8080/version", 200*time.Millisecond)
	// A failed upgrade or kill leaves inplaced installed: the later steps
	// still run and give their figures. Without an install there is
	// nothing to upgrade, kill or remove.
	for _, s := range steps {
		if !t.Run(s.name, s.run) && s.name == "install" {
			break
		}
	}
	samples := f.poll.stop()
	failed := 0
	for _, s := range samples {
		if s.err != "" {
			failed++
			if failed <= 10 {
				t.Errorf("the client polling pod %s: request at %s failed after %s: %s", f.app, s.start.Format("15:04:05.000"), s.took.Round(time.Millisecond), s.err)
			}
		}
	}
	t.Logf("fleet: the client polling pod %s made %d requests through all of it, %d failed, slowest %s",
		f.app, len(samples), failed, slowest(samples).Round(time.Millisecond))
}

// fleetNode is where a node's layout keeps kubelet: what the chart's
// kubeletLayout names.
type fleetNode struct {
	layout string // the chart's kubeletLayout
	unit   string // the unit whose main process runs kubelet
	// endpoint is the CRI endpoint kubelet runs with now.
	endpoint func(t *testing.T) string
	// dropIns are what the install writes for kubelet; the uninstall
	// removes them.
	dropIns []string
}

var (
	kubeadmNode = fleetNode{layout: "kubeadm", unit: "kubelet", endpoint: kubeletEndpoint,
		dropIns: []string{"/etc/systemd/system/kubelet.service.d/10-inplaced.conf"}}
	k3sAgentNode = fleetNode{layout: "k3s", unit: "k3s-agent", endpoint: k3sKubeletEndpoint,
		dropIns: []string{"/etc/rancher/k3s/config.yaml.d/90-inplaced.yaml", "/etc/systemd/system/k3s-agent.service.d/10-inplaced.conf"}}
)

// fleet is the suite's state.
type fleet struct {
	t      *testing.T
	node   fleetNode
	cs     kubernetes.Interface
	dir    string
	helmH  string // helm's home (config, cache, data)
	app    string
	appIP  string
	pods   []string
	before map[string]podState
	poll   *poller
}

// podState is what must not change of a pod: its container's ID and
// restart count.
type podState struct {
	id       string
	restarts int32
}

func newFleet(t *testing.T, node fleetNode) *fleet {
	dir := os.Getenv("INPLACED_FLEET_DIR")
	harness.Require(t, "the fleet payload ($INPLACED_FLEET_DIR: helm, the chart, the images)",
		dir != "" && fileExists(filepath.Join(dir, "helm")), "test/node puts it in the payload; run.sh passes it")
	f := &fleet{t: t, node: node, cs: kube(t), dir: dir, helmH: t.TempDir(), app: "fleet-app"}
	waitNodeReady(t, f.cs, 3*time.Minute)
	if got := node.endpoint(t); got != "unix://"+containerdSocket {
		t.Fatalf("kubelet's endpoint is %q: the fleet suite starts from kubelet on containerd (run.sh)", got)
	}
	for _, tag := range fleetTags {
		start := time.Now()
		if err := pushLayout(filepath.Join(dir, "images", tag), fleetRepo+":"+tag); err != nil {
			t.Fatalf("push %s: %v", tag, err)
		}
		t.Logf("fleet: image %s:%s in the guest's registry in %s", fleetRepo, tag, time.Since(start).Round(time.Millisecond))
	}
	t.Cleanup(f.cleanup)
	return f
}

// startPods creates fleetPods pods through the API, bound to the node: two
// serving HTTP (the one polled, and fleetSwapPod), the others sleeping, and
// waits until all run.
func (f *fleet) startPods() {
	t := f.t
	pods := []pod{{name: f.app, image: imgApp1, readinessHTTP: 8080}, {name: fleetSwapPod, image: imgApp1, readinessHTTP: 8080}}
	for i := 2; i < fleetPods; i++ {
		pods = append(pods, pod{name: fmt.Sprintf("fleet-%02d", i), image: imgBusybox, command: []string{"sleep", "86400"}})
	}
	start := time.Now()
	createPods(t, f.cs, pods...)
	for _, p := range pods {
		f.pods = append(f.pods, p.name)
	}
	for _, name := range f.pods {
		p := waitAPIPod(t, f.cs, name, 8*time.Minute, harness.PodRunning(container))
		if name == f.app {
			f.appIP = p.Status.PodIP
		}
	}
	f.before = f.podStates()
	t.Logf("fleet: %d pods running %s after their creation (kubelet run by %s.service, on containerd)", len(f.pods), time.Since(start).Round(time.Second), f.node.unit)
}

// podStates reads every pod's container ID and restart count.
func (f *fleet) podStates() map[string]podState {
	m := map[string]podState{}
	for _, name := range f.pods {
		p := waitAPIPod(f.t, f.cs, name, time.Minute, harness.PodRunning(container))
		c := apiContainer(p)
		m[name] = podState{id: criID(c), restarts: c.RestartCount}
	}
	return m
}

// samePods fails t unless every pod has the container it had at the start,
// never restarted, and containerd runs it.
func (f *fleet) samePods(t *testing.T, step string) {
	t.Helper()
	now := f.podStates()
	cri := harness.DialCRI(t, containerdSocket)
	changed := 0
	for _, name := range f.pods {
		b, a := f.before[name], now[name]
		if a != b {
			changed++
			t.Errorf("%s: pod %s: container %s restarts %d, was %s restarts %d", step, name, short(a.id), a.restarts, short(b.id), b.restarts)
			continue
		}
		if st := inspect(t, cri, a.id).status; st.State.String() != "CONTAINER_RUNNING" {
			t.Errorf("%s: pod %s: container %s is %s", step, name, short(a.id), st.State)
		}
	}
	t.Logf("fleet: %s: %d of %d containers restarted or replaced (IDs and restart counts compared)", step, changed, len(f.pods))
}

func short(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// install is `helm install`: the DaemonSet's pod installs inplaced and
// points kubelet at it (one kubelet restart).
func (f *fleet) install(t *testing.T) {
	kubeletPID := mainPID(t, f.node.unit)
	_, ready := nodeReadyCondition(t, f.cs)
	start := time.Now()
	f.helm(t, "install", fleetRelease, filepath.Join(f.dir, "chart"), "-n", fleetNamespace,
		"--set", "image.repository="+fleetRepo, "--set", "image.tag="+fleetTags[0], "--set", "kubeletLayout="+f.node.layout,
		"--set", "extraArgs[0]=--metrics-listen="+fleetMetrics)
	f.waitRollout(t, fleetTags[0], 8*time.Minute)
	t.Logf("fleet: helm install → installer Ready (inplaced running, kubelet on it, Node Ready) in %s", time.Since(start).Round(time.Second))
	f.checkInstallerPod(t)
	got := f.node.endpoint(t)
	if got != "unix://"+proxySocket {
		t.Errorf("kubelet's endpoint after the install: %q, want inplaced's", got)
	}
	pid := mainPID(t, f.node.unit)
	if pid == kubeletPID {
		t.Errorf("%s was not restarted (pid %d): its kubelet cannot have read its new endpoint", f.node.unit, pid)
	}
	for _, p := range f.node.dropIns {
		if !fileExists(p) {
			t.Errorf("after the install: %s is not there", p)
		}
	}
	t.Logf("fleet: install: kubelet's endpoint %s (%s restarted: pid %d → %d), written %s", got, f.node.unit, kubeletPID, pid, strings.Join(f.node.dropIns, ", "))
	f.kubeletCallsInMetrics(t)
	f.samePods(t, "install")
	f.nodeStayedReady(t, ready, "install")
}

// judgeUpgradeCalls fails t for every CRI call that failed during the
// upgrade.
func judgeUpgradeCalls(t *testing.T, calls []harness.CRICall) {
	t.Helper()
	for _, c := range calls {
		if c.Err != nil {
			t.Errorf("a CRI call through inplaced failed during the upgrade: %s at %s (took %s): %v",
				c.Method, c.At.Format("15:04:05.000"), c.Took.Round(time.Millisecond), c.Err)
		}
	}
}

// upgrade is `helm upgrade` to the other tag under the CRI client: the new
// pod replaces inplaced's binary and restarts inplaced only.
func (f *fleet) upgrade(t *testing.T) {
	kubeletPID, inplacedPID := mainPID(t, f.node.unit), mainPID(t, "inplaced")
	_, ready := nodeReadyCondition(t, f.cs)
	swap := f.startInflight(t)
	load := harness.StartCRILoad(t, proxySocket, criPerSecond)
	// The same calls straight to containerd, fewer: how slow the runtime
	// itself was meanwhile (logged, not judged: containerd's own).
	direct := harness.StartCRILoad(t, containerdSocket, criPerSecond/10)
	time.Sleep(2 * time.Second)
	start := time.Now()
	f.helm(t, "upgrade", fleetRelease, filepath.Join(f.dir, "chart"), "-n", fleetNamespace, "--reuse-values",
		"--set", "image.tag="+fleetTags[1])
	f.waitRollout(t, fleetTags[1], 8*time.Minute)
	took := time.Since(start)
	time.Sleep(3 * time.Second)
	calls := load.Stop()
	s := harness.Stats(calls, time.Time{}, time.Time{})
	t.Logf("fleet: helm upgrade %s → %s: installer Ready in %s; CRI client: %d calls, %d failed, slowest %s (at %s)",
		fleetTags[0], fleetTags[1], took.Round(time.Second), s.Calls, s.Failed, s.Max.Round(time.Millisecond), s.MaxAt.Format("15:04:05.000"))
	d := harness.Stats(direct.Stop(), time.Time{}, time.Time{})
	t.Logf("fleet: upgrade: the same calls straight to containerd meanwhile: %d, %d failed, slowest %s (at %s)",
		d.Calls, d.Failed, d.Max.Round(time.Millisecond), d.MaxAt.Format("15:04:05.000"))
	judgeUpgradeCalls(t, calls)
	if pid := mainPID(t, "inplaced"); pid == inplacedPID || pid == 0 {
		t.Errorf("inplaced's main pid %d (was %d): the upgrade did not restart it", pid, inplacedPID)
	}
	swap.judge(t, f, restartedAt(t, "inplaced"))
	logRestart(t, start)
	if pid := mainPID(t, f.node.unit); pid != kubeletPID {
		t.Errorf("%s's pid %d, was %d: the upgrade restarted kubelet", f.node.unit, pid, kubeletPID)
	}
	f.samePods(t, "upgrade")
	f.nodeStayedReady(t, ready, "upgrade")
}

// kill is `kill -9` of inplaced under the CRI client: systemd restarts it,
// the socket stays with systemd, calls made meanwhile wait in its backlog.
func (f *fleet) kill(t *testing.T) {
	inplacedPID := mainPID(t, "inplaced")
	restarts := unitProps(t, "inplaced", "NRestarts")["NRestarts"]
	_, ready := nodeReadyCondition(t, f.cs)
	load := harness.StartCRILoad(t, proxySocket, criPerSecond)
	watch := watchNodeReady(f.cs)
	time.Sleep(2 * time.Second)
	killed := time.Now()
	if err := syscall.Kill(inplacedPID, syscall.SIGKILL); err != nil {
		t.Fatalf("kill -9 %d: %v", inplacedPID, err)
	}
	gone := waitDead(inplacedPID)
	t.Logf("fleet: kill -9: the process was gone %s after the signal", gone.Sub(killed).Round(time.Microsecond))
	var back time.Duration
	eventually(t, time.Minute, "inplaced restarted by systemd", func() error {
		if pid := mainPID(t, "inplaced"); pid == 0 || pid == inplacedPID {
			return errNotYet
		}
		if unitProps(t, "inplaced", "ActiveState")["ActiveState"] != "active" {
			return errNotYet
		}
		back = time.Since(killed)
		return nil
	})
	time.Sleep(15 * time.Second) // past the Node's next status update
	calls := load.Stop()
	notReady := watch.stop()
	f.judgeKill(t, calls, gone, back+killed.Sub(gone))
	t.Logf("fleet: kill -9: NRestarts %s → %s", restarts, unitProps(t, "inplaced", "NRestarts")["NRestarts"])
	for _, s := range notReady {
		t.Errorf("the Node was not Ready during the kill: %s", s)
	}
	f.samePods(t, "kill -9")
	f.nodeStayedReady(t, ready, "kill -9")
}

// waitDead returns when process pid has died (a zombie or reaped): its
// connections are closed then. A call sent between the signal and that
// moment went to the dying process.
func waitDead(pid int) time.Time {
	path := "/proc/" + strconv.Itoa(pid) + "/stat"
	for {
		b, err := os.ReadFile(path)
		if _, rest, ok := strings.Cut(string(b), ") "); err != nil || (ok && strings.HasPrefix(rest, "Z")) {
			return time.Now()
		}
		time.Sleep(200 * time.Microsecond)
	}
}

// judgeKill fails t for a failed call made after the client saw the crash:
// when its connection to the killed process closed, which fails every call
// sent on it at once. That is the earliest end of a failed call, if it
// comes within crashSeen of the process's death (died); a call sent on the
// connection before it closed went to the dying process and is counted
// apart. back is from the death to inplaced active again.
func (f *fleet) judgeKill(t *testing.T, calls []harness.CRICall, died time.Time, back time.Duration) {
	closed := died
	for _, c := range calls {
		if end := c.At.Add(c.Took); c.Err != nil && end.After(died) && end.Before(died.Add(crashSeen)) && (closed.Equal(died) || end.Before(closed)) {
			closed = end
		}
	}
	var cut, after, failedAfter int
	var wait time.Duration
	for _, c := range calls {
		if c.At.Before(closed) {
			if c.Err != nil {
				cut++
				t.Logf("fleet: kill -9: a call sent on the connection to the dying process failed: %s at %s (%s after the death), took %s: %v",
					c.Method, c.At.Format("15:04:05.000"), c.At.Sub(died).Round(time.Millisecond), c.Took.Round(time.Millisecond), c.Err)
			}
			continue
		}
		after++
		wait = max(wait, c.Took)
		if c.Err != nil {
			failedAfter++
			if failedAfter <= 10 {
				t.Errorf("kill -9: a CRI call made %s after the client's connection to the killed inplaced closed failed (took %s): %s: %v",
					c.At.Sub(closed).Round(time.Millisecond), c.Took.Round(time.Millisecond), c.Method, c.Err)
			}
		}
	}
	t.Logf("fleet: kill -9: the client's connection closed %s after the death; inplaced active again %s after the death; %d calls made after the connection closed, %d failed, the longest waited %s; %d calls sent to the dying process failed with it (of %d calls in all)",
		closed.Sub(died).Round(time.Millisecond), back.Round(time.Millisecond), after, failedAfter, wait.Round(time.Millisecond), cut, len(calls))
}

// crashSeen bounds how long after inplaced's death its callers' connection
// may take to close (the client reads the reset): beyond it a failed call is
// not the crash's.
const crashSeen = time.Second

// uninstall is `helm uninstall`: its pre-delete hook rolls the DaemonSet
// into uninstall; kubelet goes back to containerd and nothing of inplaced is
// left on the host.
func (f *fleet) uninstall(t *testing.T) {
	kubeletPID := mainPID(t, f.node.unit)
	_, ready := nodeReadyCondition(t, f.cs)
	start := time.Now()
	f.helm(t, "uninstall", fleetRelease, "-n", fleetNamespace, "--timeout", "10m")
	t.Logf("fleet: helm uninstall (its hook: every node uninstalled) in %s", time.Since(start).Round(time.Second))
	got := f.node.endpoint(t)
	if got != "unix://"+containerdSocket {
		t.Errorf("kubelet's endpoint after the uninstall: %q, want containerd's", got)
	}
	pid := mainPID(t, f.node.unit)
	if pid == kubeletPID {
		t.Errorf("%s was not restarted (pid %d) after kubelet's endpoint went back", f.node.unit, pid)
	}
	t.Logf("fleet: uninstall: kubelet's endpoint %s (%s restarted: pid %d → %d)", got, f.node.unit, kubeletPID, pid)
	waitNodeReady(t, f.cs, 3*time.Minute)
	f.podsGone(t)
	f.nothingLeft(t)
	f.samePods(t, "uninstall")
	f.nodeStayedReady(t, ready, "uninstall")
}

// nothingLeft fails t for anything of inplaced still on the host or the
// Node.
func (f *fleet) nothingLeft(t *testing.T) {
	var left []string
	for _, p := range append([]string{"/usr/local/bin/inplaced", "/usr/local/bin/inplacectl", "/etc/systemd/system/inplaced.service",
		"/etc/systemd/system/inplaced.socket", "/etc/systemd/system/inplaced.service.d",
		"/etc/systemd/system/multi-user.target.wants/inplaced.service", "/etc/systemd/system/sockets.target.wants/inplaced.socket",
		"/etc/inplaced", "/var/lib/inplaced", "/run/inplaced", proxySocket}, f.node.dropIns...) {
		if _, err := os.Lstat(p); err == nil {
			left = append(left, p)
		}
	}
	for _, u := range []string{"inplaced.service", "inplaced.socket"} {
		if p := unitProps(t, u, "LoadState", "ActiveState"); p["LoadState"] != "not-found" || p["ActiveState"] != "inactive" {
			left = append(left, fmt.Sprintf("unit %s: %v", u, p))
		}
	}
	left = append(left, holdTables(t)...)
	if n, err := f.cs.CoreV1().Nodes().Get(ctx(t), nodeName, metav1.GetOptions{}); err != nil {
		t.Errorf("Node: %v", err)
	} else if v, ok := n.Annotations[annotationKey]; ok {
		left = append(left, "Node annotation "+annotationKey+"="+v)
	}
	if _, err := f.cs.AppsV1().DaemonSets(fleetNamespace).Get(ctx(t), fleetDaemonSet, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		left = append(left, fmt.Sprintf("DaemonSet %s: %v", fleetDaemonSet, err))
	}
	for _, l := range left {
		t.Errorf("left after helm uninstall: %s", l)
	}
	t.Logf("fleet: after helm uninstall: %d things of inplaced left (binaries, units, socket, drop-ins, config, state, hold tables, annotation, DaemonSet)", len(left))
}

// waitRollout waits until the DaemonSet's current template is Ready on the
// node and the Node's annotation names version.
func (f *fleet) waitRollout(t *testing.T, version string, timeout time.Duration) {
	t.Helper()
	var last string
	deadline := time.Now().Add(timeout)
	for {
		done, why := f.rolledOut(t, version)
		if done {
			return
		}
		if why != last {
			t.Logf("rollout of %s: %s", version, why)
			last = why
		}
		if time.Now().After(deadline) {
			f.installerLogs(t)
			t.Fatalf("rollout of %s: not within %s: %s", version, timeout, why)
		}
		time.Sleep(time.Second)
	}
}

func (f *fleet) rolledOut(t *testing.T, version string) (bool, string) {
	ds, err := f.cs.AppsV1().DaemonSets(fleetNamespace).Get(ctx(t), fleetDaemonSet, metav1.GetOptions{})
	if err != nil {
		return false, err.Error()
	}
	if st := ds.Status; st.ObservedGeneration < ds.Generation || st.DesiredNumberScheduled != 1 ||
		st.UpdatedNumberScheduled != 1 || st.NumberReady != 1 || st.NumberAvailable != 1 {
		return false, fmt.Sprintf("generation %d observed %d, desired %d, updated %d, ready %d, available %d",
			ds.Generation, st.ObservedGeneration, st.DesiredNumberScheduled, st.UpdatedNumberScheduled, st.NumberReady, st.NumberAvailable)
	}
	n, err := f.cs.CoreV1().Nodes().Get(ctx(t), nodeName, metav1.GetOptions{})
	if err != nil {
		return false, err.Error()
	}
	var a struct {
		Version string `json:"version"`
	}
	_ = json.Unmarshal([]byte(n.Annotations[annotationKey]), &a)
	if a.Version != version {
		return false, fmt.Sprintf("DaemonSet ready, Node annotation %q", n.Annotations[annotationKey])
	}
	return true, ""
}

// checkInstallerPod logs who made and placed the installer's pod: the
// DaemonSet controller and the scheduler, not the test.
func (f *fleet) checkInstallerPod(t *testing.T) {
	l, err := f.cs.CoreV1().Pods(fleetNamespace).List(ctx(t), metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=" + fleetDaemonSet})
	if err != nil || len(l.Items) != 1 {
		t.Fatalf("the installer's pods: %v (%d)", err, len(l.Items))
	}
	p := l.Items[0]
	owner := metav1.GetControllerOf(&p)
	if owner == nil || owner.Kind != "DaemonSet" || p.Spec.NodeName != nodeName {
		t.Errorf("installer pod %s: controller %v, node %q: want the DaemonSet's, on %s", p.Name, owner, p.Spec.NodeName, nodeName)
	}
	var scheduled string
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled {
			scheduled = string(c.Status)
		}
	}
	t.Logf("fleet: installer pod %s made by %s %s, PodScheduled=%s on %s", p.Name, owner.Kind, owner.Name, scheduled, p.Spec.NodeName)
}

// podsGone waits until the installer's and the uninstall hook's pods are
// gone: the garbage collector deletes them with their DaemonSet and Job,
// and kubelet stops them.
func (f *fleet) podsGone(t *testing.T) {
	start := time.Now()
	eventually(t, 3*time.Minute, "the installer's and the hook's pods gone", func() error {
		l, err := f.cs.CoreV1().Pods(fleetNamespace).List(ctx(t), metav1.ListOptions{
			LabelSelector: "app.kubernetes.io/name in (" + fleetDaemonSet + ",inplaced-uninstall)"})
		if err != nil {
			return err
		}
		if len(l.Items) > 0 {
			return fmt.Errorf("%d pods left, e.g. %s", len(l.Items), l.Items[0].Name)
		}
		return nil
	})
	t.Logf("fleet: uninstall: the installer's and the hook's pods gone %s after helm uninstall returned", time.Since(start).Round(time.Second))
}
