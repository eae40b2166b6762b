// Package config defines inplaced's configuration: defaults in one place, a
// YAML file, and validation with errors that say what to change.
package config

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/yaml"

	"github.com/inplaced/inplaced/pkg/holdmode"
	"github.com/inplaced/inplaced/pkg/runtimeclass"
	"github.com/inplaced/inplaced/pkg/strategy"
)

// DefaultConfigPath is read when present and --config is not given.
const DefaultConfigPath = "/etc/inplaced/config.yaml"

// Config is the daemon configuration. Field names are the YAML keys.
type Config struct {
	// Listen is the CRI socket kubelet and crictl talk to.
	Listen string `json:"listen"`
	// RuntimeEndpoint is the backend CRI runtime (containerd, CRI-O).
	RuntimeEndpoint string `json:"runtimeEndpoint"`
	// ImageEndpoint is the backend image service; empty means RuntimeEndpoint.
	ImageEndpoint string `json:"imageEndpoint"`
	// StateDir is where the state store and swap journal are kept.
	StateDir string `json:"stateDir"`
	// ControlSocket serves the inplaced control API.
	ControlSocket string `json:"controlSocket"`
	// LogLevel is debug, info, warn or error.
	LogLevel string `json:"logLevel"`
	// LogFormat is json or console.
	LogFormat string `json:"logFormat"`
	// ShutdownGrace is how long the calls and swaps in flight at SIGTERM
	// may run on; what still runs then is cut (kubelet retries a call, the
	// journal settles a swap on the next start). New calls are not taken
	// meanwhile: they wait for the next process.
	ShutdownGrace Duration `json:"shutdownGrace"`
	// ShutdownTimeout is the older spelling of shutdownGrace, kept so that
	// the config file an earlier version installed still loads: an upgrade
	// must not fail on it. Load moves it to ShutdownGrace.
	ShutdownTimeout Duration `json:"shutdownTimeout"`
	// HealthMinRuntime is how long a swapped-in container must keep running
	// before the swap commits, unless the request says otherwise.
	HealthMinRuntime Duration `json:"healthMinRuntime"`
	// FenceTimeout bounds how long kubelet's calls for a container wait for a
	// running swap on it.
	FenceTimeout Duration `json:"fenceTimeout"`
	// RuntimeClasses say where each runtime handler's sandboxes have their
	// CPU and memory limits enforced and whose network stack their sockets
	// live in, in front of the built-in table (runc, crun: container-cgroups
	// on the host kernel; runsc: sandbox-cgroup, kata*: vm, each with a
	// network stack of its own; other handlers by the runtime type
	// containerd reports, else treated as unknown: resized through the
	// runtime only, nothing claimed as verified, the connection hold
	// tried). See package runtimeclass.
	RuntimeClasses []RuntimeClass `json:"runtimeClasses"`
	// VMRuntimeHandlers is the older spelling of runtimeClasses entries with
	// enforcement vm; kept so that existing config files still load.
	VMRuntimeHandlers []string `json:"vmRuntimeHandlers"`
	// CgroupRoot is where the cgroup hierarchies are mounted.
	CgroupRoot string `json:"cgroupRoot"`
	// Kubeconfig turns on Kubernetes mode: the pods bound to NodeName are
	// watched with this identity (kubelet's own kubeconfig works), and
	// kubelet's restarts for pod spec image changes become in-place swaps.
	// Empty: node-local mode only.
	Kubeconfig string `json:"kubeconfig"`
	// NodeName is this node's name in the API (default: the hostname, as
	// kubelet's).
	NodeName string `json:"nodeName"`
	// OnPullFailure is what kubelet's StopContainer gets when the new image
	// cannot be pulled: keep-running (refused, the old container runs on) or
	// pass-through (kubelet's stop goes ahead, as without inplaced).
	OnPullFailure string `json:"onPullFailure"`
	// AffinityDrift is what a swap of a pod that no longer fits its node
	// (nodeSelector, required node affinity, taints) gets: warn (an Event,
	// the condition inplaced.io/AffinityDrift, the swap goes on) or refuse.
	AffinityDrift string `json:"affinityDrift"`
	// MetricsListen is the host:port Prometheus metrics are served on
	// (/metrics). Empty: off.
	MetricsListen string `json:"metricsListen"`
	// KubeletRootDir is kubelet's --root-dir: the node's docker config
	// (config.json) is read from there first, as kubelet reads it, for the
	// pull before kubelet's stop.
	KubeletRootDir string `json:"kubeletRootDir"`
	// ImageCredentialProviderConfig and ImageCredentialProviderBinDir are
	// kubelet's flags of the same names: the credential-provider plugins
	// the pull before kubelet's stop asks, as kubelet would. Empty: none.
	ImageCredentialProviderConfig string `json:"imageCredentialProviderConfig"`
	ImageCredentialProviderBinDir string `json:"imageCredentialProviderBinDir"`
	// Relay is how kubelet's calls are served: router (the HTTP/2 router,
	// the default: the cheapest per call) or grpc (grpc-go's server and
	// client for every call, as the intercepted methods are served: the
	// fallback if the router misbehaves with a caller or backend).
	Relay string `json:"relay"`
	// ConnectionHold is what a swap does about new connections while no
	// process listens: queue (park the SYNs in the pod's netns until the new
	// process listens), drop (clients retransmit after ~1 s) or off. Pods
	// override it with the annotation inplaced.io/connection-hold;
	// hostNetwork pods are off unless they opt in.
	ConnectionHold string `json:"connectionHold"`
	// HoldMax is the longest a connection hold lasts (annotation
	// inplaced.io/hold-max); then the port is released as it is.
	HoldMax Duration `json:"holdMax"`
	// RequireListeners: a swap (not kubelet-driven) whose new container has
	// not listened by HoldMax on every port the old one listened on rolls
	// back, keeping the held connections for the rolled-back container.
	// Pods opt out with the annotation inplaced.io/require-listeners:
	// "false".
	RequireListeners bool `json:"requireListeners"`
	// SwapStrategy is the node's default strategy: stop-first (stop the
	// old container, then start the new one, with the connection hold) or
	// overlap (start the new one while the old one runs and hand it the old
	// one's listening sockets). Pods ask with the annotation
	// inplaced.io/swap-strategy, a request with its own.
	SwapStrategy string `json:"swapStrategy"`
	// TakeoverSocket is the unix socket of the overlap swap's takeover
	// agent, which runc connects to (the trap's listenerPath), mode 0600;
	// empty: takeover.sock beside the control socket.
	TakeoverSocket string `json:"takeoverSocket"`
}

