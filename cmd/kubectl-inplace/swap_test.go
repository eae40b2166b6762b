package main

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/inplaced/inplaced/pkg/kube/podapi"
)

func TestRequest(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    SwapOptions
		want string
		err  string
	}{
		{name: "env and health", o: SwapOptions{Container: "app", Env: []string{"B=2", "A=x=y"}, UnsetEnv: []string{"C"},
			HealthHTTP: "8080/healthz", MinRuntime: 1500 * time.Millisecond, DrainSeconds: 2},
			want: `{"container":"app","drainSeconds":2,"env":{"A":"x=y","B":"2"},"healthHttp":"8080/healthz","minRuntime":"1.5s","unsetEnv":["C"]}`},
		{name: "image", o: SwapOptions{Container: "app", Image: "reg/app:2", HealthTCP: 80},
			want: `{"container":"app","healthTcp":80,"image":"reg/app:2"}`},
		{name: "command and args", o: SwapOptions{Container: "app", Command: []string{"/app"}, SetCommand: true, Args: []string{"-exit", "3"}, SetArgs: true},
			want: `{"args":["-exit","3"],"command":["/app"],"container":"app"}`},
		{name: "empty args are a change", o: SwapOptions{Container: "app", SetArgs: true},
			want: `{"args":[],"container":"app"}`},
		{name: "no container", o: SwapOptions{Image: "x"}, err: "container"},
		{name: "empty change", o: SwapOptions{Container: "app"}, err: "empty"},
		{name: "bad env", o: SwapOptions{Container: "app", Env: []string{"NOVALUE"}}, err: "KEY=VALUE"},
		{name: "two health gates", o: SwapOptions{Container: "app", Image: "x", HealthTCP: 80, HealthHTTP: "80/"}, err: "at most one"},
		{name: "bad drain", o: SwapOptions{Container: "app", Image: "x", DrainSeconds: -1}, err: "drainSeconds"},
		{name: "overlap", o: SwapOptions{Container: "app", Image: "reg/app:2", Strategy: "overlap"},
			want: `{"container":"app","image":"reg/app:2","strategy":"overlap"}`},
		{name: "bad strategy", o: SwapOptions{Container: "app", Image: "x", Strategy: "blue-green"},
			err: `strategy: "blue-green": use stop-first or overlap`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			raw, req, err := tc.o.Request()
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want one naming %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if raw != tc.want {
				t.Errorf("request\n got %s\nwant %s", raw, tc.want)
			}
			if req.Container != tc.o.Container {
				t.Errorf("parsed container %q", req.Container)
			}
			// The same options give the same value: asking twice runs once.
			again, _, _ := tc.o.Request()
			if again != raw {
				t.Errorf("not deterministic: %s vs %s", again, raw)
			}
		})
	}
}

func TestSwapCommitted(t *testing.T) {
	client := fake.NewClientset(testPod("web"))
	newFakeNode(t, client, nil)
	var out bytes.Buffer
	o := &SwapOptions{Namespace: testNS, Pod: "web", Container: "app", Env: []string{"A=2"}, Timeout: 10 * time.Second, Out: &out}
	st, err := Swap(context.Background(), podsOf(client), o)
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if st.State != podapi.StateCommitted || st.SwapID != "swap-web" {
		t.Errorf("status %+v", st)
	}
	p, _ := client.CoreV1().Pods(testNS).Get(context.Background(), "web", metav1.GetOptions{})
	raw, _, _ := o.Request()
	if p.Annotations[podapi.AnnotationSwap] != raw {
		t.Errorf("annotation %q, want %q", p.Annotations[podapi.AnnotationSwap], raw)
	}
	if !podReady(p) {
		t.Errorf("Swap returned before the pod was Ready again")
	}
	text := out.String()
	for _, want := range []string{"requested on node n1", "swap ID swap-web", "pull done", "stop done",
		"inplaced.io/InPlaceReady=False", "Committed: container app: set env A", "downtime 60ms", "health", "Ready=true"} {
		if !strings.Contains(text, want) {
			t.Errorf("output lacks %q:\n%s", want, text)
		}
	}
	if strings.Count(text, "pull done") != 1 {
		t.Errorf("a step printed twice:\n%s", text)
	}

	// The same request again: reported from the status, nothing written.
	client.ClearActions()
	out.Reset()
	if _, err := Swap(context.Background(), podsOf(client), o); err != nil {
		t.Fatalf("again: %v\n%s", err, out.String())
	}
	for _, a := range client.Actions() {
		if a.GetVerb() == "patch" || a.GetVerb() == "update" {
			t.Errorf("asked again, the plugin wrote: %v", a)
		}
	}
	if !strings.Contains(out.String(), "was made before: Committed") {
		t.Errorf("output:\n%s", out.String())
	}
}

