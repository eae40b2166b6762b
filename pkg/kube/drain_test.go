package kube

import (
	"context"
	"testing"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	listersv1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
)

func readyPod(ready corev1.ConditionStatus, rv string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web", UID: "uid-web", ResourceVersion: rv},
		Status:     corev1.PodStatus{Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: ready}}},
	}
}

// TestDrainCountsFromNotReady: the drain before the old container stops
// starts when the watch shows the pod NotReady (kubelet recomputes Ready
// from the gate later than the gate's write), and is bounded when kubelet
// never does.
func TestDrainCountsFromNotReady(t *testing.T) {
	indexer := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	pod := readyPod(corev1.ConditionTrue, "1")
	if err := indexer.Add(pod); err != nil {
		t.Fatal(err)
	}
	pods := newPodCache("node-a")
	pods.set(listersv1.NewPodLister(indexer), nil)
	r := &swapRequests{log: zap.NewNop(), cache: pods}

	go func() {
		time.Sleep(300 * time.Millisecond)
		_ = indexer.Update(readyPod(corev1.ConditionFalse, "2"))
	}()
	start := time.Now()
	r.awaitNotReady(context.Background(), pod, 5*time.Second)
	if took := time.Since(start); took < 250*time.Millisecond || took > 2*time.Second {
		t.Fatalf("awaitNotReady returned after %s, want when the pod went NotReady (~300ms)", took)
	}

	_ = indexer.Update(readyPod(corev1.ConditionTrue, "3"))
	start = time.Now()
	r.awaitNotReady(context.Background(), pod, 400*time.Millisecond)
	if took := time.Since(start); took < 350*time.Millisecond || took > 2*time.Second {
		t.Fatalf("awaitNotReady on a pod that stays Ready returned after %s, want the bound (400ms)", took)
	}
}