// Default returns the configuration used when nothing is set.
func Default() Config {
	return Config{
		Listen:           "/run/inplaced/inplaced.sock",
		RuntimeEndpoint:  "unix:///run/containerd/containerd.sock",
		StateDir:         "/var/lib/inplaced",
		ControlSocket:    "/run/inplaced/control.sock",
		LogLevel:         "info",
		LogFormat:        "json",
		ShutdownGrace:    Duration(10 * time.Second),
		HealthMinRuntime: Duration(3 * time.Second),
		FenceTimeout:     Duration(2 * time.Minute),
		CgroupRoot:       "/sys/fs/cgroup",
		OnPullFailure:    "keep-running",
		AffinityDrift:    "warn",
		KubeletRootDir:   "/var/lib/kubelet",
		Relay:            "router",
		ConnectionHold:   string(holdmode.Default),
		HoldMax:          Duration(10 * time.Second),
		RequireListeners: true,
		SwapStrategy:     string(strategy.Default),
	}
}

// EffectiveNodeName is NodeName, defaulted like kubelet's: the hostname,
// lower-cased.
func (c Config) EffectiveNodeName() (string, error) {
	if c.NodeName != "" {
		return c.NodeName, nil
	}
	h, err := os.Hostname()
	if err != nil {
		return "", fmt.Errorf("node name: no --node-name and no hostname: %w", err)
	}
	return strings.ToLower(strings.TrimSpace(h)), nil
}