func TestSwapFails(t *testing.T) {
	for _, end := range []string{podapi.StateRolledBack, podapi.StateFailed, podapi.StateRollbackFailed, podapi.StateRefused} {
		t.Run(end, func(t *testing.T) {
			client := fake.NewClientset(testPod("web"))
			newFakeNode(t, client, func(string) string { return end })
			var out bytes.Buffer
			st, err := Swap(context.Background(), podsOf(client), &SwapOptions{Namespace: testNS, Pod: "web", Container: "app",
				Command: []string{"/app"}, SetCommand: true, Timeout: 10 * time.Second, Out: &out})
			var se *SwapError
			if !errors.As(err, &se) || se.Status == nil || se.Status.State != end || st.State != end {
				t.Fatalf("err %v, status %+v; want a SwapError with %s\n%s", err, st, end, out.String())
			}
			if !strings.Contains(err.Error(), se.Status.Error) || se.Status.Error == "" {
				t.Errorf("error %q does not carry the node's %q", err, se.Status.Error)
			}
			if end == podapi.StateRefused && !strings.Contains(err.Error(), "nothing changed") {
				t.Errorf("refusal: %v", err)
			}
		})
	}
}

func TestSwapTimeout(t *testing.T) {
	client := fake.NewClientset(testPod("web"))
	start := time.Now()
	_, err := Swap(context.Background(), podsOf(client), &SwapOptions{Namespace: testNS, Pod: "web", Container: "app",
		Image: "app:2", Timeout: 300 * time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), "no status from inplaced on node n1") || !strings.Contains(err.Error(), "300ms") {
		t.Fatalf("err %v", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("took %s", d)
	}
}

func TestSwapChecksFirst(t *testing.T) {
	running := testPod("busy")
	running.Annotations[podapi.AnnotationSwap] = `{"container":"app","image":"x"}`
	running.Annotations[podapi.AnnotationSwapStatus] = `{"requestDigest":"` + podapi.Digest(`{"container":"app","image":"x"}`) +
		`","swapID":"s1","state":"Running","container":"app"}`
	unscheduled := testPod("pending")
	unscheduled.Spec.NodeName = ""
	client := fake.NewClientset(testPod("web"), running, unscheduled)
	for _, tc := range []struct{ pod, container, err string }{
		{"web", "nope", `no container "nope" in the pod (it has app)`},
		{"gone", "app", "not found"},
		{"busy", "app", "swap s1 of container app is still running"},
		{"pending", "app", "not scheduled"},
	} {
		client.ClearActions()
		_, err := Swap(context.Background(), podsOf(client), &SwapOptions{Namespace: testNS, Pod: tc.pod, Container: tc.container,
			Image: "app:2", Timeout: time.Second})
		if err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%s/%s: err %v, want %q", tc.pod, tc.container, err, tc.err)
		}
		for _, a := range client.Actions() {
			if a.GetVerb() == "patch" {
				t.Errorf("%s: wrote a request: %v", tc.pod, a)
			}
		}
	}
}

func TestSwapPodDeleted(t *testing.T) {
	client := fake.NewClientset(testPod("web"))
	go func() {
		time.Sleep(200 * time.Millisecond)
		_ = client.CoreV1().Pods(testNS).Delete(context.Background(), "web", metav1.DeleteOptions{})
	}()
	_, err := Swap(context.Background(), podsOf(client), &SwapOptions{Namespace: testNS, Pod: "web", Container: "app",
		Image: "app:2", Timeout: 5 * time.Second})
	if !errors.Is(err, errPodGone) {
		t.Fatalf("err %v, want %v", err, errPodGone)
	}
}

func TestSwapInterrupted(t *testing.T) {
	client := fake.NewClientset(testPod("web"))
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(200*time.Millisecond, cancel)
	_, err := Swap(ctx, podsOf(client), &SwapOptions{Namespace: testNS, Pod: "web", Container: "app", Image: "app:2", Timeout: 5 * time.Second})
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "interrupted: the request stays on the pod") {
		t.Fatalf("err %v", err)
	}
}
