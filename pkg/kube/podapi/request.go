package podapi

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/inplaced/inplaced/pkg/strategy"
)

// SwapRequest is the JSON of the inplaced.io/swap annotation.
type SwapRequest struct {
	Container string            `json:"container"`
	Image     string            `json:"image,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	UnsetEnv  []string          `json:"unsetEnv,omitempty"`
	Command   []string          `json:"command,omitempty"`
	Args      []string          `json:"args,omitempty"`
	// HealthHTTP is "PORT/path" (as inplacectl's --health-http), HealthTCP a
	// port, HealthExec a command run in the new container.
	HealthHTTP string   `json:"healthHttp,omitempty"`
	HealthTCP  int32    `json:"healthTcp,omitempty"`
	HealthExec []string `json:"healthExec,omitempty"`
	// MinRuntime is how long the new container must keep running ("5s").
	MinRuntime string `json:"minRuntime,omitempty"`
	// DrainSeconds: the pod is NotReady (readiness gate) this long before
	// the old container stops.
	DrainSeconds int64 `json:"drainSeconds,omitempty"`
	// Strategy is how the old container is replaced: "stop-first" or
	// "overlap" (package strategy); empty: the pod's annotation
	// inplaced.io/swap-strategy, else the node's default.
	Strategy string `json:"strategy,omitempty"`

	hasCommand, hasArgs bool
}

// requestFields are the keys a request may hold.
var requestFields = []string{"container", "image", "env", "unsetEnv", "command", "args",
	"healthHttp", "healthTcp", "healthExec", "minRuntime", "drainSeconds", "strategy"}

// immutableFields are what people ask for that cannot change in place.
var immutableFields = map[string]string{
	"volumeMounts": "mounts", "mounts": "mounts", "volumes": "mounts", "volumeDevices": "devices",
	"devices": "devices", "securityContext": "privileges", "privileged": "privileges",
	"capabilities": "privileges", "runAsUser": "privileges", "hostNetwork": "namespaces",
	"hostPID": "namespaces", "hostIPC": "namespaces", "namespaces": "namespaces", "ports": "ports",
	"resources": "resources (use inplacectl resize or kubectl's in-place resize)",
}

// RequestError is a refused request: Field names what is wrong.
type RequestError struct {
	Field, Why string
}

func (e *RequestError) Error() string {
	if e.Field == "" {
		return e.Why
	}
	return fmt.Sprintf("%s: %s", e.Field, e.Why)
}

// maxRequestBytes bounds the annotation (the API allows 256 KiB for all).
const maxRequestBytes = 64 << 10

// ParseSwapRequest parses and checks the inplaced.io/swap annotation.
// Every refusal is a *RequestError naming the field.
func ParseSwapRequest(raw string) (*SwapRequest, error) {
	if len(raw) > maxRequestBytes {
		return nil, &RequestError{Why: fmt.Sprintf("request is %d bytes, at most %d", len(raw), maxRequestBytes)}
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal([]byte(raw), &fields); err != nil {
		return nil, &RequestError{Why: fmt.Sprintf("not a JSON object: %v", err)}
	}
	if fields == nil {
		return nil, &RequestError{Why: "not a JSON object"}
	}
	keys := make([]string, 0, len(fields))
	for k := range fields {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if what, ok := immutableFields[k]; ok {
			return nil, &RequestError{Field: k, Why: "cannot change in place (" + what + "): recreate the pod for that"}
		}
		known := false
		for _, f := range requestFields {
			known = known || f == k
		}
		if !known {
			return nil, &RequestError{Field: k, Why: "unknown field; a request holds " + strings.Join(requestFields, ", ")}
		}
	}
	r := &SwapRequest{}
	dec := json.NewDecoder(bytes.NewReader([]byte(raw)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(r); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return nil, &RequestError{Field: te.Field, Why: fmt.Sprintf("want %s, got JSON %s", te.Type, te.Value)}
		}
		return nil, &RequestError{Why: fmt.Sprintf("not a valid request: %v", err)}
	}
	_, r.hasCommand = fields["command"]
	_, r.hasArgs = fields["args"]
	return r, r.check()
}

// ImageOnly reports whether the request changes nothing but the image.
func (r *SwapRequest) ImageOnly() bool {
	return r.Image != "" && len(r.Env) == 0 && len(r.UnsetEnv) == 0 && !r.hasCommand && !r.hasArgs
}

// check refuses a request that cannot run, naming the field: the checks
// run in this order and the first refusal is the one reported.
func (r *SwapRequest) check() error {
	for _, c := range []func() error{r.checkChange, r.checkEnvNames, r.checkGates} {
		if err := c(); err != nil {
			return err
		}
	}
	return nil
}

// checkChange: a container, a change, an image reference, numbers in range.
func (r *SwapRequest) checkChange() error {
	switch {
	case r.Container == "":
		return &RequestError{Field: "container", Why: "required: the name of the pod's container to swap"}
	case r.Image == "" && len(r.Env) == 0 && len(r.UnsetEnv) == 0 && !r.hasCommand && !r.hasArgs:
		return &RequestError{Why: "the change is empty: give image, env, unsetEnv, command or args"}
	case strings.ContainsAny(r.Image, " \t\n"):
		return &RequestError{Field: "image", Why: fmt.Sprintf("%q is not an image reference", r.Image)}
	case r.HealthTCP < 0 || r.HealthTCP > 65535:
		return &RequestError{Field: "healthTcp", Why: "want a port 1-65535"}
	case r.DrainSeconds < 0 || r.DrainSeconds > 3600:
		return &RequestError{Field: "drainSeconds", Why: "want 0-3600"}
	}
	if r.Strategy != "" {
		st, err := strategy.Parse(r.Strategy)
		if err != nil {
			return &RequestError{Field: "strategy", Why: err.Error()}
		}
		r.Strategy = string(st)
	}
	return nil
}

// checkEnvNames: every name set or unset is an environment variable name.
func (r *SwapRequest) checkEnvNames() error {
	for k := range r.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return &RequestError{Field: "env", Why: fmt.Sprintf("%q is not an environment variable name", k)}
		}
	}
	for _, k := range r.UnsetEnv {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return &RequestError{Field: "unsetEnv", Why: fmt.Sprintf("%q is not an environment variable name", k)}
		}
	}
	return nil
}

// checkGates: the minimum runtime and at most one health gate, well formed.
func (r *SwapRequest) checkGates() error {
	if r.MinRuntime != "" {
		d, err := time.ParseDuration(r.MinRuntime)
		if err != nil || d < 0 || d > time.Hour {
			return &RequestError{Field: "minRuntime", Why: fmt.Sprintf("%q: want a duration like \"5s\", at most 1h", r.MinRuntime)}
		}
	}
	if r.HealthHTTP != "" {
		if _, _, err := splitHealthHTTP(r.HealthHTTP); err != nil {
			return &RequestError{Field: "healthHttp", Why: err.Error()}
		}
	}
	n := 0
	for _, set := range []bool{r.HealthHTTP != "", r.HealthTCP != 0, len(r.HealthExec) > 0} {
		if set {
			n++
		}
	}
	if n > 1 {
		return &RequestError{Field: "healthHttp", Why: "give at most one of healthHttp, healthTcp, healthExec"}
	}
	return nil
}

// SetsCommand reports whether the request names a command, an empty one
// included (a change too).
func (r *SwapRequest) SetsCommand() bool { return r.hasCommand }

// SetsArgs reports whether the request names args, empty ones included.
func (r *SwapRequest) SetsArgs() bool { return r.hasArgs }

// HealthHTTPGet is healthHttp as a port and an absolute path; zero when
// the request has none. Valid for a request ParseSwapRequest returned.
func (r *SwapRequest) HealthHTTPGet() (port int32, path string) {
	if r.HealthHTTP == "" {
		return 0, ""
	}
	port, path, _ = splitHealthHTTP(r.HealthHTTP)
	return port, path
}

func splitHealthHTTP(s string) (int32, string, error) {
	port, path, _ := strings.Cut(s, "/")
	p, err := strconv.Atoi(port)
	if err != nil || p < 1 || p > 65535 {
		return 0, "", fmt.Errorf("%q: want PORT/path, e.g. 8080/healthz", s)
	}
	return int32(p), "/" + path, nil
}

// Digest identifies a request: the same annotation value seen twice (a
// re-applied manifest, a resync, a restart) runs once.
func Digest(raw string) string {
	sum := sha256.Sum256([]byte(raw))
	return "sha256:" + hex.EncodeToString(sum[:8])
}
