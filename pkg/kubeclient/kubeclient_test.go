package kubeclient_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"

	"github.com/inplaced/inplaced/pkg/kubeclient"
)

// request is what the API server sees of one call.
type request struct {
	Method, Path, Query, Accept, ContentType, UserAgent, Body string
}

// apiServer records requests and answers each with an empty object of the
// kind asked for, or 404 for the name "missing".
type apiServer struct {
	mu   sync.Mutex
	reqs []request
}

func (s *apiServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	s.reqs = append(s.reqs, request{Method: r.Method, Path: r.URL.Path, Query: r.URL.Query().Encode(),
		Accept: r.Header.Get("Accept"), ContentType: r.Header.Get("Content-Type"), UserAgent: r.UserAgent(), Body: string(body)})
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	if strings.HasSuffix(r.URL.Path, "/missing") {
		w.WriteHeader(http.StatusNotFound)
		_ = json.NewEncoder(w).Encode(apierrors.NewNotFound(corev1.Resource("events"), "missing").ErrStatus)
		return
	}
	if r.URL.Query().Get("watch") == "true" {
		return // a watch that ends at once
	}
	kind := map[string]string{"pods": "Pod", "nodes": "Node", "secrets": "Secret", "events": "Event"}
	parts := strings.Split(strings.TrimPrefix(r.URL.Path, "/api/v1/"), "/")
	k := ""
	for _, p := range parts {
		if kind[p] != "" {
			k = kind[p]
		}
	}
	if r.Method == http.MethodGet && kind[parts[len(parts)-1]] != "" {
		k += "List" // a collection, not one object by name
	}
	fmt.Fprintf(w, `{"kind":%q,"apiVersion":"v1","metadata":{}}`, k)
}

func (s *apiServer) take() []request {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.reqs
	s.reqs = nil
	return r
}

// calls is everything inplaced and kubectl-inplace ask of the API server,
// through either client.
type calls struct {
	pods    func(ns string) kubeclient.PodInterface
	nodes   func() kubeclient.NodeInterface
	secrets func(ns string) kubeclient.SecretInterface
	// events as tools/record's sink writes them
	createEvent func(*corev1.Event) (*corev1.Event, error)
	patchEvent  func(ev *corev1.Event, patch []byte) (*corev1.Event, error)
}

func (c calls) run(t *testing.T) {
	ctx := context.Background()
	sel := fields.OneTermEqualSelector("spec.nodeName", "node-1").String()
	if _, err := c.pods("").List(ctx, metav1.ListOptions{FieldSelector: sel, ResourceVersion: "0", Limit: 500}); err != nil {
		t.Errorf("list pods: %v", err)
	}
	initial, timeout := true, int64(300)
	w, err := c.pods("").Watch(ctx, metav1.ListOptions{FieldSelector: sel, ResourceVersion: "42", AllowWatchBookmarks: true,
		SendInitialEvents: &initial, ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan, TimeoutSeconds: &timeout})
	if err != nil {
		t.Errorf("watch pods: %v", err)
	} else {
		w.Stop()
	}
	if _, err := c.pods("ns").Get(ctx, "p", metav1.GetOptions{}); err != nil {
		t.Errorf("get pod: %v", err)
	}
	patch := []byte(`{"metadata":{"annotations":{"a":"b"}}}`)
	if _, err := c.pods("ns").Patch(ctx, "p", types.MergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
		t.Errorf("patch pod status: %v", err)
	}
	if _, err := c.pods("ns").Patch(ctx, "p", types.StrategicMergePatchType, patch, metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
		t.Errorf("patch pod: %v", err)
	}
	nodeSel := fields.OneTermEqualSelector("metadata.name", "node-1").String()
	if _, err := c.nodes().List(ctx, metav1.ListOptions{FieldSelector: nodeSel}); err != nil {
		t.Errorf("list nodes: %v", err)
	}
	if w, err := c.nodes().Watch(ctx, metav1.ListOptions{FieldSelector: nodeSel, ResourceVersion: "7"}); err != nil {
		t.Errorf("watch nodes: %v", err)
	} else {
		w.Stop()
	}
	// inplaced-installer's: its record on the Node, and the Ready wait.
	if _, err := c.nodes().Get(ctx, "node-1", metav1.GetOptions{}); err != nil {
		t.Errorf("get node: %v", err)
	}
	if _, err := c.nodes().Patch(ctx, "node-1", types.MergePatchType, []byte(`{"metadata":{"annotations":{"a":null}}}`), metav1.PatchOptions{}); err != nil {
		t.Errorf("patch node: %v", err)
	}
	if _, err := c.secrets("ns").Get(ctx, "pull", metav1.GetOptions{}); err != nil {
		t.Errorf("get secret: %v", err)
	}
	ev := &corev1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p.1"}, Reason: "Swapped", Count: 1}
	if _, err := c.createEvent(ev); err != nil {
		t.Errorf("create event: %v", err)
	}
	if _, err := c.patchEvent(ev, []byte(`{"count":2}`)); err != nil {
		t.Errorf("patch event: %v", err)
	}
	// A repeat whose event is gone is created anew: the recorder tells by
	// the error.
	_, err = c.patchEvent(&corev1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "missing"}}, []byte(`{}`))
	if se, ok := err.(*apierrors.StatusError); !ok || se.Status().Code != http.StatusNotFound {
		t.Errorf("patch of a missing event: %T %v, want a *StatusError 404", err, err)
	}
}

