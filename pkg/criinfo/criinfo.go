// Package criinfo reads the verbose info containerd attaches to a
// ContainerStatus or PodSandboxStatus answer asked with verbose=true: the
// JSON document under the key "info". It is read here only, so that the
// swap engine and the resizer agree on what it says.
//
// The members used, the same on containerd 1.6 and 2.x (testdata has
// both, as each wrote them for one pod):
//
//	pid          the container's init, or the sandbox's process (pause
//	             under runc, the sentry under gVisor, the VMM under Kata)
//	sandboxID    a container's sandbox
//	runtimeType  the shim, e.g. io.containerd.runc.v2
//	config       the CRI config kubelet sent (ContainerConfig or
//	             PodSandboxConfig), as encoding/json wrote the CRI struct
//	runtimeSpec  the OCI spec: linux.cgroupsPath, linux.namespaces (the
//	             network namespace's path) and linux.resources, which every
//	             UpdateContainerResources moves
//
// Other runtimes (CRI-O, a fake) may say nothing: every accessor then
// gives the zero value, and Err says why.
package criinfo

import (
	"encoding/json"
	"errors"
	"fmt"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Reasons there is nothing to read.
var (
	// ErrNoInfo: the answer has no verbose info (not asked for, or a
	// runtime that gives none).
	ErrNoInfo = errors.New("no verbose info")
	// ErrNoConfig: the verbose info carries no CRI config.
	ErrNoConfig = errors.New("verbose info has no config")
)

// info is the part of the document read, for containers and sandboxes.
type info struct {
	Pid         int             `json:"pid"`
	SandboxID   string          `json:"sandboxID"`
	RuntimeType string          `json:"runtimeType"`
	Config      json.RawMessage `json:"config"`
	RuntimeSpec struct {
		Linux struct {
			CgroupsPath string `json:"cgroupsPath"`
			Namespaces  []struct {
				Type string `json:"type"`
				Path string `json:"path"`
			} `json:"namespaces"`
			Resources *struct {
				CPU *struct {
					Shares *uint64 `json:"shares"`
					Quota  *int64  `json:"quota"`
					Period *uint64 `json:"period"`
				} `json:"cpu"`
				Memory *struct {
					Limit *int64 `json:"limit"`
				} `json:"memory"`
			} `json:"resources"`
		} `json:"linux"`
	} `json:"runtimeSpec"`
}

// read decodes the verbose info of one answer. The config is kept as it is
// and decoded only when asked for: a config this build cannot decode must
// not hide the pid or the namespaces.
func read(m map[string]string) (info, error) {
	var in info
	raw := m["info"]
	if raw == "" {
		return in, ErrNoInfo
	}
	if err := json.Unmarshal([]byte(raw), &in); err != nil {
		return info{}, fmt.Errorf("decode verbose info: %w", err)
	}
	return in, nil
}

// netNS is the path of the network namespace the spec names ("" when it
// names none: the runtime made a new one).
func (in *info) netNS() string {
	var p string
	for _, ns := range in.RuntimeSpec.Linux.Namespaces {
		if ns.Type == "network" {
			p = ns.Path
		}
	}
	return p
}

// decodeConfig reads the CRI config into msg. containerd marshals the CRI
// Go structs with encoding/json, so the same structs read it back.
// KeyValue.value became []byte in cri-api v0.34, but cri-api's own
// MarshalJSON/UnmarshalJSON for KeyValue keep the pre-1.34 plain-string
// form, so containerd 1.x and 2.x write env values the same way and they
// decode as they are: no base64 rewriting, whatever the runtime version
// (TestKeyValueJSONIsPlainString pins it).
func (in *info) decodeConfig(msg any) error {
	if len(in.Config) == 0 || string(in.Config) == "null" {
		return ErrNoConfig
	}
	if err := json.Unmarshal(in.Config, msg); err != nil {
		return fmt.Errorf("decode config: %w", err)
	}
	return nil
}

// verbose is one answer's info, read, and why it is empty if it is: what
// Container and Sandbox have alike.
type verbose struct {
	in  info
	err error
}

func readVerbose(m map[string]string) verbose {
	in, err := read(m)
	return verbose{in: in, err: err}
}

// Err says why the info is empty: ErrNoInfo, or a decoding error.
func (v verbose) Err() error { return v.err }

// config decodes the CRI config the object was created with into cfg.
func config[T any](v verbose, cfg *T) (*T, error) {
	if v.err != nil {
		return nil, v.err
	}
	if err := v.in.decodeConfig(cfg); err != nil {
		return nil, err
	}
	return cfg, nil
}

// Container is containerd's verbose info about a container.
type Container struct{ verbose }

// ContainerOf reads the verbose info of a ContainerStatus answer
// (ContainerStatusResponse.Info). It never fails: what cannot be read is
// the zero value, and Err says why.
func ContainerOf(m map[string]string) Container { return Container{readVerbose(m)} }

// Pid is the container's init process on the host; 0 when not known.
func (c Container) Pid() int { return c.in.Pid }

// SandboxID is the container's pod sandbox.
func (c Container) SandboxID() string { return c.in.SandboxID }

// RuntimeType is the shim that runs the container, e.g. io.containerd.runc.v2.
func (c Container) RuntimeType() string { return c.in.RuntimeType }

// CgroupsPath is the container's cgroup as its OCI spec names it (a path,
// or slice:prefix:name under the systemd driver).
func (c Container) CgroupsPath() string { return c.in.RuntimeSpec.Linux.CgroupsPath }

// Limits are the CPU and memory limits of the container's OCI spec, as
// the runtime has them now (every UpdateContainerResources moves them,
// on 1.6 as on 2.x); nil when the spec has no resources.
func (c Container) Limits() *runtimeapi.LinuxContainerResources {
	r := c.in.RuntimeSpec.Linux.Resources
	if r == nil {
		return nil
	}
	out := &runtimeapi.LinuxContainerResources{}
	if cpu := r.CPU; cpu != nil {
		out.CpuShares, out.CpuQuota, out.CpuPeriod = int64(deref(cpu.Shares)), deref(cpu.Quota), int64(deref(cpu.Period))
	}
	if m := r.Memory; m != nil {
		out.MemoryLimitInBytes = deref(m.Limit)
	}
	return out
}

// Config is the CRI config the container was created with.
func (c Container) Config() (*runtimeapi.ContainerConfig, error) {
	return config(c.verbose, &runtimeapi.ContainerConfig{})
}

// Sandbox is containerd's verbose info about a pod sandbox.
type Sandbox struct{ verbose }

// SandboxOf reads the verbose info of a PodSandboxStatus answer
// (PodSandboxStatusResponse.Info). It never fails: what cannot be read is
// the zero value, and Err says why.
func SandboxOf(m map[string]string) Sandbox { return Sandbox{readVerbose(m)} }

// Pid is the sandbox's process: the pause process under runc, the sentry
// under gVisor, the VMM under Kata; 0 when not known.
func (s Sandbox) Pid() int { return s.in.Pid }

// RuntimeType is the shim that runs the sandbox, e.g. io.containerd.runsc.v1:
// it says what the sandbox is when its runtime handler's name does not.
func (s Sandbox) RuntimeType() string { return s.in.RuntimeType }

// NetNS is the path of the sandbox's network namespace (CNI's, under the
// runtime's state directory); "" when the spec names none.
func (s Sandbox) NetNS() string { return s.in.netNS() }

// Config is the CRI config the sandbox was created with (its pod overhead
// among it).
func (s Sandbox) Config() (*runtimeapi.PodSandboxConfig, error) {
	return config(s.verbose, &runtimeapi.PodSandboxConfig{})
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}
