package kube

import (
	"context"
	"errors"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/pkg/kube/podapi"
	"github.com/inplaced/inplaced/pkg/kubeclient"
	"github.com/inplaced/inplaced/pkg/kubeletview"
	"github.com/inplaced/inplaced/pkg/store"
	"github.com/inplaced/inplaced/pkg/swap"
)

func TestEnvRetryDelay(t *testing.T) {
	for _, tc := range []struct {
		failures int
		want     time.Duration
	}{
		{1, 10 * time.Second},
		{2, 20 * time.Second},
		{3, 40 * time.Second},
		{5, 160 * time.Second},
		{6, envRetryMax},
		{7, envRetryMax},
		{1000, envRetryMax},
	} {
		if got := envRetryDelay(tc.failures); got != tc.want {
			t.Errorf("envRetryDelay(%d) = %s, want %s", tc.failures, got, tc.want)
		}
	}
}

func TestDecideEnv(t *testing.T) {
	now := time.Unix(1000, 0)
	blue := map[string]string{"TIER": "blue"}
	gold := map[string]string{"TIER": "gold", "OTHER": "x"}
	failedBlue := &envBackoff{digest: envDigest(blue), failures: 1, until: now.Add(time.Second)}
	for _, tc := range []struct {
		name                     string
		want                     map[string]string
		have                     map[string]string
		b                        *envBackoff
		swapRunning, imageComing bool
		act                      envAction
		set                      map[string]string
	}{
		{"env in place", map[string]string{"TIER": "gold"}, gold, nil, false, false, envInPlace, nil},
		{"env in place ends a back-off", map[string]string{"TIER": "gold"}, gold, failedBlue, false, false, envInPlace, nil},
		{"label changed", blue, gold, nil, false, false, envSwapNow, blue},
		{"label empty, env missing", map[string]string{"TIER": ""}, map[string]string{}, nil, false, false, envInPlace, nil},
		{"label set, env missing", blue, map[string]string{}, nil, false, false, envSwapNow, blue},
		{"same values backing off", blue, gold, failedBlue, false, false, envBackingOff, blue},
		{"same values, back-off over", blue, gold, &envBackoff{digest: envDigest(blue), failures: 3, until: now}, false, false, envSwapNow, blue},
		{"other values than the ones backing off", map[string]string{"TIER": "green"}, gold, failedBlue, false, false, envSwapNow, map[string]string{"TIER": "green"}},
		{"a swap of the pod container runs", blue, gold, nil, true, false, envAwaitSwap, nil},
		{"a swap runs while an image change comes", blue, gold, nil, true, true, envAwaitSwap, nil},
		{"an image change comes: its swap carries the env", blue, gold, nil, false, true, envAwaitImage, nil},
		{"an image change comes, env in place", map[string]string{"TIER": "gold"}, gold, nil, false, true, envAwaitImage, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			act, set, digest := decideEnv(envState{want: tc.want, have: tc.have, backoff: tc.b,
				swapRunning: tc.swapRunning, imageComing: tc.imageComing, now: now})
			if act != tc.act {
				t.Errorf("action %d, want %d", act, tc.act)
			}
			if len(set) != len(tc.set) {
				t.Fatalf("set %v, want %v", set, tc.set)
			}
			for k, v := range tc.set {
				if got, ok := set[k]; !ok || got != v {
					t.Errorf("set %v, want %v", set, tc.set)
				}
			}
			if (act == envSwapNow || act == envBackingOff) && digest != envDigest(tc.set) {
				t.Errorf("digest %q, want the set's", digest)
			}
		})
	}
}

// envRetryEnv is newKruiseEnv for a pod that opts in by annotation, with a
// clock the test moves and the pod syncs it asks for recorded.
type envRetryEnv struct {
	*lagEnv
	eng      *swapping
	requeued chan time.Duration

	mu  sync.Mutex
	now time.Time
}

func newEnvRetryEnv(t *testing.T) *envRetryEnv {
	t.Helper()
	e, eng := newKruiseEnv(t, false)
	eng.after = 10 * time.Millisecond
	r := &envRetryEnv{lagEnv: e, eng: eng, requeued: make(chan time.Duration, 16), now: time.Unix(1000, 0)}
	e.pod.Annotations = map[string]string{podapi.AnnotationEnvFromMetadata: "true"}
	e.c.env.now = func() time.Time {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.now
	}
	e.c.env.requeue = func(key string, after time.Duration) {
		if key != "default/web" {
			t.Errorf("requeued %q, want default/web", key)
		}
		r.requeued <- after
	}
	return r
}