// Load reads a YAML file over the defaults. A missing file at the default
// path is not an error; a missing file that was asked for is.
func Load(path string, explicit bool) (Config, error) {
	cfg := Default()
	data, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) && !explicit {
			return cfg, nil
		}
		return cfg, fmt.Errorf("read config %s: %w", path, err)
	}
	if err := yaml.UnmarshalStrict(data, &cfg); err != nil {
		return cfg, fmt.Errorf("parse config %s: %w", path, err)
	}
	if err := foldOlderSpellings(data, &cfg); err != nil {
		return cfg, fmt.Errorf("config %s: %w", path, err)
	}
	return cfg, nil
}

// foldOlderSpellings moves a key's older spelling to the current one; both
// in one file is refused, since one of them would be silently ignored.
func foldOlderSpellings(data []byte, cfg *Config) error {
	var given struct {
		Grace   *Duration `json:"shutdownGrace"`
		Timeout *Duration `json:"shutdownTimeout"`
	}
	if err := yaml.Unmarshal(data, &given); err != nil {
		return err
	}
	if given.Timeout == nil {
		return nil
	}
	if given.Grace != nil {
		return errors.New("both shutdownGrace and shutdownTimeout (its older spelling) are set: keep shutdownGrace")
	}
	cfg.ShutdownGrace, cfg.ShutdownTimeout = *given.Timeout, 0
	return nil
}

// EffectiveTakeoverSocket is the takeover agent's socket, defaulted to
// takeover.sock beside the control socket.
func (c Config) EffectiveTakeoverSocket() string {
	if c.TakeoverSocket == "" {
		return filepath.Join(filepath.Dir(c.ControlSocket), "takeover.sock")
	}
	return c.TakeoverSocket
}

// EffectiveImageEndpoint is the image endpoint, defaulted to the runtime's.
func (c Config) EffectiveImageEndpoint() string {
	if c.ImageEndpoint == "" {
		return c.RuntimeEndpoint
	}
	return c.ImageEndpoint
}

// Validate reports every problem at once.
func (c Config) Validate() error {
	var errs []error
	for _, check := range []func() []error{
		c.socketProblems, c.endpointProblems, c.wordProblems, c.holdProblems, c.strategyProblems,
		c.metricsProblems, c.kubernetesProblems, c.timeoutProblems,
	} {
		errs = append(errs, check()...)
	}
	return errors.Join(errs...)
}

// socketProblems: inplaced's own paths are absolute, its two sockets apart.
func (c Config) socketProblems() []error {
	var errs []error
	for _, s := range []struct{ name, path string }{
		{"listen", c.Listen}, {"control-socket", c.ControlSocket}, {"state-dir", c.StateDir},
	} {
		if s.path == "" || !filepath.IsAbs(s.path) {
			errs = append(errs, fmt.Errorf("--%s %q: must be an absolute path", s.name, s.path))
		}
	}
	if c.Listen != "" && c.Listen == c.ControlSocket {
		errs = append(errs, fmt.Errorf("--listen and --control-socket are both %q: give them different paths", c.Listen))
	}
	return errs
}

// endpointProblems: the backend's endpoints are unix sockets other than
// inplaced's own.
func (c Config) endpointProblems() []error {
	var errs []error
	for _, e := range []struct{ name, ep string }{
		{"runtime-endpoint", c.RuntimeEndpoint}, {"image-endpoint", c.EffectiveImageEndpoint()},
	} {
		if !strings.HasPrefix(e.ep, "unix://") && !strings.HasPrefix(e.ep, "/") {
			errs = append(errs, fmt.Errorf("--%s %q: want unix:///path/to.sock", e.name, e.ep))
		}
		if strings.TrimPrefix(e.ep, "unix://") == c.Listen {
			errs = append(errs, fmt.Errorf("--%s points at inplaced's own --listen socket %q: that would loop", e.name, c.Listen))
		}
	}
	return errs
}

