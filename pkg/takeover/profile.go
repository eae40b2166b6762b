package takeover

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/inplaced/inplaced/pkg/takeover/internal/seccomp"
)

// MaxSwapLen bounds a profile's swap name: it travels in every notify fd's
// name (see File), which systemd's fd store limits to 255 characters.
const MaxSwapLen = 64

// Errors of Profile: the pod's own profile does not let a trap be added
// without changing what it allows, so the swap cannot take the socket over.
var (
	// ErrBindRestricted: the pod's profile denies bind, or allows it only
	// for some arguments; a notify rule would allow every bind.
	ErrBindRestricted = errors.New("the pod's seccomp profile restricts bind")
	// ErrHasListener: the pod's profile already hands its notifications to
	// an agent of its own; a filter has one listener.
	ErrHasListener = errors.New("the pod's seccomp profile already has a listener")
)

// RuntimeDefault is containerd's default profile (what a pod's
// RuntimeDefault gets) for a container with the bounding capability set
// bounding ("CAP_SYS_ADMIN" adds mount and others, as containerd does).
func RuntimeDefault(bounding []string) *specs.LinuxSeccomp {
	return seccomp.DefaultProfile(&specs.Spec{Process: &specs.Process{
		Capabilities: &specs.LinuxCapabilities{Bounding: bounding},
	}})
}

// Unconfined is the base of a pod whose profile is Unconfined: everything
// allowed, so that the trap is the only rule.
func Unconfined() *specs.LinuxSeccomp {
	return &specs.LinuxSeccomp{DefaultAction: specs.ActAllow}
}

// Profile is the seccomp profile of the new container of swap: the pod's
// own profile base (RuntimeDefault, a Localhost profile's content or
// Unconfined) with every bind() notified to the agent listening at
// listener. The result is the JSON of a Localhost profile, the
// runtime-spec LinuxSeccomp that containerd copies into the container's
// spec as it is (listenerPath and listenerMetadata included).
//
// Nothing but bind changes: bind must be allowed unconditionally by base,
// and the trap answers every bind the agent does not take over as the
// kernel would have. base is not modified.
func Profile(base *specs.LinuxSeccomp, listener, swap string) ([]byte, error) {
	p, err := withTrap(base, listener, swap)
	if err != nil {
		return nil, err
	}
	b, err := json.Marshal(p)
	if err != nil {
		return nil, fmt.Errorf("seccomp profile of swap %s: %w", swap, err)
	}
	return b, nil
}

// withTrap builds Profile's value.
func withTrap(base *specs.LinuxSeccomp, listener, swap string) (*specs.LinuxSeccomp, error) {
	switch {
	case base == nil:
		return nil, errors.New("seccomp profile: no base profile")
	case !filepath.IsAbs(listener):
		return nil, fmt.Errorf("seccomp profile: agent socket %q is not an absolute path", listener)
	case swap == "" || len(swap) > MaxSwapLen:
		return nil, fmt.Errorf("seccomp profile: swap name %q: want 1 to %d bytes", swap, MaxSwapLen)
	case base.ListenerPath != "":
		return nil, fmt.Errorf("seccomp profile: %w (%s)", ErrHasListener, base.ListenerPath)
	}
	p, err := clone(base)
	if err != nil {
		return nil, err
	}
	if p.Syscalls, err = withoutBind(p.Syscalls, p.DefaultAction); err != nil {
		return nil, err
	}
	p.Syscalls = append(p.Syscalls, specs.LinuxSyscall{Names: []string{"bind"}, Action: specs.ActNotify})
	p.ListenerPath, p.ListenerMetadata = listener, swap
	return p, nil
}

// clone deep-copies a profile through its JSON form, the form it is used in.
func clone(p *specs.LinuxSeccomp) (*specs.LinuxSeccomp, error) {
	b, err := json.Marshal(p)
	if err != nil {
		return nil, fmt.Errorf("seccomp profile: %w", err)
	}
	var out specs.LinuxSeccomp
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, fmt.Errorf("seccomp profile: %w", err)
	}
	return &out, nil
}

// withoutBind drops bind from the rules, checking that they allow it
// whatever its arguments. libseccomp refuses two rules with different
// actions for one syscall, so the allow rule has to go for the notify rule
// to be added.
func withoutBind(rules []specs.LinuxSyscall, defaultAction specs.LinuxSeccompAction) ([]specs.LinuxSyscall, error) {
	allowed := allows(defaultAction)
	var out []specs.LinuxSyscall
	for _, r := range rules {
		if !slices.Contains(r.Names, "bind") {
			out = append(out, r)
			continue
		}
		if len(r.Args) > 0 || !allows(r.Action) {
			return nil, fmt.Errorf("seccomp profile: %w (a rule with action %s and %d argument conditions)",
				ErrBindRestricted, r.Action, len(r.Args))
		}
		allowed = true
		r.Names = slices.DeleteFunc(slices.Clone(r.Names), func(n string) bool { return n == "bind" })
		if len(r.Names) > 0 {
			out = append(out, r)
		}
	}
	if !allowed {
		return nil, fmt.Errorf("seccomp profile: %w (no rule allows it and the default action is %s)",
			ErrBindRestricted, defaultAction)
	}
	return out, nil
}

// allows reports whether an action lets the syscall run.
func allows(a specs.LinuxSeccompAction) bool { return a == specs.ActAllow || a == specs.ActLog }