func (r *envRetryEnv) advance(d time.Duration) {
	r.mu.Lock()
	r.now = r.now.Add(d)
	r.mu.Unlock()
}

// label is the pod with label tier set, as the watch delivers it.
func (r *envRetryEnv) label(tier string) *corev1.Pod {
	p := r.pod.DeepCopy()
	p.Labels["tier"] = tier
	return p
}

// sync runs the env part of a pod sync with container id running.
func (r *envRetryEnv) sync(pod *corev1.Pod, id string) {
	r.c.env.sync(pod, map[string]*runtimeapi.Container{"app": {Id: id}})
}

// ended waits for the end of a swap: its pod is synced again after want.
func (r *envRetryEnv) ended(t *testing.T, want time.Duration) {
	t.Helper()
	select {
	case got := <-r.requeued:
		if got != want {
			t.Errorf("pod synced again after %s, want %s", got, want)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the swap's end did not sync the pod again")
	}
}

func (r *envRetryEnv) swaps(t *testing.T, want int) {
	t.Helper()
	if n := len(r.eng.started()); n != want {
		t.Fatalf("%d swaps started, want %d", n, want)
	}
}

// record makes id a container created with TIER=tier.
func (r *envRetryEnv) record(t *testing.T, id, tier string) {
	t.Helper()
	req, err := r.st.Container(r.id)
	if err != nil {
		t.Fatal(err)
	}
	req.Config.Envs = []*runtimeapi.KeyValue{{Key: "TIER", Value: []byte(tier)}, {Key: "OTHER", Value: []byte("x")}}
	if err := r.st.PutContainer(id, req); err != nil {
		t.Fatal(err)
	}
}

// TestEnvSwapRetriedAfterBackoff: an env swap that rolled back is not
// tried again on every sync, but after 10 s, then 20 s (the pod is synced
// again for it); once one commits nothing is remembered.
func TestEnvSwapRetriedAfterBackoff(t *testing.T) {
	r := newEnvRetryEnv(t)
	blue := r.label("blue")
	r.sync(blue, r.id)
	r.swaps(t, 1)
	r.ended(t, envRetryInitial)

	r.sync(blue, r.id) // kubelet's status update after the rollback
	r.advance(envRetryInitial - time.Second)
	r.sync(blue, r.id)
	r.swaps(t, 1)

	r.advance(time.Second) // the requeued sync
	r.sync(blue, r.id)
	r.swaps(t, 2)
	r.ended(t, 2*envRetryInitial)
	r.advance(2*envRetryInitial - time.Second)
	r.sync(blue, r.id)
	r.swaps(t, 2)

	r.advance(time.Second)
	r.eng.commit = true
	r.sync(blue, r.id)
	r.swaps(t, 3)
	r.ended(t, 0)
	if req := r.eng.started()[2]; req.Change.SetEnv["TIER"] != "blue" || req.Target.GetContainerId() != r.id {
		t.Errorf("third swap %v, want TIER=blue on %s", req, r.id)
	}
	r.c.env.mu.Lock()
	left := len(r.c.env.retry)
	r.c.env.mu.Unlock()
	if left != 0 {
		t.Errorf("%d back-offs kept after the commit, want none", left)
	}
}

// TestEnvSwapValuesComeBack: labels that go gold → blue → gold → blue are
// swapped each time (each value was swapped in before, and committed).
func TestEnvSwapValuesComeBack(t *testing.T) {
	r := newEnvRetryEnv(t)
	r.eng.commit = true
	id := r.id
	for i, tier := range []string{"blue", "gold", "blue"} {
		r.sync(r.label(tier), id)
		r.swaps(t, i+1)
		r.ended(t, 0)
		id = "c-" + tier + string(rune('0'+i))
		r.record(t, id, tier) // the swap's new container
		r.sync(r.label(tier), id)
		r.swaps(t, i+1)
	}
}

// TestEnvSwapOvertaken: kubelet replaced the container while its env swap
// ran (an image swap, a restart), with the old env. No second swap starts
// while the first runs; when it ends aborted, the new container gets the
// env after the back-off — or needs nothing if it already carries it.
func TestEnvSwapOvertaken(t *testing.T) {
	for _, tc := range []struct {
		name     string
		newTier  string
		wantSwap bool
	}{
		{"new container with the old env", "gold", true},
		{"new container with the label's env", "blue", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newEnvRetryEnv(t)
			r.eng.after = 200 * time.Millisecond
			blue := r.label("blue")
			r.sync(blue, r.id)
			r.record(t, "c-new", tc.newTier)
			r.sync(blue, "c-new")
			r.swaps(t, 1)
			r.ended(t, envRetryInitial)
			r.advance(envRetryInitial)
			r.sync(blue, "c-new")
			if !tc.wantSwap {
				r.swaps(t, 1)
				r.c.env.mu.Lock()
				left := len(r.c.env.retry)
				r.c.env.mu.Unlock()
				if left != 0 {
					t.Errorf("%d back-offs kept with the env in place, want none", left)
				}
				return
			}
			r.swaps(t, 2)
			if req := r.eng.started()[1]; req.Target.GetContainerId() != "c-new" || req.Change.SetEnv["TIER"] != "blue" {
				t.Errorf("retry %v, want TIER=blue on c-new", req)
			}
		})
	}
}

