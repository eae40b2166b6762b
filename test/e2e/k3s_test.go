package e2e

import (
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
	"github.com/inplaced/inplaced/test/harness"
)

// TestK3s: a k3s server node and a k3s agent node (k3s built from the module
// proxy, its embedded containerd off), each with its own inplaced in front
// of its own containerd, set up as docs/k3s.md says (deploy/k3s) and
// started from a clean state in its order — containerd, inplaced, k3s:
// both Nodes become Ready with nothing restarted by hand; `kubectl set
// image` on a pod of each node goes in place; restarting the k3s agent
// keeps the swapped container, and the next image change on that node goes
// in place too.
func TestK3s(t *testing.T) {
	harness.K3sPrerequisites(t)
	// What the k3s recipe was run on; containerd 2.4 is not needed for it.
	backend := harness.Containerd16
	if os.Getenv("INPLACED_BACKENDS") != "" && !slices.Contains(harness.BackendsFromEnv(), backend) {
		t.Skipf("k3s runs on %s here; INPLACED_BACKENDS=%s leaves it out", backend, os.Getenv("INPLACED_BACKENDS"))
	}
	start := time.Now()
	reg := harness.StartRegistry(t)
	var nodes []*harness.K3sNode
	// Registered first, so it runs last: after every node, inplaced and
	// containerd cleanup.
	t.Cleanup(func() {
		for _, n := range nodes {
			if l := append(n.Leftovers(), n.Containerd.Leftovers()...); len(l) > 0 {
				t.Errorf("k3s node %s left behind: %v", n.Name, l)
			}
		}
	})
	srv := harness.StartK3sServer(t, backend, reg)
	nodes = append(nodes, srv.K3sNode)
	agent := srv.StartAgent(t, backend, reg)
	nodes = append(nodes, agent)
	type pids struct{ k3s, inplaced int }
	first := map[string]pids{}
	for _, n := range nodes {
		first[n.Name] = pids{n.PID(), n.Inplaced.PID()}
	}
	for _, n := range nodes {
		srv.WaitNodeReady(t, n.Name, 2*time.Minute)
	}
	t.Logf("both nodes Ready %s after the server's containerd started", time.Since(start).Round(time.Millisecond))
	for _, n := range nodes {
		// inplaced found the kubeconfig k3s wrote after it: Kubernetes mode
		// on, with no restart of inplaced or k3s.
		eventually(t, 30*time.Second, n.Name+": inplaced's Kubernetes mode on", func() error {
			if st := k3sStatus(t, n); st.Kubernetes != "on" || len(st.Problems) != 0 {
				return fmt.Errorf("status %v", st)
			}
			return nil
		})
		if now := (pids{n.PID(), n.Inplaced.PID()}); now != first[n.Name] {
			t.Errorf("%s: k3s and inplaced pids %v at start, %v now: something restarted", n.Name, first[n.Name], now)
		}
	}

	swapped := map[string]string{}
	for _, n := range nodes {
		role := "agent"
		if n.Server {
			role = "server"
		}
		t.Run("set image in place on the "+role, func(t *testing.T) {
			pod := "web-" + role
			k3sCreatePod(t, srv, n, pod)
			swapped[n.Name] = k3sSetImageInPlace(t, srv, n, pod, n.Containerd.Images.App2, 1)
		})
	}
	t.Run("agent restart keeps the swapped container", func(t *testing.T) {
		id := swapped[agent.Name]
		if id == "" {
			t.Skip("no swap on the agent to keep")
		}
		restarted := time.Now()
		if err := agent.Restart(); err != nil {
			t.Fatalf("restart k3s agent: %v", err)
		}
		// Its kubelet is back once it renews the node's lease.
		eventually(t, 2*time.Minute, "the agent's kubelet renews its lease", func() error {
			l, err := srv.Admin.CoordinationV1().Leases("kube-node-lease").Get(ctx(t), agent.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if l.Spec.RenewTime == nil || l.Spec.RenewTime.Before(&metav1.MicroTime{Time: restarted}) {
				return fmt.Errorf("lease renewed at %v", l.Spec.RenewTime)
			}
			return nil
		})
		back := time.Since(restarted)
		// Three of its sync periods (5 s) with the pod.
		time.Sleep(3 * 5 * time.Second)
		p := srv.WaitPod(t, "default", "web-agent", time.Minute, podReady)
		s := appStatus(p)
		if criID(s) != id || s.RestartCount != 1 || s.State.Running == nil {
			t.Errorf("after the agent restart: app %s, restartCount %d, running %v; want %s, 1, running",
				short(criID(s)), s.RestartCount, s.State.Running != nil, short(id))
		}
		if running := k3sRunningApps(t, agent, p.UID); !slices.Equal(running, []string{id}) {
			t.Errorf("running app containers of the pod after the agent restart: %v, want [%s]", running, short(id))
		}
		t.Logf("k3s agent back %s after its restart; %s still runs the swapped container %s, restartCount 1",
			back.Round(time.Millisecond), p.Name, short(id))
		// inplaced's pod watch goes through the agent's load balancer,
		// which the restart took down: the next change is in place too.
		k3sSetImageInPlace(t, srv, agent, "web-agent", agent.Containerd.Images.App1, 2)
	})

	for _, n := range nodes {
		if (&kenv{env: &env{px: n.Inplaced}}).pxLogCount(t, 0, "panic:") > 0 {
			t.Errorf("inplaced of %s panicked:\n%s", n.Name, n.Inplaced.LogTail(40))
		}
	}
	t.Logf("TestK3s took %s", time.Since(start).Round(time.Millisecond))
}

// k3sStatus is `inplacectl status` of the node's inplaced.
func k3sStatus(t *testing.T, n *harness.K3sNode) *inplacedv1.StatusResponse {
	t.Helper()
	return (&kenv{env: &env{px: n.Inplaced}}).status(t)
}

// k3sCreatePod creates a bare pod on node n running App1 and waits until it
// is Ready.
func k3sCreatePod(t *testing.T, srv *harness.K3sServer, n *harness.K3sNode, name string) {
	t.Helper()
	no := false
	grace := int64(5)
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PodSpec{
			NodeName: n.Name, AutomountServiceAccountToken: &no, TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{Name: "app", Image: n.Containerd.Images.App1, ImagePullPolicy: corev1.PullIfNotPresent}},
		},
	}
	// The default ServiceAccount comes from k3s's controller-manager, a
	// moment after the API server.
	eventually(t, time.Minute, "create pod "+name, func() error {
		_, err := srv.Admin.CoreV1().Pods("default").Create(ctx(t), p, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return nil
		}
		return err
	})
	srv.WaitPod(t, "default", name, 2*time.Minute, podReady)
}

