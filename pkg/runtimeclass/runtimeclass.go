// Package runtimeclass says what a CRI runtime handler's sandboxes are: where
// their CPU and memory limits are enforced, so that a resize writes where the
// limit takes effect and never reports a limit that nothing enforces; and
// whose network stack their containers' sockets live in, so that a swap
// holds new connections only where it can see the new process listen.
//
// Three kinds of runtime, by what a host cgroup governs:
//
//   - ContainerCgroups (runc, crun): every container's processes sit in a
//     host cgroup of their own; its files are the container's limit.
//   - SandboxCgroup (gVisor's runsc; Kata with sandbox_cgroup_only): the
//     host governs only the whole sandbox, through the pod cgroup that
//     contains it (gVisor's sentry and its stub processes, or the VMM). runsc applies
//     an update to the pod's root (pause) container only; for the others it
//     just saves the spec. A per-container limit is enforced by nothing.
//   - VM (Kata): the runtime hot-plugs vCPUs and memory for the sum of the
//     containers' limits and sets cgroups inside the guest; no host cgroup
//     contains a container, so nothing can be read back on the host.
//
// A handler in no table is Unknown and treated like VM: resized through the
// runtime only, and nothing is claimed as verified.
//
// Two network stacks, by where a container's listening socket lives:
//
//   - HostKernel (runc, crun): the host kernel's, in the pod's network
//     namespace, where a connection hold sees it.
//   - SandboxStack (gVisor's runsc, whose sentry runs a TCP/IP stack of its
//     own; Kata, whose VM runs its own kernel): inside the sandbox, where
//     nothing in the pod's network namespace sees it listen.
//
// The two are independent (gVisor with network=host governs its limits as a
// sandbox and listens on the host kernel), so each class says both; a
// configured class that names no stack gets the one every known runtime of
// its enforcement kind has (see New). An Unknown class has no stack either:
// the hold is tried, as for a runtime not known to hide its sockets.
//
// Lookup order: the configured classes (exact names, then "prefix*"
// patterns), the built-in table by handler name, the runtime type containerd
// reports for the sandbox (io.containerd.runc.v2, io.containerd.runsc.v1,
// io.containerd.kata*.v2), then CRI's empty handler (the runtime's default,
// runc unless configured otherwise), else Unknown.
package runtimeclass

import (
	"errors"
	"fmt"
	"strings"
)

// Enforcement is where a class's limits are enforced.
type Enforcement string

// The enforcement kinds (see the package documentation).
const (
	ContainerCgroups Enforcement = "container-cgroups"
	SandboxCgroup    Enforcement = "sandbox-cgroup"
	VM               Enforcement = "vm"
	Unknown          Enforcement = "unknown"
)

// NetworkStack is whose TCP/IP stack a sandbox's sockets live in.
type NetworkStack string

// The network stacks (see the package documentation); "" is not known.
const (
	HostKernel   NetworkStack = "host-kernel"
	SandboxStack NetworkStack = "sandbox"
)

// Overhead is what a sandbox needs beyond its containers' limits (a
// RuntimeClass's pod overhead): added to their sum for the pod cgroup.
type Overhead struct {
	CPUMillis   int64
	MemoryBytes int64
}

// Class is how one runtime handler (or a "prefix*" pattern) is governed.
type Class struct {
	// Handler is the CRI runtime handler name, or a prefix ending in "*".
	// The empty name is CRI's default handler.
	Handler     string
	Enforcement Enforcement
	// NetworkStack is whose network stack the sandbox's sockets live in;
	// "" when not known (Unknown).
	NetworkStack NetworkStack
	// Overhead is used when the pod declares none in its sandbox config
	// (kubelet passes a RuntimeClass's overhead there).
	Overhead Overhead
	// Source says where the class came from: "config", "built-in" or
	// "runtime type <type>"; empty for Unknown.
	Source string
}

// Builtin is the table used for handlers the configuration does not name.
func Builtin() []Class {
	return []Class{
		{Handler: "runc", Enforcement: ContainerCgroups, NetworkStack: HostKernel},
		{Handler: "crun", Enforcement: ContainerCgroups, NetworkStack: HostKernel},
		{Handler: "runsc", Enforcement: SandboxCgroup, NetworkStack: SandboxStack},
		{Handler: "gvisor", Enforcement: SandboxCgroup, NetworkStack: SandboxStack},
		{Handler: "kata*", Enforcement: VM, NetworkStack: SandboxStack},
	}
}