// TestEnvSwapRefusedIsRetried: a swap the engine would not start (the
// container busy with another swap) is tried again after the back-off.
func TestEnvSwapRefusedIsRetried(t *testing.T) {
	r := newEnvRetryEnv(t)
	r.eng.refuse = errors.New("test: container busy")
	blue := r.label("blue")
	r.sync(blue, r.id)
	r.ended(t, envRetryInitial)
	r.sync(blue, r.id)
	r.swaps(t, 1)
	r.eng.refuse = nil
	r.advance(envRetryInitial)
	r.sync(blue, r.id)
	r.swaps(t, 2)
	r.ended(t, 2*envRetryInitial) // this engine rolls back
}

// TestEnvSwapsForgottenWithThePod: a removed pod leaves no back-off and no
// finished swap behind.
func TestEnvSwapsForgottenWithThePod(t *testing.T) {
	r := newEnvRetryEnv(t)
	r.sync(r.label("blue"), r.id)
	r.ended(t, envRetryInitial)
	r.c.env.mu.Lock()
	before := len(r.c.env.retry) + len(r.c.env.swaps)
	r.c.env.mu.Unlock()
	if before != 2 {
		t.Fatalf("%d entries before the removal, want a back-off and a swap", before)
	}
	r.c.podGone(r.pod.UID)
	r.c.env.mu.Lock()
	after := len(r.c.env.retry) + len(r.c.env.swaps)
	r.c.env.mu.Unlock()
	if after != 0 {
		t.Errorf("%d entries left after the pod's removal", after)
	}
}

