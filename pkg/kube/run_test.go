package kube

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/pkg/kubeclient"
	"github.com/inplaced/inplaced/pkg/kubeletview"
	"github.com/inplaced/inplaced/pkg/store"
	"github.com/inplaced/inplaced/pkg/swap"
)

// fakeAPI serves one node's pods and the node, as list, watch or watch-list
// (client-go's default), a pull secret and event writes; it records what
// was asked.
type fakeAPI struct {
	pod  *corev1.Pod
	node *corev1.Node

	mu   sync.Mutex
	seen []string // "METHOD path?query"
}

func (a *fakeAPI) saw(prefix string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, s := range a.seen {
		if strings.HasPrefix(s, prefix) {
			return true
		}
	}
	return false
}

func (a *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	a.mu.Lock()
	a.seen = append(a.seen, r.Method+" "+r.URL.Path+"?"+q.Encode())
	a.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	var item any
	var kind string
	switch {
	case r.URL.Path == "/api/v1/pods" && q.Get("fieldSelector") == "spec.nodeName=node-a":
		item, kind = a.pod, "Pod"
	case r.URL.Path == "/api/v1/nodes" && q.Get("fieldSelector") == "metadata.name=node-a":
		item, kind = a.node, "Node"
	case r.URL.Path == "/api/v1/namespaces/default/secrets/pull":
		_ = json.NewEncoder(w).Encode(&corev1.Secret{TypeMeta: metav1.TypeMeta{Kind: "Secret", APIVersion: "v1"},
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "pull"}, Type: corev1.SecretTypeOpaque})
		return
	case r.URL.Path == "/api/v1/namespaces/default/events" && r.Method == http.MethodPost:
		var e corev1.Event
		_ = json.NewDecoder(r.Body).Decode(&e)
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(&e)
		return
	default:
		w.WriteHeader(http.StatusForbidden)
		_ = json.NewEncoder(w).Encode(&metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
			Status: metav1.StatusFailure, Reason: metav1.StatusReasonForbidden, Code: http.StatusForbidden})
		return
	}
	if q.Get("watch") != "true" {
		_ = json.NewEncoder(w).Encode(map[string]any{"kind": kind + "List", "apiVersion": "v1",
			"metadata": map[string]string{"resourceVersion": "10"}, "items": []any{item}})
		return
	}
	enc := json.NewEncoder(w)
	if q.Get("sendInitialEvents") == "true" {
		_ = enc.Encode(map[string]any{"type": "ADDED", "object": item})
		_ = enc.Encode(map[string]any{"type": "BOOKMARK", "object": map[string]any{"kind": kind, "apiVersion": "v1",
			"metadata": map[string]any{"resourceVersion": "10", "annotations": map[string]string{metav1.InitialEventsAnnotationKey: "true"}}}})
	}
	w.(http.Flusher).Flush()
	<-r.Context().Done()
}

// runningRuntime lists one running container of the pod: the old image's.
type runningRuntime struct {
	runtimeapi.RuntimeServiceClient
	pod *corev1.Pod
}

func (r runningRuntime) ListContainers(context.Context, *runtimeapi.ListContainersRequest, ...grpc.CallOption) (*runtimeapi.ListContainersResponse, error) {
	return &runtimeapi.ListContainersResponse{Containers: []*runtimeapi.Container{{
		Id: "c-old", State: runtimeapi.ContainerState_CONTAINER_RUNNING, CreatedAt: 1,
		Labels:      map[string]string{swap.LabelPodUID: string(r.pod.UID), swap.LabelContainerName: "app"},
		Annotations: map[string]string{swap.AnnotationHash: ContainerHash("app", "registry.local/app:v1")},
	}}}, nil
}

// TestRunOverKubeclient: Run's informers, pull secret read and events go
// through pkg/kubeclient with the Node authorizer's selectors, a spec
// image change reaches the engine, and Run ends with its context.
func TestRunOverKubeclient(t *testing.T) {
	pod := &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"},
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web", UID: "uid-web", ResourceVersion: "5"},
		Spec: corev1.PodSpec{NodeName: "node-a", ImagePullSecrets: []corev1.LocalObjectReference{{Name: "pull"}},
			Containers: []corev1.Container{{Name: "app", Image: "registry.local/app:v2"}}},
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
	eng := &preparing{prepared: make(chan swap.KubeletChange, 4)}
	c, err := New(Options{Client: client, NodeName: "node-a", Engine: eng, Kubelet: kubeletview.New(), Runtime: runningRuntime{pod: pod}, Store: st})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()

	select {
	case ch := <-eng.prepared:
		if ch.ContainerID != "c-old" || ch.Image != "registry.local/app:v2" {
			t.Errorf("prepared %+v, want c-old to registry.local/app:v2", ch)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the spec image change did not reach the engine")
	}
	_, nodes := c.cache.listers()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if n, err := nodes.Get("node-a"); err == nil && n.ResourceVersion == "3" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the node informer did not deliver node-a")
		}
		time.Sleep(10 * time.Millisecond)
	}
	c.writer.event(pod, corev1.EventTypeNormal, "Test", "through %s", "kubeclient")
	for !api.saw("POST /api/v1/namespaces/default/events") {
		if time.Now().After(deadline) {
			t.Fatal("no event written")
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, want := range []string{
		"GET /api/v1/pods?", "GET /api/v1/nodes?", "GET /api/v1/namespaces/default/secrets/pull?",
	} {
		if !api.saw(want) {
			api.mu.Lock()
			t.Errorf("no request %q; saw %q", want, api.seen)
			api.mu.Unlock()
		}
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not end with its context")
	}
}
