package swap

import (
	"context"
	"fmt"
	"slices"
	"strings"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/pkg/runtimeclass"
	"github.com/inplaced/inplaced/pkg/strategy"
)

// askedStrategy is the strategy a swap is asked for and where that came
// from: the request's own, else the pod's annotation, else the node's
// default. A request's value was checked at Start; an annotation that
// does not parse is ignored, and the note says so.
func askedStrategy(requested string, annotations map[string]string, node strategy.Strategy) (strategy.Strategy, string) {
	if s, err := strategy.Parse(requested); err == nil {
		return s, "asked for by the request"
	}
	v, ok := annotations[strategy.Annotation]
	if !ok {
		return node, "the node's default (--swap-strategy)"
	}
	if s, err := strategy.Parse(v); err == nil {
		return s, "asked for by the pod's annotation " + strategy.Annotation
	}
	return node, fmt.Sprintf("the node's default (--swap-strategy); annotation %s=%q ignored: use %s", strategy.Annotation, v, strategy.Choices())
}

// strategyInput is what decideStrategy decides from.
type strategyInput struct {
	requested   string            // the request's own ("": none)
	annotations map[string]string // the pod's
	node        strategy.Strategy // --swap-strategy
	kind        string
	class       runtimeclass.Class
	handler     string
	agent       string // why the takeover agent does not run ("": it does)
	config      *runtimeapi.ContainerConfig
}

// decideStrategy is the strategy a swap runs by what is known without
// reading anything, and why: overlap only when asked for and nothing in
// overlapBlocker stands in the way (the run checks the rest: the pod's
// limits and profile, the old container's ports).
func decideStrategy(in strategyInput) (strategy.Strategy, string) {
	asked, from := askedStrategy(in.requested, in.annotations, in.node)
	if asked != strategy.Overlap {
		return asked, from
	}
	if why := overlapBlocker(in.class, in.handler, in.agent, in.config); why != "" {
		return strategy.StopFirst, notPossible(from, why)
	}
	return asked, from
}

// notPossible is the record's word for an overlap that became stop-first
// before anything was touched.
func notPossible(from, why string) string {
	return fmt.Sprintf("overlap %s, not possible: %s; stop-first with the connection hold", from, why)
}

// overlapBlocker says why a swap asked to overlap cannot, from what is
// known without asking the runtime: the runtime class
// (the trap is a seccomp filter of the host kernel: a runtime whose
// containers' syscalls never reach it cannot be trapped), the agent, and
// the container's privileges. "" when nothing stands in the way.
func overlapBlocker(class runtimeclass.Class, handler string, agent string, cfg *runtimeapi.ContainerConfig) string {
	switch {
	case class.Enforcement != runtimeclass.ContainerCgroups:
		return fmt.Sprintf("runtime %s has no host-side seccomp: its containers' syscalls do not reach the host kernel's filter (runtime class %s)",
			handlerName(handler), class.Enforcement)
	case agent != "":
		return "agent not running: " + agent
	case cfg.GetLinux().GetSecurityContext().GetPrivileged():
		return "the container is privileged: the runtime applies no seccomp profile to it"
	}
	return ""
}

func handlerName(h string) string {
	if h == "" {
		return "(the runtime's default)"
	}
	return h
}

// memoryFits says why a pod's memory limit cannot hold the running
// containers and a second copy of one of them, or "". Only memory is
// checked: a CPU quota exceeded for the overlap throttles, a memory limit
// exceeded kills. pod <= 0: the pod has no memory limit.
func memoryFits(pod, running, own int64) string {
	switch {
	case pod <= 0:
		return ""
	case own <= 0:
		return fmt.Sprintf("pod limits do not hold both containers: the pod's memory limit is %d bytes and the container has none", pod)
	case running+own > pod:
		return fmt.Sprintf("pod limits do not hold both containers: the pod's memory limit is %d bytes, its running containers' %d, the new container's %d",
			pod, running, own)
	}
	return ""
}

