package swap

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

// defaultGrace is kubelet's minimum when a pod says nothing (kubelet-cri.md).
const defaultGrace = 2 * time.Second

// gracePeriod is the request's, else the pod's terminationGracePeriod.
func (r *run) gracePeriod() time.Duration {
	if s := r.opts.GetGracePeriodSeconds(); s > 0 {
		return time.Duration(s) * time.Second
	}
	if v, err := strconv.Atoi(r.oldReq.Config.GetAnnotations()[AnnotationGracePeriod]); err == nil && v > 0 {
		return time.Duration(v) * time.Second
	}
	return defaultGrace
}

// stopTimeout is what is left of the grace period after preStop, in whole
// seconds with kubelet's floor of 2. Like kubelet (killContainer), it
// subtracts the whole seconds spent: grace 30 s after a 0.4 s preStop is 30.
func stopTimeout(grace, spent time.Duration) int64 {
	left := int64(grace/time.Second) - int64(spent/time.Second)
	if left < 2 {
		left = 2
	}
	return left
}

// k8sHandler is the JSON kubelet records in the preStopHandler annotation
// (a core/v1 LifecycleHandler).
type k8sHandler struct {
	Exec *struct {
		Command []string `json:"command"`
	} `json:"exec"`
	HTTPGet *struct {
		Path   string          `json:"path"`
		Port   json.RawMessage `json:"port"`
		Host   string          `json:"host"`
		Scheme string          `json:"scheme"`
	} `json:"httpGet"`
	Sleep *struct {
		Seconds int64 `json:"seconds"`
	} `json:"sleep"`
}

// recordedPreStop converts kubelet's recorded preStop handler.
func recordedPreStop(cfg *runtimeapi.ContainerConfig) (*inplacedv1.Handler, error) {
	raw := cfg.GetAnnotations()[AnnotationPreStop]
	if raw == "" {
		return nil, nil
	}
	var h k8sHandler
	if err := json.Unmarshal([]byte(raw), &h); err != nil {
		return nil, fmt.Errorf("decode %s: %w", AnnotationPreStop, err)
	}
	switch {
	case h.Exec != nil:
		return &inplacedv1.Handler{Exec: h.Exec.Command}, nil
	case h.HTTPGet != nil:
		port, err := resolvePort(h.HTTPGet.Port, cfg)
		if err != nil {
			return nil, err
		}
		return &inplacedv1.Handler{HttpGet: &inplacedv1.HTTPGet{Host: h.HTTPGet.Host, Port: port, Path: h.HTTPGet.Path, Scheme: h.HTTPGet.Scheme}}, nil
	case h.Sleep != nil:
		return &inplacedv1.Handler{SleepSeconds: h.Sleep.Seconds}, nil
	}
	return nil, nil
}

// resolvePort reads an IntOrString port; a named port is looked up in the
// ports annotation kubelet records.
func resolvePort(raw json.RawMessage, cfg *runtimeapi.ContainerConfig) (int32, error) {
	var n int32
	if err := json.Unmarshal(raw, &n); err == nil {
		return n, nil
	}
	var name string
	if err := json.Unmarshal(raw, &name); err != nil {
		return 0, fmt.Errorf("preStop httpGet port %s: %w", raw, err)
	}
	var ports []struct {
		Name          string `json:"name"`
		ContainerPort int32  `json:"containerPort"`
	}
	_ = json.Unmarshal([]byte(cfg.GetAnnotations()["io.kubernetes.container.ports"]), &ports)
	for _, p := range ports {
		if p.Name == name {
			return p.ContainerPort, nil
		}
	}
	return 0, fmt.Errorf("preStop httpGet: named port %q not found", name)
}

func (r *run) preStop(ctx context.Context, grace time.Duration) error {
	h := r.opts.GetPreStop()
	if h == nil {
		var err error
		if h, err = recordedPreStop(r.oldReq.Config); err != nil {
			return err
		}
	}
	if h == nil {
		return nil
	}
	return r.runHandler(ctx, r.t.container.Id, h, grace)
}

// runHandler runs a lifecycle handler against a container, bounded by limit.
func (r *run) runHandler(ctx context.Context, containerID string, h *inplacedv1.Handler, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	return r.e.probe(ctx, containerID, r.podIP(), h, limit)
}

func (r *run) podIP() string {
	return r.t.sandbox.GetNetwork().GetIp()
}

// probe runs one handler: exec (through CRI ExecSync), httpGet against the
// pod IP, tcp connect, or sleep. A handler that sets none of them passes.
func (e *Engine) probe(ctx context.Context, containerID, podIP string, h *inplacedv1.Handler, limit time.Duration) error {
	switch {
	case len(h.Exec) > 0:
		return e.execProbe(ctx, containerID, h.Exec, limit)
	case h.HttpGet != nil:
		return httpGetProbe(ctx, podIP, h.HttpGet)
	case h.TcpPort > 0:
		return tcpProbe(ctx, podIP, h.TcpPort)
	case h.SleepSeconds > 0:
		return sleepProbe(ctx, time.Duration(h.SleepSeconds)*time.Second)
	}
	return nil
}

