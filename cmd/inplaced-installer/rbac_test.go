package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"sort"
	"strings"
	"sync"
	"testing"

	"go.uber.org/zap"
	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/client-go/rest"

	"github.com/inplaced/inplaced/pkg/install"
	"github.com/inplaced/inplaced/pkg/kubeclient"
)

// verbServer is an API server that records each request as the RBAC
// verb, group and resource it needs, and answers with the least object
// each client decodes.
type verbServer struct {
	mu   sync.Mutex
	seen map[string]bool
}

func (s *verbServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	group, resource, named := apiPath(r.URL.Path)
	verb := map[string]string{http.MethodPost: "create", http.MethodPatch: "patch", http.MethodPut: "update", http.MethodDelete: "delete"}[r.Method]
	if r.Method == http.MethodGet {
		verb = "list"
		if named {
			verb = "get"
		}
	}
	s.mu.Lock()
	s.seen[fmt.Sprintf("%s %s/%s", verb, group, resource)] = true
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	switch resource {
	case "daemonsets":
		fmt.Fprint(w, `{"kind":"DaemonSet","apiVersion":"apps/v1","metadata":{"name":"inplaced-installer","generation":2},`+
			`"spec":{"selector":{"matchLabels":{"app.kubernetes.io/name":"inplaced-installer"}}},`+
			`"status":{"observedGeneration":2,"desiredNumberScheduled":3,"updatedNumberScheduled":3,"numberAvailable":3}}`)
	case "pods":
		fmt.Fprint(w, `{"kind":"PodList","apiVersion":"v1","metadata":{},"items":[]}`)
	case "nodes":
		fmt.Fprint(w, `{"kind":"Node","apiVersion":"v1","metadata":{"name":"node-1","uid":"u1"}}`)
	default:
		fmt.Fprint(w, `{"kind":"Event","apiVersion":"v1","metadata":{}}`)
	}
}

// apiPath splits /api/v1/... and /apis/g/v/... into group and resource,
// and says whether the request names one object.
func apiPath(p string) (group, resource string, named bool) {
	parts := strings.Split(strings.Trim(p, "/"), "/")
	if parts[0] == "apis" {
		group, parts = parts[1], parts[3:]
	} else {
		parts = parts[2:]
	}
	if len(parts) >= 2 && parts[0] == "namespaces" {
		parts = parts[2:]
	}
	return group, parts[0], len(parts) > 1
}

func (s *verbServer) take() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for k := range s.seen {
		out = append(out, k)
	}
	s.seen = map[string]bool{}
	sort.Strings(out)
	return out
}

// granted lists a rendered Role's or ClusterRole's rules as "verb
// group/resource".
func granted(t *testing.T, role object) []string {
	t.Helper()
	var out []string
	for _, r := range role["rules"].([]any) {
		for _, g := range strs(get(r, "apiGroups")) {
			for _, res := range strs(get(r, "resources")) {
				for _, v := range strs(get(r, "verbs")) {
					out = append(out, fmt.Sprintf("%s %s/%s", v, g, res))
				}
			}
		}
	}
	sort.Strings(out)
	return out
}

// TestChartRBACIsWhatTheInstallerUses: every request the installer's
// clients make is granted by the chart, and every grant is used — the
// installer's ClusterRole by the node client (annotation, Ready wait,
// event), the hook's Role by uninstall-fleet.
func TestChartRBACIsWhatTheInstallerUses(t *testing.T) {
	srv := &verbServer{seen: map[string]bool{}}
	ts := httptest.NewServer(srv)
	defer ts.Close()
	cfg := &rest.Config{Host: ts.URL}
	ctx := context.Background()

	kc, err := kubeclient.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	node := &install.NodeClient{Client: kc, Name: "node-1"}
	v := "{}"
	for _, err := range []error{func() error { _, err := node.Get(ctx); return err }(),
		node.Annotate(ctx, install.AnnotationInstalled, &v), node.Annotate(ctx, install.AnnotationInstalled, nil),
		node.Event(ctx, "Normal", install.ReasonInstalled, "x")} {
		if err != nil {
			t.Fatal(err)
		}
	}
	objs := mustRender(t)
	if got, want := srv.take(), granted(t, find(t, objs, "ClusterRole", "inplaced-installer")); !reflect.DeepEqual(got, want) {
		t.Errorf("the installer makes %q; its ClusterRole grants %q", got, want)
	}

	f, err := newFleet(cfg, "kube-system", "inplaced-installer", zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	if err := f.uninstall(ctx, "100%"); err != nil {
		t.Fatal(err)
	}
	ds, err := f.get(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_ = f.notDone(ds, errors.New("timed out"))
	if got, want := srv.take(), granted(t, find(t, objs, "Role", "inplaced-uninstall")); !reflect.DeepEqual(got, want) {
		t.Errorf("uninstall-fleet makes %q; the hook's Role grants %q", got, want)
	}
}

func TestRolledOut(t *testing.T) {
	for _, c := range []struct {
		gen  int64
		s    appsv1.DaemonSetStatus
		want bool
	}{
		{2, appsv1.DaemonSetStatus{ObservedGeneration: 2, DesiredNumberScheduled: 3, UpdatedNumberScheduled: 3, NumberAvailable: 3}, true},
		{2, appsv1.DaemonSetStatus{ObservedGeneration: 1, DesiredNumberScheduled: 3, UpdatedNumberScheduled: 3, NumberAvailable: 3}, false},
		{2, appsv1.DaemonSetStatus{ObservedGeneration: 2, DesiredNumberScheduled: 3, UpdatedNumberScheduled: 2, NumberAvailable: 3}, false},
		{2, appsv1.DaemonSetStatus{ObservedGeneration: 2, DesiredNumberScheduled: 3, UpdatedNumberScheduled: 3, NumberAvailable: 2, NumberUnavailable: 1}, false},
		{1, appsv1.DaemonSetStatus{ObservedGeneration: 1}, true}, // no node selected: nothing to do
	} {
		ds := &appsv1.DaemonSet{Status: c.s}
		ds.Generation = c.gen
		if got, progress := rolledOut(ds); got != c.want {
			t.Errorf("%+v: rolled out %v (%s), want %v", c.s, got, progress, c.want)
		}
	}
}