// podMemory sums the memory limits of the sandbox's running containers as
// the runtime reports them.
func (e *Engine) podMemory(ctx context.Context, sandboxID string) (int64, error) {
	resp, err := e.rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{
		PodSandboxId: sandboxID, State: &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_RUNNING}}})
	if err != nil {
		return 0, fmt.Errorf("list the pod's containers: %w", err)
	}
	var sum int64
	for _, c := range resp.Containers {
		st, err := e.rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: c.Id})
		if err != nil {
			return 0, fmt.Errorf("container status %s: %w", short(c.Id), err)
		}
		m := st.GetStatus().GetResources().GetLinux().GetMemoryLimitInBytes()
		if m <= 0 {
			return 0, fmt.Errorf("the runtime reports no memory limit for container %s", short(c.Id))
		}
		sum += m
	}
	return sum, nil
}

// defaultCaps are the capabilities containerd gives a container that adds
// and drops none: RuntimeDefault's seccomp rules depend on them.
var defaultCaps = []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW",
	"CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE"}

// profileCaps are the capabilities RuntimeDefault's rules depend on: what
// "ALL" adds, as far as the profile can tell.
var profileCaps = []string{"CAP_SYS_ADMIN", "CAP_SYS_BOOT", "CAP_SYS_CHROOT", "CAP_SYS_MODULE", "CAP_SYS_PACCT",
	"CAP_SYS_PTRACE", "CAP_SYS_RAWIO", "CAP_SYS_TIME", "CAP_SYS_TTY_CONFIG", "CAP_SYS_NICE", "CAP_SYSLOG", "CAP_BPF", "CAP_PERFMON"}

// seccompBase is the container's own seccomp profile, as containerd would
// apply it: the new container keeps every rule of it and gains the trap.
func seccompBase(cfg *runtimeapi.ContainerConfig) (SeccompBase, error) {
	sc := cfg.GetLinux().GetSecurityContext()
	b := SeccompBase{Kind: runtimeapi.SecurityProfile_Unconfined}
	switch p := sc.GetSeccomp(); {
	case p != nil:
		b.Kind, b.Path = p.GetProfileType(), p.GetLocalhostRef()
	case sc.GetSeccompProfilePath() != "": // the deprecated spelling
		b.Kind, b.Path = legacySeccomp(sc.GetSeccompProfilePath())
	}
	if b.Kind == runtimeapi.SecurityProfile_Localhost && b.Path == "" {
		return b, fmt.Errorf("the container's Localhost seccomp profile names no file")
	}
	if b.Kind == runtimeapi.SecurityProfile_RuntimeDefault {
		b.Capabilities = capabilities(sc.GetCapabilities())
	}
	return b, nil
}

func legacySeccomp(path string) (runtimeapi.SecurityProfile_ProfileType, string) {
	switch {
	case path == "runtime/default" || path == "docker/default":
		return runtimeapi.SecurityProfile_RuntimeDefault, ""
	case strings.HasPrefix(path, "localhost/"):
		return runtimeapi.SecurityProfile_Localhost, strings.TrimPrefix(path, "localhost/")
	}
	return runtimeapi.SecurityProfile_Unconfined, ""
}

// capabilities is the container's bounding set as containerd builds it.
func capabilities(c *runtimeapi.Capability) []string {
	caps := slices.Clone(defaultCaps)
	norm := func(s string) string {
		s = strings.ToUpper(s)
		if !strings.HasPrefix(s, "CAP_") {
			s = "CAP_" + s
		}
		return s
	}
	for _, a := range c.GetAddCapabilities() {
		add := []string{norm(a)}
		if add[0] == "CAP_ALL" {
			add = profileCaps
		}
		for _, n := range add {
			if !slices.Contains(caps, n) {
				caps = append(caps, n)
			}
		}
	}
	for _, d := range c.GetDropCapabilities() {
		n := norm(d)
		caps = slices.DeleteFunc(caps, func(s string) bool { return n == "CAP_ALL" || s == n })
	}
	return caps
}