// execProbe runs cmd in the container; a non-zero exit fails it, with the
// command's stderr as the reason.
func (e *Engine) execProbe(ctx context.Context, containerID string, cmd []string, limit time.Duration) error {
	// ExecSync's timeout is in whole seconds and 0 means none: a limit under
	// a second must still bound the command.
	timeout := int64(limit / time.Second)
	if timeout < 1 {
		timeout = 1
	}
	resp, err := e.rt.ExecSync(ctx, &runtimeapi.ExecSyncRequest{ContainerId: containerID, Cmd: cmd, Timeout: timeout})
	if err != nil {
		return fmt.Errorf("exec %q: %w", cmd, err)
	}
	if resp.ExitCode != 0 {
		return fmt.Errorf("exec %q exited %d: %s", cmd, resp.ExitCode, strings.TrimSpace(string(resp.Stderr)))
	}
	return nil
}

// httpGetProbe passes when a GET answers 2xx or 3xx, as kubelet's do.
func httpGetProbe(ctx context.Context, podIP string, g *inplacedv1.HTTPGet) error {
	url, err := httpGetURL(podIP, g)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	// Like kubelet's probes: a self-signed pod certificate is not an error.
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("GET %s: %w", url, err)
	}
	resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode >= 400 {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return nil
}

// httpGetURL fills in what a pod spec may leave out, with kubelet's
// defaults: the pod IP for the host, http for the scheme, / for the path.
func httpGetURL(podIP string, g *inplacedv1.HTTPGet) (string, error) {
	host := g.Host
	if host == "" {
		host = podIP
	}
	if host == "" {
		return "", fmt.Errorf("httpGet: the pod has no IP and no host was given")
	}
	scheme := strings.ToLower(g.Scheme)
	if scheme == "" {
		scheme = "http"
	}
	path := g.Path
	if !strings.HasPrefix(path, "/") {
		path = "/" + path
	}
	return fmt.Sprintf("%s://%s%s", scheme, net.JoinHostPort(host, strconv.Itoa(int(g.Port))), path), nil
}

// tcpProbe passes when the pod accepts a connection on port.
func tcpProbe(ctx context.Context, podIP string, port int64) error {
	addr := net.JoinHostPort(podIP, strconv.Itoa(int(port)))
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("tcp %s: %w", addr, err)
	}
	return c.Close()
}

// sleepProbe waits d, or fails with the context's error when the handler's
// limit or the swap ends first.
func sleepProbe(ctx context.Context, d time.Duration) error {
	select {
	case <-time.After(d):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// healthGate: the new container must keep running for the minimum time and
// pass the optional check within its timeout.
func (r *run) healthGate(ctx context.Context, id string) error {
	if err := r.staysRunning(ctx, id, r.minRunTime()); err != nil {
		return err
	}
	check := r.opts.GetHealthCheck()
	if check == nil {
		return nil
	}
	return r.passesHealthCheck(ctx, id, check)
}

// minRunTime is the request's minimum runtime, else the engine's.
func (r *run) minRunTime() time.Duration {
	if ms := r.opts.GetMinRuntimeMs(); ms > 0 {
		return time.Duration(ms) * time.Millisecond
	}
	return r.e.minRuntime
}

// staysRunning polls the new container until it has run for minRun; it
// fails as soon as the container is seen not running.
func (r *run) staysRunning(ctx context.Context, id string, minRun time.Duration) error {
	deadline := r.e.now().Add(minRun)
	for {
		st, err := r.e.rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id})
		if err != nil {
			// The runtime restarting says nothing about the container (its
			// shim keeps it running): ask again once the runtime is back.
			if runtimeDown(err) && r.e.now().Before(deadline.Add(runtimeDownWait)) {
				if werr := sleepCtx(ctx, 250*time.Millisecond); werr != nil {
					return werr
				}
				continue
			}
			return fmt.Errorf("status of new container: %w", err)
		}
		if err := notRunning(id, st.GetStatus()); err != nil {
			return err
		}
		if !r.e.now().Before(deadline) {
			return nil
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// notRunning is the error for a new container that is not running, with
// how it ended and how long it ran, which is what tells a crash on start
// from one later; nil while it runs.
func notRunning(id string, s *runtimeapi.ContainerStatus) error {
	if s.GetState() == runtimeapi.ContainerState_CONTAINER_RUNNING {
		return nil
	}
	return fmt.Errorf("new container %s is %s (exit code %d, reason %q) after %s",
		short(id), s.GetState(), s.GetExitCode(), s.GetReason(),
		time.Duration(s.GetFinishedAt()-s.GetStartedAt()).Round(time.Millisecond))
}

// passesHealthCheck runs check until it passes or the health timeout ends,
// 250 ms between attempts. Each attempt gets at most 5 s, so that one hung
// attempt does not use up the whole timeout.
func (r *run) passesHealthCheck(ctx context.Context, id string, check *inplacedv1.Handler) error {
	timeout := r.healthTimeout()
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		pctx, pcancel := context.WithTimeout(cctx, 5*time.Second)
		last = r.e.probe(pctx, id, r.podIP(), check, 5*time.Second)
		pcancel()
		if last == nil {
			return nil
		}
		select {
		case <-cctx.Done():
			return fmt.Errorf("health check did not pass within %s: %w", timeout, last)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// healthTimeout is the request's health timeout, else 30 s.
func (r *run) healthTimeout() time.Duration {
	if ms := r.opts.GetHealthTimeoutMs(); ms > 0 {
		return time.Duration(ms) * time.Millisecond
	}
	return 30 * time.Second
}
