package guest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/test/harness"
)

// guestIP is the guest's address on QEMU's user network (run.sh): the
// Node's InternalIP.
const guestIP = "10.0.2.15"

// TestBackend checks that the guest runs the containerd it was booted for
// (INPLACED_BACKEND, "2.4" or "1.6"): the version containerd itself reports
// over CRI, the same through inplaced, and the binary containerd.service runs.
func TestBackend(t *testing.T) {
	backend := os.Getenv("INPLACED_BACKEND")
	harness.Require(t, "INPLACED_BACKEND", backend == "2.4" || backend == "1.6", "run.sh sets it to the containerd the guest was booted for")
	direct, err := harness.DialCRI(t, containerdSocket).Runtime.Version(ctx(t), &runtimeapi.VersionRequest{})
	if err != nil {
		t.Fatalf("Version from containerd: %v", err)
	}
	t.Logf("containerd says: %s %s (CRI %s)", direct.RuntimeName, direct.RuntimeVersion, direct.RuntimeApiVersion)
	if v := strings.TrimPrefix(direct.RuntimeVersion, "v"); direct.RuntimeName != "containerd" || !strings.HasPrefix(v, backend+".") {
		t.Errorf("the running runtime is %s %s, want containerd %s.x", direct.RuntimeName, direct.RuntimeVersion, backend)
	}
	proxied, err := harness.DialCRI(t, proxySocket).Runtime.Version(ctx(t), &runtimeapi.VersionRequest{})
	if err != nil {
		t.Fatalf("Version through inplaced: %v", err)
	}
	if proxied.RuntimeName != direct.RuntimeName || proxied.RuntimeVersion != direct.RuntimeVersion {
		t.Errorf("through inplaced: %s %s, containerd: %s %s", proxied.RuntimeName, proxied.RuntimeVersion, direct.RuntimeName, direct.RuntimeVersion)
	}

	want := map[string]string{"2.4": "/opt/containerd-2.4/bin/containerd", "1.6": "/usr/bin/containerd"}[backend]
	pid := unitProps(t, "containerd", "MainPID")["MainPID"]
	exe, err := os.Readlink("/proc/" + pid + "/exe")
	if err != nil {
		t.Fatalf("containerd.service main PID %s: %v", pid, err)
	}
	out, _ := exec.Command(exe, "--version").CombinedOutput()
	t.Logf("containerd.service runs %s (pid %s): %s", exe, pid, strings.TrimSpace(string(out)))
	if exe != want {
		t.Errorf("containerd.service runs %s, want %s for containerd %s", exe, want, backend)
	}
}

// TestNodeRegistered checks through the API that the guest's kubelet is the
// registered Node "node", Ready, with the guest's address and, through
// inplaced, the runtime of this boot.
func TestNodeRegistered(t *testing.T) {
	cs := kube(t)
	start := time.Now()
	n := waitNodeReady(t, cs, 3*time.Minute)
	i := n.Status.NodeInfo
	t.Logf("Node %s Ready (waited %s): kubelet %s, runtime %s, %s, kernel %s, addresses %v", n.Name,
		time.Since(start).Round(time.Millisecond), i.KubeletVersion, i.ContainerRuntimeVersion, i.OSImage, i.KernelVersion, n.Status.Addresses)
	var internal string
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			internal = a.Address
		}
	}
	if internal != guestIP {
		t.Errorf("Node InternalIP %q, want the guest's %s", internal, guestIP)
	}
	if backend := os.Getenv("INPLACED_BACKEND"); !strings.HasPrefix(strings.TrimPrefix(strings.TrimPrefix(i.ContainerRuntimeVersion, "containerd://"), "v"), backend+".") {
		t.Errorf("Node runtime %q (kubelet asks inplaced, inplaced containerd): want containerd %s", i.ContainerRuntimeVersion, backend)
	}
}

// ---- the API server ----

// kube is an admin client of the API server the host test runs; without its
// kubeconfig the test skips (fails under CI=true).
func kube(t *testing.T) kubernetes.Interface {
	t.Helper()
	cs := kubeIfAny()
	harness.Require(t, "the API server's admin kubeconfig", cs != nil,
		"the host test (test/node) carries it in and run.sh sets INPLACED_KUBECONFIG")
	return cs
}