// runtimeTypes maps containerd runtime types (shim names) to a class, for
// handlers named in no table.
var runtimeTypes = []struct {
	prefix string
	e      Enforcement
	stack  NetworkStack
}{
	{"io.containerd.runc.", ContainerCgroups, HostKernel},
	{"io.containerd.crun.", ContainerCgroups, HostKernel},
	{"io.containerd.runsc.", SandboxCgroup, SandboxStack},
	{"io.containerd.kata", VM, SandboxStack},
}

// Table looks classes up.
type Table struct {
	configured []Class
	builtin    []Class
}

// New validates the configured classes and returns a table with them in
// front of the built-in ones. A configured class that names no network
// stack gets the one of every runtime known of its kind: the host kernel's
// for container-cgroups (runc, crun), the sandbox's own for sandbox-cgroup
// and vm (gVisor, Kata); a runtime that differs says so.
func New(configured []Class) (*Table, error) {
	var errs []error
	seen := map[string]bool{}
	for i, c := range configured {
		if err := c.validate(); err != nil {
			errs = append(errs, fmt.Errorf("runtimeClasses[%d]: %w", i, err))
		}
		if seen[c.Handler] {
			errs = append(errs, fmt.Errorf("runtimeClasses[%d]: handler %q is listed twice: keep one entry", i, c.Handler))
		}
		seen[c.Handler] = true
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	t := &Table{builtin: Builtin()}
	for _, c := range configured {
		c.Source = "config"
		if c.NetworkStack == "" {
			c.NetworkStack = SandboxStack
			if c.Enforcement == ContainerCgroups {
				c.NetworkStack = HostKernel
			}
		}
		t.configured = append(t.configured, c)
	}
	for i := range t.builtin {
		t.builtin[i].Source = "built-in"
	}
	return t, nil
}

func (c Class) validate() error {
	switch c.Enforcement {
	case ContainerCgroups, SandboxCgroup, VM:
	default:
		return fmt.Errorf("handler %q: enforcement %q: want %s, %s or %s", c.Handler, c.Enforcement, ContainerCgroups, SandboxCgroup, VM)
	}
	switch c.NetworkStack {
	case "", HostKernel, SandboxStack:
	default:
		return fmt.Errorf("handler %q: network stack %q: want %s or %s", c.Handler, c.NetworkStack, HostKernel, SandboxStack)
	}
	if i := strings.Index(c.Handler, "*"); i >= 0 && i != len(c.Handler)-1 {
		return fmt.Errorf("handler %q: \"*\" may only end a pattern (e.g. kata*)", c.Handler)
	}
	if c.Overhead.CPUMillis < 0 || c.Overhead.MemoryBytes < 0 {
		return fmt.Errorf("handler %q: negative pod overhead", c.Handler)
	}
	return nil
}

// OwnNetworkStack reports whether the sandbox runs a network stack of its
// own, whose sockets the pod's network namespace does not show.
func (c Class) OwnNetworkStack() bool { return c.NetworkStack == SandboxStack }

// Lookup returns the class of a sandbox's handler; runtimeType is the
// runtime type containerd reports for it (may be empty).
func (t *Table) Lookup(handler, runtimeType string) Class {
	if c, ok := match(t.configured, handler); ok {
		return c
	}
	if c, ok := match(t.builtin, handler); ok {
		return c
	}
	for _, rt := range runtimeTypes {
		if runtimeType != "" && strings.HasPrefix(runtimeType, rt.prefix) {
			return Class{Handler: handler, Enforcement: rt.e, NetworkStack: rt.stack, Source: "runtime type " + runtimeType}
		}
	}
	if handler == "" {
		return Class{Handler: handler, Enforcement: ContainerCgroups, NetworkStack: HostKernel, Source: "built-in"}
	}
	return Class{Handler: handler, Enforcement: Unknown}
}

// match finds handler among cs: an exact name first, then the longest
// "prefix*" pattern.
func match(cs []Class, handler string) (Class, bool) {
	best, found := Class{}, false
	for _, c := range cs {
		if c.Handler == handler {
			return c, true
		}
		if p, ok := strings.CutSuffix(c.Handler, "*"); ok && strings.HasPrefix(handler, p) && (!found || len(c.Handler) > len(best.Handler)) {
			best, found = c, true
		}
	}
	if found {
		best.Handler = handler
	}
	return best, found
}