// k3sSetImageInPlace patches the image of pod's app container (as `kubectl
// set image` does) and checks it went in place: same pod UID, IP and
// sandbox, a new container running image with restartCount restarts, and
// inplaced's record of it committed. It returns the new container's ID.
func k3sSetImageInPlace(t *testing.T, srv *harness.K3sServer, n *harness.K3sNode, pod, image string, restarts int32) string {
	t.Helper()
	before := srv.WaitPod(t, "default", pod, time.Minute, podReady)
	oldID := criID(appStatus(before))
	sandbox := k3sSandbox(t, n, before.UID)
	patch := fmt.Sprintf(`{"spec":{"containers":[{"name":"app","image":%q}]}}`, image)
	patched := time.Now()
	if _, err := srv.Admin.CoreV1().Pods("default").Patch(ctx(t), pod, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatalf("patch %s image %s: %v", pod, image, err)
	}
	after := srv.WaitPod(t, "default", pod, 2*time.Minute, func(p *corev1.Pod) error {
		s := appStatus(p)
		if s == nil || criID(s) == oldID || s.RestartCount != restarts || s.State.Running == nil || !s.Ready || s.Image != image {
			return fmt.Errorf("want %s, restartCount %d, running, ready; app status %+v", image, restarts, s)
		}
		return podReady(p)
	})
	took := time.Since(patched)
	newID := criID(appStatus(after))
	if after.UID != before.UID || after.Status.PodIP != before.Status.PodIP {
		t.Errorf("%s changed: UID %s→%s, IP %s→%s", pod, before.UID, after.UID, before.Status.PodIP, after.Status.PodIP)
	}
	if now := k3sSandbox(t, n, after.UID); now != sandbox {
		t.Errorf("%s: sandbox %s→%s", pod, short(sandbox), short(now))
	}
	km := &kmenv{kenv: &kenv{env: &env{px: n.Inplaced}}}
	var rec *inplacedv1.SwapRecord
	for _, r := range km.kubeletSwaps(t, pod) {
		if r.OldContainerId == oldID {
			rec = r
		}
	}
	if rec == nil || rec.State != inplacedv1.SwapState_SWAP_STATE_COMMITTED || rec.NewContainerId != newID || rec.SandboxId != sandbox {
		t.Fatalf("%s on %s: inplaced's kubelet-driven swap from %s: %v, want committed to %s in sandbox %s",
			pod, n.Name, short(oldID), rec, short(newID), short(sandbox))
	}
	t.Logf("%s on %s: %s → %s in place in %s (status Ready on the new image), downtime %s, same UID, IP %s and sandbox %s",
		pod, n.Name, short(oldID), short(newID), took.Round(time.Millisecond),
		time.Duration(rec.DowntimeNs).Round(time.Millisecond), after.Status.PodIP, short(sandbox))
	return newID
}

// k3sSandbox is the ID of the one ready sandbox of pod uid in n's
// containerd.
func k3sSandbox(t *testing.T, n *harness.K3sNode, uid types.UID) string {
	t.Helper()
	cri := harness.DialCRI(t, n.Containerd.Endpoint)
	resp, err := cri.Runtime.ListPodSandbox(ctx(t), &runtimeapi.ListPodSandboxRequest{Filter: &runtimeapi.PodSandboxFilter{
		State:         &runtimeapi.PodSandboxStateValue{State: runtimeapi.PodSandboxState_SANDBOX_READY},
		LabelSelector: map[string]string{"io.kubernetes.pod.uid": string(uid)},
	}})
	if err != nil {
		t.Fatalf("list sandboxes of pod %s: %v", uid, err)
	}
	if len(resp.Items) != 1 {
		t.Fatalf("pod %s has %d ready sandboxes, want 1", uid, len(resp.Items))
	}
	return resp.Items[0].Id
}

// k3sRunningApps are the IDs of the running app containers of pod uid in
// n's containerd.
func k3sRunningApps(t *testing.T, n *harness.K3sNode, uid types.UID) []string {
	t.Helper()
	cri := harness.DialCRI(t, n.Containerd.Endpoint)
	resp, err := cri.Runtime.ListContainers(ctx(t), &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{
		State:         &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_RUNNING},
		LabelSelector: map[string]string{"io.kubernetes.pod.uid": string(uid), "io.kubernetes.container.name": "app"},
	}})
	if err != nil {
		t.Fatalf("list containers of pod %s: %v", uid, err)
	}
	var out []string
	for _, c := range resp.Containers {
		out = append(out, c.Id)
	}
	return out
}
