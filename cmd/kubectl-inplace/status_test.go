package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/fake"
	"sigs.k8s.io/yaml"

	"github.com/inplaced/inplaced/pkg/kube/podapi"
)

func TestStatus(t *testing.T) {
	done := testPod("web-0")
	req := `{"container":"app","env":{"A":"2"}}`
	done.Annotations[podapi.AnnotationSwap] = req
	done.Annotations[podapi.AnnotationSwapStatus] = `{"requestDigest":"` + podapi.Digest(req) + `","swapID":"s1","state":"Committed",` +
		`"container":"app","from":{"image":"app:1","env":["A"]},"to":{"image":"app:1","env":["A","B"],"args":["-v"]},` +
		`"steps":[{"name":"pull","durationMs":2.5},{"name":"stop","durationMs":41}],"downtimeMs":62.4,"override":true,"updatedAt":"2026-01-02T03:04:05Z"}`
	done.Status.Conditions = append(done.Status.Conditions, corev1.PodCondition{Type: podapi.ConditionAffinityDrift,
		Status: corev1.ConditionTrue, Message: "node label disk=ssd is gone"})
	pending := testPod("web-1")
	pending.Annotations[podapi.AnnotationSwap] = `{"container":"app","image":"app:3"}`
	pending.Annotations[podapi.AnnotationSwapStatus] = done.Annotations[podapi.AnnotationSwapStatus]
	client := fake.NewClientset(done, pending, testPod("web-2"))

	var out bytes.Buffer
	if _, err := Status(context.Background(), podsOf(client), &StatusOptions{Namespace: testNS, Pods: []string{"web-0"}, Out: &out}); err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"web-0", "Committed", "s1", "62ms", "affinity drift: node label disk=ssd is gone",
		"Change: container app: env +B; args [\"-v\"]", "pull  3ms", "stop  41ms"} {
		if !strings.Contains(out.String(), w) {
			t.Errorf("table lacks %q:\n%s", w, out.String())
		}
	}

	out.Reset()
	l, err := Status(context.Background(), podsOf(client), &StatusOptions{Namespace: testNS, Selector: "app=web", Output: "json", Out: &out})
	if err != nil {
		t.Fatal(err)
	}
	var got []PodStatus
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("json: %v\n%s", err, out.String())
	}
	if len(got) != 3 || got[0].Pod != "web-2" || got[1].Pod != "web-1" || !got[1].Pending || got[2].Pending ||
		got[2].Status.State != podapi.StateCommitted || got[2].Status.Steps[1].DurationMs != 41 || got[0].Request != "" {
		t.Errorf("json %s", out.String())
	}
	if len(l) != 3 {
		t.Errorf("returned %d", len(l))
	}

	out.Reset()
	if _, err := Status(context.Background(), podsOf(client), &StatusOptions{Namespace: testNS, Pods: []string{"web-1"}, Output: "yaml", Out: &out}); err != nil {
		t.Fatal(err)
	}
	var one PodStatus
	if err := yaml.Unmarshal(out.Bytes(), &one); err != nil || one.Pod != "web-1" || !one.Pending || one.InPlaceReady != "True" {
		t.Errorf("yaml (%v):\n%s", err, out.String())
	}

	out.Reset()
	if _, err := Status(context.Background(), podsOf(client), &StatusOptions{Namespace: testNS, Selector: "app=web", Out: &out}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "Pending (not seen by inplaced yet), before: Committed") {
		t.Errorf("table:\n%s", out.String())
	}

	for _, o := range []*StatusOptions{{Output: "xml", Pods: []string{"web-0"}}, {}, {Pods: []string{"x"}, Selector: "a=b"}, {Pods: []string{"nope"}}} {
		o.Namespace = testNS
		if _, err := Status(context.Background(), podsOf(client), o); err == nil {
			t.Errorf("%+v: no error", o)
		}
	}
}
