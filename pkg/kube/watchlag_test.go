package kube

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	listersv1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/pkg/kubeletview"
	"github.com/inplaced/inplaced/pkg/store"
	"github.com/inplaced/inplaced/pkg/swap"
)

// preparing is an Engine that records the changes it is asked to prepare.
type preparing struct {
	Engine
	prepared chan swap.KubeletChange
}

func (p *preparing) Prepare(_ context.Context, c swap.KubeletChange) (*swap.Prepared, error) {
	p.prepared <- c
	return nil, errors.New("test: not carried out")
}

type lagEnv struct {
	c       *Controller
	st      *store.Store
	indexer cache.Indexer
	pod     *corev1.Pod
	id      string
	eng     *preparing
}

// compose makes the controller under test with engine eng, the pod
// informer's cache on the indexer, and the pod watch not started.
func (e *lagEnv) compose(eng Engine) {
	e.c = compose(Options{NodeName: "node-a", Engine: eng, Kubelet: kubeletview.New(), Store: e.st, Logger: zap.NewNop(),
		Credentials: newCredentials()})
	e.c.cache.set(listersv1.NewPodLister(e.indexer), nil)
}

func newLagEnv(t *testing.T) *lagEnv {
	t.Helper()
	st, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web", UID: "uid-web", ResourceVersion: "1"},
		Spec:       corev1.PodSpec{NodeName: "node-a", Containers: []corev1.Container{{Name: "app", Image: "registry.local/app:v1"}}},
	}
	const id = "c-old"
	if err := st.PutContainer(id, &runtimeapi.CreateContainerRequest{Config: &runtimeapi.ContainerConfig{
		Labels: map[string]string{swap.LabelPodNamespace: "default", swap.LabelPodName: "web",
			swap.LabelPodUID: "uid-web", swap.LabelContainerName: "app"},
		Annotations: map[string]string{swap.AnnotationHash: ContainerHash("app", "registry.local/app:v1")},
	}}); err != nil {
		t.Fatal(err)
	}
	indexer := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	if err := indexer.Add(pod); err != nil {
		t.Fatal(err)
	}
	eng := &preparing{prepared: make(chan swap.KubeletChange, 4)}
	e := &lagEnv{st: st, indexer: indexer, pod: pod, id: id, eng: eng}
	e.compose(eng)
	return e
}

// TestStopWaitsForALaggingWatch: kubelet's watch delivered an image patch
// before inplaced's. The stop waits for the watch (at most watchLag) and is
// then held for the pull, instead of going through with the pull as
// downtime.
func TestStopWaitsForALaggingWatch(t *testing.T) {
	e := newLagEnv(t)
	start := time.Now() // before the delivery's clock starts
	go func() {
		time.Sleep(80 * time.Millisecond)
		v2 := e.pod.DeepCopy()
		v2.ResourceVersion = "2"
		v2.Spec.Containers[0].Image = "registry.local/app:v2"
		_ = e.indexer.Update(v2)
		e.c.cache.delivered(v2)
	}()
	ch := e.c.images.detect(context.Background(), e.id)
	took := time.Since(start)
	if ch == nil || ch.image != "registry.local/app:v2" {
		t.Fatalf("detect = %+v after %s, want the change to v2", ch, took)
	}
	if took < 80*time.Millisecond || took >= watchLag {
		t.Errorf("detect took %s: want it to wait for the delivery (80 ms), not for watchLag", took)
	}
	select {
	case got := <-e.eng.prepared:
		if got.Image != "registry.local/app:v2" || got.ContainerID != e.id {
			t.Errorf("prepared %+v", got)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the change was not prepared")
	}
}

// TestStopWithoutSpecChangeWaitsAtMostWatchLag: a liveness kill (the spec
// declares what runs) waits watchLag for a watch that has nothing to
// deliver, then goes through.
func TestStopWithoutSpecChangeWaitsAtMostWatchLag(t *testing.T) {
	e := newLagEnv(t)
	start := time.Now()
	if ch := e.c.images.detect(context.Background(), e.id); ch != nil {
		t.Fatalf("detect = %+v, want nothing to hold", ch)
	}
	if took := time.Since(start); took < watchLag || took > watchLag+time.Second {
		t.Errorf("detect took %s, want about watchLag (%s)", took, watchLag)
	}
}

// TestStopOfDeletedPodNeverWaits: stops of a pod being deleted go through
// at once.
func TestStopOfDeletedPodNeverWaits(t *testing.T) {
	e := newLagEnv(t)
	gone := e.pod.DeepCopy()
	now := metav1.Now()
	gone.DeletionTimestamp = &now
	if err := e.indexer.Update(gone); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if ch := e.c.images.detect(context.Background(), e.id); ch != nil {
		t.Fatalf("detect = %+v for a pod being deleted", ch)
	}
	if took := time.Since(start); took > 100*time.Millisecond {
		t.Errorf("a deleted pod's stop waited %s", took)
	}
}