// wordProblems: the flags that take one of a few words, with the words in
// the order the error lists them.
func (c Config) wordProblems() []error {
	var errs []error
	for _, e := range []struct {
		name, value string
		want        []string
	}{
		{"log-level", c.LogLevel, []string{"debug", "info", "warn", "error"}},
		{"log-format", c.LogFormat, []string{"json", "console"}},
		{"on-pull-failure", c.OnPullFailure, []string{"keep-running", "pass-through"}},
		{"affinity-drift", c.AffinityDrift, []string{"warn", "refuse"}},
		{"relay", c.Relay, []string{"router (the default)", "grpc"}},
	} {
		if !slices.ContainsFunc(e.want, func(w string) bool { first, _, _ := strings.Cut(w, " "); return first == e.value }) {
			errs = append(errs, fmt.Errorf("--%s %q: want %s", e.name, e.value, oneOf(e.want)))
		}
	}
	return errs
}

// holdProblems: a swap's connection hold, its mode (read as the swap
// engine and the pod annotation read it) and its bound.
func (c Config) holdProblems() []error {
	var errs []error
	if _, err := holdmode.Parse(c.ConnectionHold); err != nil {
		errs = append(errs, fmt.Errorf("--connection-hold %w", err))
	}
	return append(errs, c.holdMaxProblems()...)
}

// strategyProblems: the node's default swap strategy (read as the swap
// engine and the pod annotation read it) and the takeover agent's socket.
func (c Config) strategyProblems() []error {
	var errs []error
	if _, err := strategy.Parse(c.SwapStrategy); err != nil {
		errs = append(errs, fmt.Errorf("--swap-strategy %w", err))
	}
	if c.TakeoverSocket != "" && !filepath.IsAbs(c.TakeoverSocket) {
		errs = append(errs, fmt.Errorf("takeoverSocket %q: must be an absolute path (or empty: beside the control socket)", c.TakeoverSocket))
	}
	for _, other := range []string{c.Listen, c.ControlSocket} {
		if c.EffectiveTakeoverSocket() == other {
			errs = append(errs, fmt.Errorf("takeoverSocket %q is also --listen or --control-socket: give it a path of its own", other))
		}
	}
	return errs
}

// holdMaxProblems: the bound of a swap's connection hold.
func (c Config) holdMaxProblems() []error {
	if c.HoldMax <= 0 || c.HoldMax.D() > 5*time.Minute {
		return []error{fmt.Errorf("--hold-max %s: want a duration above 0 and up to 5m, e.g. 10s", c.HoldMax.D())}
	}
	return nil
}

// metricsProblems: the metrics address, when given, is host:port.
func (c Config) metricsProblems() []error {
	if c.MetricsListen == "" {
		return nil
	}
	if _, port, err := net.SplitHostPort(c.MetricsListen); err != nil || port == "" {
		return []error{fmt.Errorf("--metrics-listen %q: want host:port, e.g. 127.0.0.1:9470", c.MetricsListen)}
	}
	return nil
}

// kubernetesProblems: the kubeconfig, kubelet's credential-provider
// settings and the runtime classes.
func (c Config) kubernetesProblems() []error {
	var errs []error
	if c.Kubeconfig != "" {
		// A file that does not exist yet is fine: on k3s it is written once
		// the node runs, which needs inplaced's CRI socket first; the daemon
		// waits for it.
		if st, err := os.Stat(c.Kubeconfig); err == nil && st.IsDir() {
			errs = append(errs, fmt.Errorf("--kubeconfig %q is a directory: give the kubeconfig file", c.Kubeconfig))
		}
	}
	errs = append(errs, c.credentialProviderProblems()...)
	if _, err := c.RuntimeClassTable(); err != nil {
		errs = append(errs, err)
	}
	return errs
}

