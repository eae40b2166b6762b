package main

import (
	"bytes"
	"context"
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/inplaced/inplaced/pkg/kube/podapi"
)

func TestOrdinal(t *testing.T) {
	for name, want := range map[string]int{"web-0": 0, "web-12": 12, "kafka-broker-3": 3, "web": -1, "web-": -1,
		"-1": -1, "web-01": -1, "web-x1": -1, "web-abc12": -1, "web-7f9c4-x2b9z": -1} {
		if got := ordinal(name); got != want {
			t.Errorf("ordinal(%q) = %d, want %d", name, got, want)
		}
	}
}

func TestWalkOrder(t *testing.T) {
	var pods []corev1.Pod
	for _, n := range []string{"web-1", "web-10", "web-2", "web-0", "alpha", "zulu"} {
		pods = append(pods, *testPod(n))
	}
	var got []string
	for _, r := range walkOrder(pods) {
		got = append(got, r.Pod)
	}
	if want := []string{"web-10", "web-2", "web-1", "web-0", "zulu", "alpha"}; !reflect.DeepEqual(got, want) {
		t.Errorf("order %v, want %v", got, want)
	}
}

func pods(names ...string) []runtime.Object {
	var objs []runtime.Object
	for _, n := range names {
		objs = append(objs, testPod(n))
	}
	return objs
}

// Highest ordinal first, one at a time, below the partition untouched, and
// the first failure halts the walk leaving the next pod untouched.
func TestSwapSelectedHalts(t *testing.T) {
	client := fake.NewClientset(pods("web-0", "web-1", "web-2", "web-3", "web-4")...)
	node := newFakeNode(t, client, func(p string) string {
		if p == "web-2" {
			return podapi.StateRolledBack
		}
		return ""
	})
	var out bytes.Buffer
	results, err := SwapSelected(context.Background(), podsOf(client), &SwapOptions{Namespace: testNS, Selector: "app=web",
		Container: "app", Env: []string{"A=2"}, MaxUnavailable: 1, Partition: 1, Timeout: 10 * time.Second, Out: &out})
	t.Logf("output:\n%s", out.String())
	if err == nil || !strings.Contains(err.Error(), "halted") || !strings.Contains(err.Error(), "web-2") {
		t.Fatalf("err %v, want a halt at web-2", err)
	}
	want := map[string]string{"web-4": OutcomeCommitted, "web-3": OutcomeCommitted, "web-2": OutcomeFailed,
		"web-1": OutcomeNotStarted, "web-0": OutcomePartition}
	var order []string
	for _, r := range results {
		order = append(order, r.Pod)
		if r.Outcome != want[r.Pod] {
			t.Errorf("%s: %s, want %s", r.Pod, r.Outcome, want[r.Pod])
		}
	}
	if !reflect.DeepEqual(order, []string{"web-4", "web-3", "web-2", "web-1", "web-0"}) {
		t.Errorf("walk order %v", order)
	}
	node.mu.Lock()
	started, maxBusy := append([]string(nil), node.order...), node.maxBusy
	node.mu.Unlock()
	if !reflect.DeepEqual(started, []string{"web-4", "web-3", "web-2"}) {
		t.Errorf("swaps started on %v", started)
	}
	if maxBusy != 1 {
		t.Errorf("%d pods unavailable at once, want 1", maxBusy)
	}
	for _, p := range []string{"web-1", "web-0"} {
		q, _ := client.CoreV1().Pods(testNS).Get(context.Background(), p, metav1.GetOptions{})
		if q.Annotations[podapi.AnnotationSwap] != "" {
			t.Errorf("%s got a request", p)
		}
	}
	text := out.String()
	for _, w := range []string{"web-2  2        RolledBack", "health gate: container exited with code 3",
		"2 committed, 1 failed, 1 below partition, 1 not started"} {
		if !strings.Contains(text, w) {
			t.Errorf("summary lacks %q", w)
		}
	}
}

// --max-unavailable 2 runs two at a time, never three.
func TestSwapSelectedParallel(t *testing.T) {
	client := fake.NewClientset(pods("a", "b", "c", "d", "e")...)
	node := newFakeNode(t, client, nil)
	node.stepDelay = 60 * time.Millisecond
	results, err := SwapSelected(context.Background(), podsOf(client), &SwapOptions{Namespace: testNS, Selector: "app=web",
		Container: "app", Image: "app:2", MaxUnavailable: 2, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range results {
		if r.Outcome != OutcomeCommitted {
			t.Errorf("%s: %s", r.Pod, r.Outcome)
		}
	}
	node.mu.Lock()
	defer node.mu.Unlock()
	if node.maxBusy != 2 {
		t.Errorf("%d pods unavailable at once, want 2", node.maxBusy)
	}
	if first := strings.Join(node.order[:2], ","); first != "e,d" && first != "d,e" {
		t.Errorf("started in order %v", node.order)
	}
}

// A selected pod that is not Ready counts against --max-unavailable: with
// one allowed, nothing starts until it is Ready.
func TestSwapSelectedWaitsForUnavailable(t *testing.T) {
	objs := pods("web-0", "web-1")
	sick := objs[0].(*corev1.Pod)
	setCond(sick, corev1.PodReady, corev1.ConditionFalse)
	client := fake.NewClientset(objs...)
	node := newFakeNode(t, client, nil)
	availabilityPoll = 20 * time.Millisecond
	go func() {
		time.Sleep(400 * time.Millisecond)
		p, _ := client.CoreV1().Pods(testNS).Get(context.Background(), "web-0", metav1.GetOptions{})
		node.mu.Lock()
		node.order = append(node.order, "web-0 Ready")
		node.mu.Unlock()
		setCond(p, corev1.PodReady, corev1.ConditionTrue)
		_, _ = client.CoreV1().Pods(testNS).Update(context.Background(), p, metav1.UpdateOptions{})
	}()
	var out bytes.Buffer
	if _, err := SwapSelected(context.Background(), podsOf(client), &SwapOptions{Namespace: testNS, Selector: "app=web",
		Container: "app", Image: "app:2", MaxUnavailable: 1, Timeout: 10 * time.Second, Out: &out}); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	node.mu.Lock()
	defer node.mu.Unlock()
	if !reflect.DeepEqual(node.order, []string{"web-0 Ready", "web-1", "web-0"}) {
		t.Errorf("events %v: web-1 started before web-0 was Ready", node.order)
	}
	if !strings.Contains(out.String(), "waiting: 0 swapping, not Ready: web-0") {
		t.Errorf("output:\n%s", out.String())
	}
}

func TestSwapSelectedChecks(t *testing.T) {
	client := fake.NewClientset(pods("web-0", "other")...)
	for _, tc := range []struct {
		o   SwapOptions
		err string
	}{
		{SwapOptions{Selector: "app=none", Container: "app", Image: "x", MaxUnavailable: 1}, "no pods"},
		{SwapOptions{Selector: "app=web", Container: "app", Image: "x", MaxUnavailable: 0}, "--max-unavailable"},
		{SwapOptions{Selector: "app=web", Container: "app", Image: "x", MaxUnavailable: 1, Partition: 1}, "other has no ordinal"},
		{SwapOptions{Selector: "app in (", Container: "app", Image: "x", MaxUnavailable: 1}, "-l"},
		{SwapOptions{Selector: "app=web", Pod: "web-0", Container: "app", Image: "x", MaxUnavailable: 1}, "not both"},
	} {
		tc.o.Namespace = testNS
		if _, err := SwapSelected(context.Background(), podsOf(client), &tc.o); err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%+v: err %v, want %q", tc.o, err, tc.err)
		}
	}
}
