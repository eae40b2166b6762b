package kube

import (
	"errors"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/inplaced/inplaced/pkg/kube/podapi"
)

// changeOf gives the engine what the request asks for: command and args
// set even when empty, the health gate, the minimum runtime.
func TestChangeOf(t *testing.T) {
	ok := []string{
		`{"container":"app","env":{"K":"V"}}`,
		`{"container":"app","image":"registry.local/app:v2","unsetEnv":["X"],"args":[],"healthHttp":"8080/healthz","minRuntime":"2s","drainSeconds":3}`,
		`{"container":"app","command":["/app","-listen",":9090"],"healthTcp":9090}`,
	}
	for _, raw := range ok {
		r, err := podapi.ParseSwapRequest(raw)
		if err != nil {
			t.Errorf("%s: %v", raw, err)
			continue
		}
		c, _ := changeOf(r)
		if c == nil {
			t.Errorf("%s: no change", raw)
		}
	}
	r, _ := podapi.ParseSwapRequest(ok[1])
	c, o := changeOf(r)
	if !c.SetArgs || len(c.Args) != 0 || c.SetCommand || c.GetImage() != "registry.local/app:v2" || o.MinRuntimeMs != 2000 ||
		o.HealthCheck.GetHttpGet().GetPort() != 8080 || o.HealthCheck.GetHttpGet().GetPath() != "/healthz" {
		t.Errorf("change %v options %v", c, o)
	}
	r, _ = podapi.ParseSwapRequest(ok[2])
	c, o = changeOf(r)
	if !c.SetCommand || c.SetArgs || len(c.Command) != 3 || c.Image != nil || o.HealthCheck.GetTcpPort() != 9090 {
		t.Errorf("change %v options %v", c, o)
	}
}

// FuzzParseSwapRequest: any annotation value gives a request that passed
// its checks or a podapi.RequestError; never a panic.
func FuzzParseSwapRequest(f *testing.F) {
	for _, s := range []string{`{"container":"app","env":{"K":"V"}}`, `{"container":"app","image":"r/a:v2","healthHttp":"80/"}`,
		`{"container":"","args":null}`, `{"mounts":[1]}`, `{"container":"app","minRuntime":"1h1s"}`, `{`, `"x"`, `{"container":"app","healthExec":["true"],"healthTcp":1}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		r, err := podapi.ParseSwapRequest(raw)
		if err != nil {
			var re *podapi.RequestError
			if !errors.As(err, &re) {
				t.Fatalf("%q: error %T %v is not a podapi.RequestError", raw, err, err)
			}
			return
		}
		if r.Container == "" {
			t.Fatalf("%q: accepted without a container", raw)
		}
		c, _ := changeOf(r)
		if c.Image == nil && len(c.SetEnv) == 0 && len(c.UnsetEnv) == 0 && !c.SetCommand && !c.SetArgs {
			t.Fatalf("%q: accepted an empty change", raw)
		}
	})
}

func TestSpecPatch(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web", UID: "u-1"}}
	got := string(specPatch(pod, "app", "r/app:v2"))
	want := `{"metadata":{"uid":"u-1"},"spec":{"containers":[{"image":"r/app:v2","name":"app"}]}}`
	if got != want {
		t.Errorf("patch %s, want %s", got, want)
	}
}
