package main

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/inplaced/inplaced/pkg/kube/podapi"
	"github.com/inplaced/inplaced/pkg/kubeclient"
)

// fakeNode plays inplaced on the node against a fake clientset: for every
// pod whose inplaced.io/swap has no status yet, it writes the states of a
// swap as inplaced does (Running, Running with steps, the readiness gate
// False, the end, the gate True) and counts how many pods are unavailable
// at once.
type fakeNode struct {
	t      *testing.T
	client *fake.Clientset
	// outcome is the end state for a pod's swap ("" = Committed);
	// "none" makes the node ignore the pod.
	outcome func(pod string) string
	// stepDelay paces the swap.
	stepDelay time.Duration

	mu      sync.Mutex
	seen    map[string]string // pod → digest handled
	busy    map[string]bool   // swap running or pod not Ready
	maxBusy int
	order   []string // pods in the order their swaps started
}

const testNS = "default"

// fakePods serves the plugin's Client from a fake clientset's pods.
type fakePods struct{ cs *fake.Clientset }

func (f fakePods) Pods(namespace string) kubeclient.PodInterface {
	return f.cs.CoreV1().Pods(namespace)
}

func podsOf(cs *fake.Clientset) Client { return fakePods{cs: cs} }

func newFakeNode(t *testing.T, client *fake.Clientset, outcome func(string) string) *fakeNode {
	n := &fakeNode{t: t, client: client, outcome: outcome, stepDelay: 20 * time.Millisecond,
		seen: map[string]string{}, busy: map[string]bool{}}
	if n.outcome == nil {
		n.outcome = func(string) string { return "" }
	}
	ctx, cancel := context.WithCancel(context.Background())
	w, err := client.CoreV1().Pods(testNS).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-ctx.Done():
				return
			case ev := <-w.ResultChan():
				if p, ok := ev.Object.(*corev1.Pod); ok && (ev.Type == watch.Added || ev.Type == watch.Modified) {
					n.sync(ctx, &wg, p)
				}
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		w.Stop()
		wg.Wait()
	})
	return n
}

func (n *fakeNode) sync(ctx context.Context, wg *sync.WaitGroup, p *corev1.Pod) {
	raw := p.Annotations[podapi.AnnotationSwap]
	if raw == "" {
		return
	}
	d := podapi.Digest(raw)
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.seen[p.Name] == d {
		return
	}
	if st := podapi.Status(p); st != nil && st.RequestDigest == d {
		return
	}
	end := n.outcome(p.Name)
	if end == "none" {
		return
	}
	n.seen[p.Name] = d
	n.order = append(n.order, p.Name)
	wg.Add(1)
	go func() {
		defer wg.Done()
		n.run(ctx, p.Name, d, raw, end)
	}()
}

func (n *fakeNode) setBusy(pod string, b bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.busy[pod] = b
	c := 0
	for _, v := range n.busy {
		if v {
			c++
		}
	}
	n.maxBusy = max(n.maxBusy, c)
}

func (n *fakeNode) run(ctx context.Context, pod, digest, raw, end string) {
	req, err := podapi.ParseSwapRequest(raw)
	if err != nil {
		n.write(ctx, pod, &podapi.SwapStatus{RequestDigest: digest, State: podapi.StateRefused, Error: err.Error()}, "")
		return
	}
	if end == podapi.StateRefused {
		n.write(ctx, pod, &podapi.SwapStatus{RequestDigest: digest, State: podapi.StateRefused, Container: req.Container,
			Error: "container " + req.Container + ": not found"}, "")
		return
	}
	n.setBusy(pod, true)
	defer n.setBusy(pod, false)
	id := "swap-" + pod
	n.write(ctx, pod, &podapi.SwapStatus{RequestDigest: digest, State: podapi.StateRunning, Container: req.Container}, "")
	n.write(ctx, pod, &podapi.SwapStatus{RequestDigest: digest, SwapID: id, State: podapi.StateRunning, Container: req.Container,
		Steps: []podapi.StepStatus{{Name: "pull"}}}, "")
	n.write(ctx, pod, nil, corev1.ConditionFalse)
	n.write(ctx, pod, &podapi.SwapStatus{RequestDigest: digest, SwapID: id, State: podapi.StateRunning, Container: req.Container,
		Steps: []podapi.StepStatus{{Name: "stop"}}}, "")
	st := &podapi.SwapStatus{RequestDigest: digest, SwapID: id, State: podapi.StateCommitted, Container: req.Container,
		From:       &podapi.ConfigStatus{Image: "app:1", Env: []string{"A"}},
		To:         &podapi.ConfigStatus{Image: "app:1", Env: []string{"A"}},
		Steps:      []podapi.StepStatus{{Name: "pull", DurationMs: 3}, {Name: "stop", DurationMs: 40}, {Name: "create", DurationMs: 5}, {Name: "health", DurationMs: 1000}},
		DowntimeMs: 60, Override: true}
	if end != "" {
		st.State, st.Error = end, "health gate: container exited with code 3"
		st.Steps = append(st.Steps, podapi.StepStatus{Name: "rollback", DurationMs: 50})
	}
	n.write(ctx, pod, st, "")
	n.write(ctx, pod, nil, corev1.ConditionTrue)
}

// write sets the status annotation and/or the gate (and Ready with it, as
// kubelet does for a pod with the readiness gate).
func (n *fakeNode) write(ctx context.Context, pod string, st *podapi.SwapStatus, gate corev1.ConditionStatus) {
	select {
	case <-ctx.Done():
		return
	case <-time.After(n.stepDelay):
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	pods := n.client.CoreV1().Pods(testNS)
	p, err := pods.Get(ctx, pod, metav1.GetOptions{})
	if err != nil {
		return
	}
	if st != nil {
		st.UpdatedAt = time.Now().UTC().Format(time.RFC3339Nano)
		b, _ := json.Marshal(st)
		p.Annotations[podapi.AnnotationSwapStatus] = string(b)
	}
	if gate != "" {
		setCond(p, podapi.ConditionInPlaceReady, gate)
		setCond(p, corev1.PodReady, gate)
	}
	if _, err := pods.Update(ctx, p, metav1.UpdateOptions{}); err != nil {
		n.t.Errorf("fake node: update %s: %v", pod, err)
	}
}

func setCond(p *corev1.Pod, typ corev1.PodConditionType, s corev1.ConditionStatus) {
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == typ {
			p.Status.Conditions[i].Status = s
			return
		}
	}
	p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: typ, Status: s})
}

// testPod is a running, Ready pod with the readiness gate.
func testPod(name string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNS, Labels: map[string]string{"app": "web"}, Annotations: map[string]string{}},
		Spec: corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "app", Image: "app:1"}},
			ReadinessGates: []corev1.PodReadinessGate{{ConditionType: podapi.ConditionInPlaceReady}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{
			{Type: corev1.PodReady, Status: corev1.ConditionTrue},
			{Type: podapi.ConditionInPlaceReady, Status: corev1.ConditionTrue},
		}},
	}
}
