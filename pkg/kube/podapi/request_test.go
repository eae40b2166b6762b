package podapi

import (
	"errors"
	"strings"
	"testing"
)

func TestParseSwapRequest(t *testing.T) {
	ok := []string{
		`{"container":"app","env":{"K":"V"}}`,
		`{"container":"app","image":"registry.local/app:v2","unsetEnv":["X"],"args":[],"healthHttp":"8080/healthz","minRuntime":"2s","drainSeconds":3}`,
		`{"container":"app","command":["/app","-listen",":9090"],"healthTcp":9090}`,
		`{"container":"app","image":"x","strategy":" Overlap"}`,
	}
	for _, raw := range ok {
		if _, err := ParseSwapRequest(raw); err != nil {
			t.Errorf("%s: %v", raw, err)
		}
	}
	r, _ := ParseSwapRequest(ok[1])
	if port, path := r.HealthHTTPGet(); !r.SetsArgs() || len(r.Args) != 0 || r.SetsCommand() || r.Image != "registry.local/app:v2" ||
		r.MinRuntime != "2s" || r.DrainSeconds != 3 || port != 8080 || path != "/healthz" {
		t.Errorf("request %+v, health %d %q", r, port, path)
	}
	if r, _ := ParseSwapRequest(ok[3]); r.Strategy != "overlap" {
		t.Errorf("strategy %q, want overlap as the engine reads it", r.Strategy)
	}
	bad := map[string]string{
		`{"container":"app","image":"x","strategy":"blue-green"}`: "strategy",
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
