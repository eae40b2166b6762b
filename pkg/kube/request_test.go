package kube

import (
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestParseSwapRequest(t *testing.T) {
	ok := []string{
		`{"container":"app","env":{"K":"V"}}`,
		`{"container":"app","image":"registry.local/app:v2","unsetEnv":["X"],"args":[],"healthHttp":"8080/healthz","minRuntime":"2s","drainSeconds":3}`,
		`{"container":"app","command":["/app","-listen",":9090"],"healthTcp":9090}`,
	}
	for _, raw := range ok {
		r, err := ParseSwapRequest(raw)
		if err != nil {
			t.Errorf("%s: %v", raw, err)
			continue
		}
		c, _ := r.Change()
		if c == nil {
			t.Errorf("%s: no change", raw)
		}
	}
	r, _ := ParseSwapRequest(ok[1])
	c, o := r.Change()
	if !c.SetArgs || len(c.Args) != 0 || c.SetCommand || c.GetImage() != "registry.local/app:v2" || o.MinRuntimeMs != 2000 ||
		o.HealthCheck.GetHttpGet().GetPort() != 8080 || o.HealthCheck.GetHttpGet().GetPath() != "/healthz" {
		t.Errorf("change %v options %v", c, o)
	}
	bad := map[string]string{
		`not json`:                              "",
		`[]`:                                    "",
		`null`:                                  "",
		`{}`:                                    "container",
		`{"container":"app"}`:                   "",
		`{"container":"app","env":{"K":1}}`:     "env",
		`{"container":"app","volumeMounts":[]}`: "volumeMounts",
		`{"container":"app","securityContext":{}}`:            "securityContext",
		`{"container":"app","image":"x","bogus":1}`:           "bogus",
		`{"container":"app","image":"x","minRuntime":"soon"}`: "minRuntime",
		`{"container":"app","image":"x","healthHttp":"web"}`:  "healthHttp",
		`{"container":"app","image":"x","healthTcp":70000}`:   "healthTcp",
		`{"container":"app","env":{"A=B":"1"}}`:               "env",
		`{"container":"app","image":"a b"}`:                   "image",
		`{"container":"app","image":"x","drainSeconds":-1}`:   "drainSeconds",
	}
	for raw, field := range bad {
		_, err := ParseSwapRequest(raw)
		var re *RequestError
		if !errors.As(err, &re) {
			t.Errorf("%s: %v, want a RequestError", raw, err)
			continue
		}
		if re.Field != field {
			t.Errorf("%s: field %q (%v), want %q", raw, re.Field, err, field)
		}
	}
	if d1, d2 := Digest(ok[0]), Digest(ok[0]+" "); d1 == d2 || !strings.HasPrefix(d1, "sha256:") {
		t.Errorf("digests %s %s", d1, d2)
	}
}

// FuzzParseSwapRequest: any annotation value gives a request that passed
// its checks or a RequestError; never a panic.
func FuzzParseSwapRequest(f *testing.F) {
	for _, s := range []string{`{"container":"app","env":{"K":"V"}}`, `{"container":"app","image":"r/a:v2","healthHttp":"80/"}`,
		`{"container":"","args":null}`, `{"mounts":[1]}`, `{"container":"app","minRuntime":"1h1s"}`, `{`, `"x"`, `{"container":"app","healthExec":["true"],"healthTcp":1}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		r, err := ParseSwapRequest(raw)
		if err != nil {
			var re *RequestError
			if !errors.As(err, &re) {
				t.Fatalf("%q: error %T %v is not a RequestError", raw, err, err)
			}
			return
		}
		if r.Container == "" {
			t.Fatalf("%q: accepted without a container", raw)
		}
		c, _ := r.Change()
		if c.Image == nil && len(c.SetEnv) == 0 && len(c.UnsetEnv) == 0 && !c.SetCommand && !c.SetArgs {
			t.Fatalf("%q: accepted an empty change", raw)
		}
	})
}

// ImageOnly decides whether the sticky override goes once the spec names
// the image: any env, command or args change keeps it.
func TestImageOnly(t *testing.T) {
	for raw, want := range map[string]bool{
		`{"container":"app","image":"r/app:v2"}`:                  true,
		`{"container":"app","image":"r/app:v2","healthTcp":8080}`: true,
		`{"container":"app","image":"r/app:v2","env":{"A":"1"}}`:  false,
		`{"container":"app","image":"r/app:v2","unsetEnv":["A"]}`: false,
		`{"container":"app","image":"r/app:v2","command":[]}`:     false,
		`{"container":"app","image":"r/app:v2","args":["-v"]}`:    false,
		`{"container":"app","env":{"A":"1"}}`:                     false,
	} {
		r, err := ParseSwapRequest(raw)
		if err != nil {
			t.Fatalf("%s: %v", raw, err)
		}
		if got := r.ImageOnly(); got != want {
			t.Errorf("%s: ImageOnly %v, want %v", raw, got, want)
		}
	}
}

func TestSpecPatch(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web", UID: "u-1"}}
	got := string(specPatch(pod, "app", "r/app:v2"))
	want := `{"metadata":{"uid":"u-1"},"spec":{"containers":[{"image":"r/app:v2","name":"app"}]}}`
	if got != want {
		t.Errorf("patch %s, want %s", got, want)
	}
}