// TestRunRetriesEnvSwap: under Run, an env swap that rolled back is tried
// again once the back-off is over, with nothing new from the watch (the
// informer's resync is 5 minutes away).
func TestRunRetriesEnvSwap(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for the first back-off (10 s)")
	}
	pod := &corev1.Pod{
		TypeMeta: metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"},
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web", UID: "uid-web", ResourceVersion: "5",
			Labels: map[string]string{"tier": "blue"}, Annotations: map[string]string{podapi.AnnotationEnvFromMetadata: "true"}},
		Spec: corev1.PodSpec{NodeName: "node-a", Containers: []corev1.Container{{Name: "app", Image: "registry.local/app:v1",
			Env: []corev1.EnvVar{{Name: "TIER", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels['tier']"}}}}}}},
	}
	api := &fakeAPI{pod: pod, node: &corev1.Node{TypeMeta: metav1.TypeMeta{Kind: "Node", APIVersion: "v1"},
		ObjectMeta: metav1.ObjectMeta{Name: "node-a", ResourceVersion: "3"}}}
	srv := httptest.NewServer(api)
	defer srv.Close()
	client, err := kubeclient.NewForConfig(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.PutContainer("c-old", &runtimeapi.CreateContainerRequest{Config: &runtimeapi.ContainerConfig{
		Labels: map[string]string{swap.LabelPodNamespace: "default", swap.LabelPodName: "web", swap.LabelPodUID: "uid-web", swap.LabelContainerName: "app"},
		Envs:   []*runtimeapi.KeyValue{{Key: "TIER", Value: []byte("gold")}},
	}}); err != nil {
		t.Fatal(err)
	}
	eng := &swapping{preparing: preparing{prepared: make(chan swap.KubeletChange, 4)}, after: 10 * time.Millisecond}
	c, err := New(Options{Client: client, NodeName: "node-a", Engine: eng, Kubelet: kubeletview.New(), Runtime: runningRuntime{pod: pod}, Store: st})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() {
		cancel()
		<-done
	}()
	waitSwaps := func(n int, within time.Duration) time.Time {
		t.Helper()
		deadline := time.Now().Add(within)
		for len(eng.started()) < n {
			if time.Now().After(deadline) {
				t.Fatalf("%d swaps within %s, want %d", len(eng.started()), within, n)
			}
			time.Sleep(20 * time.Millisecond)
		}
		return time.Now()
	}
	first := waitSwaps(1, 10*time.Second)
	second := waitSwaps(2, envRetryInitial+5*time.Second)
	if d := second.Sub(first); d < envRetryInitial-time.Second { // first and second are polled
		t.Errorf("retried after %s, want the back-off of %s first", d, envRetryInitial)
	}
	if req := eng.started()[1]; req.Target.GetContainerId() != "c-old" || req.Change.SetEnv["TIER"] != "blue" {
		t.Errorf("retry %v, want TIER=blue on c-old", req)
	}
}

// TestImageChangeCarriesMetadataEnv: the kubelet-driven swap for an image
// change is prepared with the env the pod's current metadata gives the
// container, opted in or not: kubelet's own create would resolve the same,
// so kubelet adopts the new container and no env swap follows it.
func TestImageChangeCarriesMetadataEnv(t *testing.T) {
	for _, tc := range []struct {
		name        string
		annotations map[string]string
	}{
		{"opted in", map[string]string{podapi.AnnotationEnvFromMetadata: "true"}},
		{"not opted in", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, _ := newKruiseEnv(t, true)
			v2 := e.pod.DeepCopy()
			v2.Annotations = tc.annotations
			v2.Labels["tier"] = "blue"
			v2.Spec.Containers[0].Image = "registry.local/app:v2"
			e.c.images.sync(v2, &v2.Spec.Containers[0], &runtimeapi.Container{Id: e.id,
				Annotations: map[string]string{swap.AnnotationHash: ContainerHash("app", "registry.local/app:v1")}})
			select {
			case got := <-e.eng.prepared:
				if got.Image != "registry.local/app:v2" || len(got.MetadataEnv) != 1 || got.MetadataEnv["TIER"] != "blue" {
					t.Errorf("prepared %s with metadata env %v, want v2 with TIER=blue", got.Image, got.MetadataEnv)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the image change was not prepared")
			}
		})
	}
}

// TestEnvSwapWaitsForImageChange: while a kubelet-driven image change of
// the container is pending, no env swap starts (the image swap carries the
// env); the pod is looked at again, and once the change is gone — or its
// preparation failed — the env swap goes ahead.
func TestEnvSwapWaitsForImageChange(t *testing.T) {
	for _, tc := range []struct {
		name    string
		prepErr error // the change's preparation failed
	}{
		{"pending change", nil},
		{"change that could not be prepared", errors.New("test: container gone")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newEnvRetryEnv(t)
			r.eng.commit = true
			blue := r.label("blue")
			blue.Spec.Containers[0].Image = "registry.local/app:v2"
			ch := r.c.images.newChange(blue, &blue.Spec.Containers[0], r.id)
			if tc.prepErr != nil {
				ch.prepErr = tc.prepErr
				close(ch.ready)
			}
			r.c.images.mu.Lock()
			r.c.images.changes[ch.key] = ch
			r.c.images.mu.Unlock()
			r.sync(blue, r.id)
			if tc.prepErr != nil {
				r.swaps(t, 1)
				return
			}
			r.swaps(t, 0)
			r.ended(t, envRetryInitial) // looked at again
			r.c.images.forget(ch)       // the change ended without a swap
			r.sync(blue, r.id)
			r.swaps(t, 1)
		})
	}
}
