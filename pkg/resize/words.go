package resize

import (
	"fmt"

	"github.com/inplaced/inplaced/pkg/runtimeclass"
)

// The words every view of a resize uses (inplacectl resize and resizes, ps,
// Events, metrics): where the limit is enforced, by what, verified how.
const (
	EnforcedContainer = "on the host, per container"
	EnforcedSandbox   = "on the host, for the whole sandbox"
	EnforcedRuntime   = "by the runtime, not on the host"

	VerifiedReadBack       = "read back from the cgroup files"
	VerifiedRuntimeOnly    = "requested from the runtime, not verified on the host"
	VerifiedKubeletSandbox = "pod cgroup read after the runtime's update (kubelet sets it: raised before this call, lowered after it)"
)

// describe fills the record's enforced, enforced_by and verified from the
// method the resize took.
func (o *op) describe() {
	r := o.rec
	switch r.Method {
	case MethodCgroup:
		r.Enforced, r.EnforcedBy, r.Verified = EnforcedContainer, "container cgroup "+o.cgroupsPath, VerifiedReadBack
	case MethodSandbox:
		r.Enforced = EnforcedSandbox
		r.EnforcedBy = fmt.Sprintf("pod cgroup %s, which holds the whole %s sandbox; no limit is enforced per container", o.sandboxCgroup, handlerName(o.class.Handler))
		r.Verified = VerifiedReadBack
		if !o.exactPod {
			r.Verified = VerifiedKubeletSandbox
		}
	case MethodBackend:
		r.Enforced = EnforcedRuntime
		r.EnforcedBy = fmt.Sprintf("runtime handler %s (UpdateContainerResources)", handlerName(o.class.Handler))
		r.Verified = VerifiedRuntimeOnly
		if o.class.Enforcement == runtimeclass.Unknown {
			r.Verified += fmt.Sprintf("; handler %q is in no runtime class table: declare it under runtimeClasses in the config file", o.class.Handler)
		}
	}
}

func handlerName(h string) string {
	if h == "" {
		return "default"
	}
	return h
}
