package harness

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestControlPlaneKubelet brings up the Kubernetes-mode test bed — etcd,
// kube-apiserver, a kubelet registered as a Node with node credentials,
// directly on a private containerd — runs a pod bound by spec.nodeName,
// survives an API server restart, deletes the pod, and checks that the
// teardown leaves nothing behind.
func TestControlPlaneKubelet(t *testing.T) {
	KubeletPrerequisites(t)
	ControlPlanePrerequisites(t)
	RequireTool(t, "crictl", CrictlPath())
	start := time.Now()
	reg := StartRegistry(t)
	c := StartContainerd(t, BackendsFromEnv()[0], reg)
	cpStart := time.Now()
	cp := StartControlPlane(t)
	cpUp := time.Since(cpStart)
	kStart := time.Now()
	k := cp.StartKubelet(t, KubeletOptions{RuntimeEndpoint: c.Endpoint, SyncFrequency: 3 * time.Second})
	node := cp.WaitNodeReady(t, k.NodeName, time.Minute)
	nodeUp := time.Since(kStart)
	if v := node.Status.NodeInfo.KubeletVersion; v != KubeletVersion {
		t.Errorf("node %s reports kubelet %s, want %s", node.Name, v, KubeletVersion)
	}
	sv, err := cp.Admin.Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	if sv.GitVersion != KubeAPIServerVersion {
		t.Errorf("API server version %s, want %s", sv.GitVersion, KubeAPIServerVersion)
	}
	t.Logf("control plane up in %s; node %s Ready %s after kubelet start (addresses %v)",
		cpUp.Round(time.Millisecond), k.NodeName, nodeUp.Round(time.Millisecond), node.Status.Addresses)

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pods := cp.Admin.CoreV1().Pods("default")
	podStart := time.Now()
	if _, err := pods.Create(ctx, apiPod("app", k.NodeName, c.Images.App1), metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod: %v", err)
	}
	p := cp.WaitPod(t, "default", "app", 90*time.Second, PodRunning("app"))
	podUp := time.Since(podStart)
	_, subnet, _ := net.ParseCIDR(c.Subnet)
	if ip := net.ParseIP(p.Status.PodIP); ip == nil || !subnet.Contains(ip) {
		t.Errorf("pod IP %q not in %s", p.Status.PodIP, c.Subnet)
	}
	if got := httpGetEventually(t, fmt.Sprintf("http://%s/version", net.JoinHostPort(p.Status.PodIP, fmt.Sprint(AppPort)))); got != "v1" {
		t.Errorf("GET /version of the pod = %q, want v1", got)
	}
	t.Logf("pod %s running with IP %s %s after create", p.UID, p.Status.PodIP, podUp.Round(time.Millisecond))

	// The API server goes away while kubelet runs, and comes back on the
	// same port with the same data.
	// Node authorizer + NodeRestriction allowed everything this kubelet did
	// with its node credentials.
	refusedBefore := k.LogGrep("forbidden", "Forbidden")
	for _, l := range refusedBefore {
		t.Errorf("kubelet was refused something with its node credentials: %s", l)
	}
	ctrID := p.Status.ContainerStatuses[0].ContainerID
	stop := time.Now()
	if err := cp.StopAPIServer(); err != nil {
		t.Fatalf("stop kube-apiserver: %v", err)
	}
	t.Logf("kube-apiserver stopped in %s", time.Since(stop).Round(time.Millisecond))
	if _, err := pods.Get(ctx, "app", metav1.GetOptions{}); err == nil {
		t.Fatal("the API answers with kube-apiserver stopped")
	}
	time.Sleep(2 * time.Second)
	cri := c.CRI(t)
	if l, err := cri.Runtime.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{
		State:         &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_RUNNING},
		LabelSelector: map[string]string{"io.kubernetes.pod.uid": string(p.UID)}}}); err != nil || len(l.Containers) != 1 {
		t.Errorf("with the API server down: running containers of the pod %v, %v", l, err)
	}
	restart := time.Now()
	if err := cp.StartAPIServer(); err != nil {
		t.Fatalf("restart kube-apiserver: %v\n%s", err, cp.APIServerLogTail(40))
	}
	t.Logf("kube-apiserver back in %s", time.Since(restart).Round(time.Millisecond))
	cp.WaitNodeReady(t, k.NodeName, 30*time.Second)
	p = cp.WaitPod(t, "default", "app", 30*time.Second, PodRunning("app"))
	if id := p.Status.ContainerStatuses[0].ContainerID; id != ctrID {
		t.Errorf("container changed across the API server restart: %s -> %s", ctrID, id)
	}

	// Deleted through the API: kubelet stops it and makes the final delete.
	delStart := time.Now()
	if err := pods.Delete(ctx, "app", metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete pod: %v", err)
	}
	cp.WaitPod(t, "default", "app", time.Minute, PodGone)
	t.Logf("pod deleted in %s", time.Since(delStart).Round(time.Millisecond))
	if l, err := cri.Runtime.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{
		State: &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_RUNNING}}}); err != nil || len(l.Containers) != 0 {
		t.Errorf("after the delete: running containers %v, %v", l, err)
	}

	// A second pod is left running: the teardown removes it.
	if _, err := pods.Create(ctx, apiPod("left", k.NodeName, c.Images.App1), metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod: %v", err)
	}
	cp.WaitPod(t, "default", "left", 90*time.Second, PodRunning("app"))

	// After the restart, the Node authorizer builds its graph of
	// node-to-object relationships from informers, after /readyz: a
	// kubelet request in that window is refused with "no relationship
	// found", and kubelet retries. Anything else is a real refusal.
	var warmup []string
	for _, l := range k.LogGrep("forbidden", "Forbidden")[len(refusedBefore):] {
		if strings.Contains(l, "no relationship found") {
			warmup = append(warmup, l)
			continue
		}
		t.Errorf("kubelet was refused something with its node credentials: %s", l)
	}
	if len(warmup) > 0 {
		t.Logf("right after the API server restart, kubelet was refused %d times while the Node authorizer's graph filled, first: %s", len(warmup), warmup[0])
	}
	if err := k.Close(); err != nil {
		t.Errorf("kubelet close: %v", err)
	}
	if l := k.Leftovers(); len(l) > 0 {
		t.Errorf("kubelet left behind:\n%s", strings.Join(l, "\n"))
	}
	if sb, err := cri.Runtime.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{}); err != nil || len(sb.Items) != 0 {
		t.Errorf("after kubelet close: sandboxes %v, %v", sb, err)
	}
	if err := cp.Close(); err != nil {
		t.Errorf("control plane close: %v", err)
	}
	if l := cp.Leftovers(); len(l) > 0 {
		t.Errorf("control plane left behind:\n%s", strings.Join(l, "\n"))
	}
	if err := c.Close(); err != nil {
		t.Errorf("containerd close: %v", err)
	}
	if l := c.Leftovers(); len(l) > 0 {
		t.Errorf("containerd left behind:\n%s", strings.Join(l, "\n"))
	}
	t.Logf("TestControlPlaneKubelet on %s took %s", c.Backend, time.Since(start).Round(time.Millisecond))
}

// apiPod is a one-container pod bound to node, with no service-account token.
func apiPod(name, node, image string) *corev1.Pod {
	no := false
	grace := int64(2)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: map[string]string{"app": name}},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			AutomountServiceAccountToken:  &no,
			EnableServiceLinks:            &no,
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{
				Name: "app", Image: image, ImagePullPolicy: corev1.PullIfNotPresent,
			}},
		},
	}
}

// httpGetEventually GETs url until it answers (10 s at most) and returns the body.
func httpGetEventually(t *testing.T, url string) string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		body, err := httpGetBody(url)
		if err == nil {
			return strings.TrimSpace(string(body))
		}
		if time.Now().After(deadline) {
			t.Errorf("GET %s: %v", url, err)
			return ""
		}
		time.Sleep(200 * time.Millisecond)
	}
}