// nodeReady returns the Node's Ready condition, or an error.
func nodeReady(cs kubernetes.Interface) (*corev1.Node, *corev1.NodeCondition, error) {
	c, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	n, err := cs.CoreV1().Nodes().Get(c, nodeName, metav1.GetOptions{})
	if err != nil {
		return nil, nil, err
	}
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == corev1.NodeReady {
			return n, &n.Status.Conditions[i], nil
		}
	}
	return n, nil, fmt.Errorf("node %s has no Ready condition", nodeName)
}

func waitNodeReady(t *testing.T, cs kubernetes.Interface, timeout time.Duration) *corev1.Node {
	t.Helper()
	var n *corev1.Node
	eventually(t, timeout, "Node "+nodeName+" Ready through the API", func() error {
		var c *corev1.NodeCondition
		var err error
		if n, c, err = nodeReady(cs); err != nil {
			return err
		}
		if c.Status != corev1.ConditionTrue {
			return fmt.Errorf("Ready=%s: %s: %s", c.Status, c.Reason, c.Message)
		}
		return nil
	})
	return n
}

// createPods creates pods through the API, bound to this node (no
// scheduler: spec.nodeName) and without a service-account token. t.Cleanup
// deletes them and waits until kubelet has removed them.
func createPods(t *testing.T, cs kubernetes.Interface, pods ...pod) {
	t.Helper()
	var names []string
	for _, p := range pods {
		var kp corev1.Pod
		if err := json.Unmarshal(p.manifest(), &kp); err != nil {
			t.Fatal(err)
		}
		kp.Spec.NodeName = nodeName
		kp.Spec.AutomountServiceAccountToken = new(bool)
		c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_, err := cs.CoreV1().Pods("default").Create(c, &kp, metav1.CreateOptions{})
		cancel()
		if err != nil {
			t.Fatalf("create pod %s: %v", p.name, err)
		}
		names = append(names, p.name)
	}
	t.Cleanup(func() {
		start := time.Now()
		for _, name := range names {
			c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			err := cs.CoreV1().Pods("default").Delete(c, name, metav1.DeleteOptions{})
			cancel()
			if err != nil && !apierrors.IsNotFound(err) {
				t.Errorf("delete pod %s: %v", name, err)
			}
		}
		for _, name := range names {
			waitAPIPod(t, cs, name, 3*time.Minute, harness.PodGone)
		}
		t.Logf("pods %v deleted in %s", names, time.Since(start).Round(time.Millisecond))
	})
}

// waitAPIPod polls pod default/name through the API until cond (given nil
// for a pod that does not exist) returns nil.
func waitAPIPod(t *testing.T, cs kubernetes.Interface, name string, timeout time.Duration, cond func(*corev1.Pod) error) *corev1.Pod {
	t.Helper()
	var p *corev1.Pod
	eventually(t, timeout, "pod default/"+name+" (API)", func() error {
		c, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		var err error
		p, err = cs.CoreV1().Pods("default").Get(c, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			p = nil
		} else if err != nil {
			return err
		}
		return cond(p)
	})
	return p
}

// apiContainer is the status of the pod's container named container.
func apiContainer(p *corev1.Pod) *corev1.ContainerStatus {
	for i := range p.Status.ContainerStatuses {
		if p.Status.ContainerStatuses[i].Name == container {
			return &p.Status.ContainerStatuses[i]
		}
	}
	return nil
}

// criID is the CRI container ID of "containerd://<id>".
func criID(s *corev1.ContainerStatus) string {
	_, id, _ := strings.Cut(s.ContainerID, "://")
	return id
}

// podCondition is the status of the pod's condition typ ("" if absent).
func podCondition(p *corev1.Pod, typ corev1.PodConditionType) string {
	for _, c := range p.Status.Conditions {
		if c.Type == typ {
			return string(c.Status)
		}
	}
	return ""
}

// leaseRenewed is when kubelet last renewed its node lease.
func leaseRenewed(t *testing.T, cs kubernetes.Interface) time.Time {
	t.Helper()
	c, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	l, err := cs.CoordinationV1().Leases("kube-node-lease").Get(c, nodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("node lease: %v", err)
	}
	if l.Spec.RenewTime == nil {
		return time.Time{}
	}
	return l.Spec.RenewTime.Time
}

// kubeIfAny is kube's client, or nil without a kubeconfig (the test that
// needs it calls kube and skips or fails there).
func kubeIfAny() kubernetes.Interface {
	path := os.Getenv("INPLACED_KUBECONFIG")
	if _, err := os.Stat(path); path == "" || err != nil {
		return nil
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return nil
	}
	cfg.Timeout = 30 * time.Second
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil
	}
	return cs
}