// TestSameRequestsAsClientset: inplaced's requests (paths, verbs,
// subresources, query, content negotiation, user agent, bodies) are those
// of client-go's full clientset, so RBAC and the Node authorizer see no
// difference.
func TestSameRequestsAsClientset(t *testing.T) {
	for _, ua := range []string{"", "inplaced/test"} {
		t.Run("user-agent="+ua, func(t *testing.T) {
			srv := &apiServer{}
			ts := httptest.NewServer(srv)
			defer ts.Close()
			cfg := &rest.Config{Host: ts.URL, UserAgent: ua}

			cs, err := kubernetes.NewForConfig(cfg)
			if err != nil {
				t.Fatal(err)
			}
			// What tools/record wrote through: the requests and RBAC verbs
			// inplaced's events keep.
			sink := &typedcorev1.EventSinkImpl{Interface: cs.CoreV1().Events("")}
			calls{
				pods:        func(ns string) kubeclient.PodInterface { return cs.CoreV1().Pods(ns) },
				nodes:       func() kubeclient.NodeInterface { return cs.CoreV1().Nodes() },
				secrets:     func(ns string) kubeclient.SecretInterface { return cs.CoreV1().Secrets(ns) },
				createEvent: sink.Create,
				patchEvent:  sink.Patch,
			}.run(t)
			want := srv.take()

			kc, err := kubeclient.NewForConfig(cfg)
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			calls{pods: kc.Pods, nodes: kc.Nodes, secrets: kc.Secrets,
				createEvent: func(ev *corev1.Event) (*corev1.Event, error) { return kc.Events().Create(ctx, ev) },
				patchEvent: func(ev *corev1.Event, patch []byte) (*corev1.Event, error) {
					return kc.Events().Patch(ctx, ev.Namespace, ev.Name, patch)
				},
			}.run(t)
			got := srv.take()
			t.Logf("%d requests compared", len(want))

			if len(got) != len(want) {
				t.Fatalf("%d requests, the clientset made %d:\n got %+v\nwant %+v", len(got), len(want), got, want)
			}
			for i := range want {
				if got[i] != want[i] {
					t.Errorf("request %d:\n got %+v\nwant %+v", i, got[i], want[i])
				}
			}
			if ua != "" && want[0].UserAgent != ua {
				t.Errorf("user agent %q, want %q", want[0].UserAgent, ua)
			}
		})
	}
}

// TestSchemeIsCoreOnly: the scheme knows core/v1 and the meta/v1 types
// (and the internal WatchEvent those bring), nothing of other groups.
func TestSchemeIsCoreOnly(t *testing.T) {
	for gvk := range kubeclient.Scheme.AllKnownTypes() {
		if gvk.Group != "" || (gvk.Version != "v1" && gvk.Version != runtime.APIVersionInternal) {
			t.Errorf("scheme registers %v: only core/v1 is wanted", gvk)
		}
	}
	if _, _, err := kubeclient.Scheme.ObjectKinds(&corev1.Pod{}); err != nil {
		t.Errorf("Pod: %v", err)
	}
}