// credentialProviderProblems: kubelet's two credential-provider values,
// both or neither, each there.
func (c Config) credentialProviderProblems() []error {
	var errs []error
	if (c.ImageCredentialProviderConfig == "") != (c.ImageCredentialProviderBinDir == "") {
		errs = append(errs, fmt.Errorf("--image-credential-provider-config %q and --image-credential-provider-bin-dir %q: give both (kubelet's values) or neither",
			c.ImageCredentialProviderConfig, c.ImageCredentialProviderBinDir))
	}
	for _, f := range []struct{ name, path string }{
		{"image-credential-provider-config", c.ImageCredentialProviderConfig}, {"image-credential-provider-bin-dir", c.ImageCredentialProviderBinDir},
	} {
		if f.path == "" {
			continue
		}
		if _, err := os.Stat(f.path); err != nil {
			errs = append(errs, fmt.Errorf("--%s: %w (give kubelet's value)", f.name, err))
		}
	}
	return errs
}

// timeoutProblems: the timeouts that must be positive.
func (c Config) timeoutProblems() []error {
	if c.ShutdownGrace <= 0 || c.FenceTimeout <= 0 || c.HealthMinRuntime < 0 {
		return []error{errors.New("shutdownGrace (--shutdown-grace) and fenceTimeout must be positive, healthMinRuntime not negative")}
	}
	return nil
}

// RuntimeClass is one entry of runtimeClasses.
type RuntimeClass struct {
	// Handler is a CRI runtime handler name, or a prefix ending in "*"
	// ("kata*"); "" is CRI's default handler.
	Handler string `json:"handler"`
	// Enforcement is container-cgroups, sandbox-cgroup or vm.
	Enforcement string `json:"enforcement"`
	// NetworkStack is whose network stack the sandbox's sockets live in:
	// host-kernel (the pod's network namespace, where a swap's connection
	// hold sees the new process listen) or sandbox (a stack of the
	// sandbox's own: the hold is off). Empty: host-kernel for
	// container-cgroups, sandbox for sandbox-cgroup and vm.
	NetworkStack string `json:"networkStack"`
	// PodOverhead is added to the sum of the containers' limits for a
	// sandbox-cgroup pod whose sandbox config declares no overhead of its own
	// (kubelet passes a RuntimeClass's overhead there).
	PodOverhead struct {
		CPU    *resource.Quantity `json:"cpu"`
		Memory *resource.Quantity `json:"memory"`
	} `json:"podOverhead"`
}

// RuntimeClassTable is the runtime class table of runtimeClasses and
// vmRuntimeHandlers, with errors that say which entry to fix.
func (c Config) RuntimeClassTable() (*runtimeclass.Table, error) {
	var classes []runtimeclass.Class
	named := map[string]bool{}
	for _, rc := range c.RuntimeClasses {
		cl := runtimeclass.Class{Handler: rc.Handler, Enforcement: runtimeclass.Enforcement(rc.Enforcement),
			NetworkStack: runtimeclass.NetworkStack(rc.NetworkStack)}
		if q := rc.PodOverhead.CPU; q != nil {
			cl.Overhead.CPUMillis = q.MilliValue()
		}
		if q := rc.PodOverhead.Memory; q != nil {
			cl.Overhead.MemoryBytes = q.Value()
		}
		classes = append(classes, cl)
		named[rc.Handler] = true
	}
	for _, h := range c.VMRuntimeHandlers {
		if !named[h] {
			classes = append(classes, runtimeclass.Class{Handler: h, Enforcement: runtimeclass.VM})
			named[h] = true
		}
	}
	return runtimeclass.New(classes)
}

// Duration is a time.Duration that reads "10s" from YAML.
type Duration time.Duration

// D returns the time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// MarshalJSON writes the duration as a string.
func (d Duration) MarshalJSON() ([]byte, error) {
	return []byte(`"` + time.Duration(d).String() + `"`), nil
}

// UnmarshalJSON reads "10s". A bare number (but 0) is refused: it would mean
// nanoseconds, which is never what a "shutdownGrace: 10" means.
func (d *Duration) UnmarshalJSON(b []byte) error {
	s := strings.Trim(string(b), `"`)
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("duration %s: %w (write e.g. \"10s\")", b, err)
	}
	*d = Duration(v)
	return nil
}

// oneOf lists words as "a, b or c".
func oneOf(words []string) string {
	if len(words) < 2 {
		return strings.Join(words, "")
	}
	return strings.Join(words[:len(words)-1], ", ") + " or " + words[len(words)-1]
}
