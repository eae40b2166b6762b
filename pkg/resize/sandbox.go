package resize

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"strings"

	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/pkg/errkind"
	"github.com/inplaced/inplaced/pkg/resources"
	"github.com/inplaced/inplaced/pkg/runtimeclass"
	"github.com/inplaced/inplaced/pkg/swap"
)

// overhead is the pod overhead the sandbox config kubelet sent declares
// (kubelet passes its RuntimeClass's there), else def; cfg may be nil.
func overhead(cfg *runtimeapi.PodSandboxConfig, def runtimeclass.Overhead) runtimeclass.Overhead {
	oh := cfg.GetLinux().GetOverhead()
	if oh == nil || (oh.GetCpuQuota() <= 0 && oh.GetMemoryLimitInBytes() <= 0) {
		return def
	}
	var o runtimeclass.Overhead
	if q, p := oh.GetCpuQuota(), oh.GetCpuPeriod(); q > 0 && p > 0 {
		o.CPUMillis = q * 1000 / p
	}
	o.MemoryBytes = max(oh.GetMemoryLimitInBytes(), 0)
	return o
}

// viaSandbox is the sandbox method, for runtimes whose host cgroups govern
// only the whole sandbox (gVisor: the sentry and its stubs sit in the pod
// cgroup and runsc applies no limit per container; Kata with
// sandbox_cgroup_only). What can be enforced is the pod cgroup, so that is
// what is resized, to what kubelet would give it: the sum of the containers'
// limits plus the pod overhead. The runtime is called as kubelet would call
// it, so that its record (and Kata's hot-plug) follows.
//
// The control API resizes only a container that is alone in its sandbox:
// with others beside it a limit for that one container would be enforced by
// nothing. kubelet's calls pass through (kubelet sets the pod cgroup
// itself) and the pod cgroup is read afterwards for the record.
func (r *Resizer) viaSandbox(ctx context.Context, o *op) error {
	o.rec.Method = MethodSandbox
	t, err := resources.Target{CgroupsPath: o.cgroupsPath}.Sandbox()
	if err != nil {
		return readError(o.id, err)
	}
	cur, err := r.cg.Read(t) // Container: the pod cgroup; Pod: its parent
	if err != nil {
		return readError(o.id, err)
	}
	o.sandboxCgroup = cur.Container.Path
	o.rec.From = cgroupValues(cur.Container)
	o.rec.InEffect = o.rec.From
	lr := o.status.GetResources().GetLinux()
	if o.req == nil {
		o.req = &runtimeapi.UpdateContainerResourcesRequest{ContainerId: o.id, Linux: criResources(o.resources, uint64(lr.GetCpuPeriod()))}
	}
	want := resources.LimitsFromCRI(o.req.GetLinux())
	o.rec.Requested = targetValues(want, criValues(lr))
	if err := want.Validate(); err != nil {
		o.rec.Result = ResultRefused
		return errkind.Errorf(errkind.Invalid, "%v: nothing was changed", err)
	}
	if !o.exactPod {
		return r.sandboxForKubelet(ctx, o, t)
	}
	others, err := r.others(ctx, o)
	if err != nil {
		return err
	}
	if len(others) > 0 {
		o.rec.Result = ResultRefused
		return errkind.Errorf(errkind.Refused, "runtime handler %q (%s): the host enforces limits only for the whole sandbox, "+
			"and pod %s/%s has %d other container(s) in it (%s), so a limit for container %q alone would be enforced by nothing: nothing was changed. "+
			"Instead resize the pod as a whole through Kubernetes (kubectl patch pod %s --subresource resize: kubelet sets the sandbox's limit to the sum of its containers' limits), "+
			"or run %q in a pod of its own, where inplacectl resize sets the sandbox's limit to the container's plus the pod overhead",
			o.class.Handler, o.class.Enforcement, o.rec.Namespace, o.rec.Pod, len(others), strings.Join(others, ", "), o.rec.Container,
			o.rec.Pod, o.rec.Container)
	}
	podWant := sandboxLimits(want, o.overhead, cur.Container.CPUPeriod)
	o.rec.To = targetValues(podWant, o.rec.From)
	// The pod's parent (a QoS cgroup) only rises where the pod needs room.
	prev := &podWant
	if _, err := r.cg.Plan(cur, podWant, prev); err != nil {
		var ue *resources.UsageError
		switch {
		case errors.As(err, &ue):
			o.rec.Result = ResultRefused
			return errkind.Errorf(errkind.Refused,
				"the sandbox (pod cgroup %s) uses %d bytes of memory; the sandbox limit this asks for, %d bytes (the container's limit plus %d bytes of pod overhead), is not above that: nothing was changed",
				ue.Cgroup, ue.Usage, ue.Requested, o.overhead.MemoryBytes)
		case errors.Is(err, resources.ErrInvalidLimits):
			o.rec.Result = ResultRefused
			return errkind.Errorf(errkind.Invalid, "%v: nothing was changed", err)
		default:
			return errkind.Errorf(errkind.Internal, "plan the resize of sandbox %s: %v: nothing was changed", o.sandboxCgroup, err)
		}
	}

	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.timeout)
	defer cancel()
	// kubelet's order: a pod cgroup that grows is raised before the runtime
	// is called, one that shrinks is lowered after it.
	raise := raises(cur.Container, podWant)
	if !raise {
		if _, err := o.update(ctx, o.req); err != nil {
			return r.sandboxUndo(ctx, o, t, cur, lr, fmt.Errorf("runtime: %s", status.Convert(err).Message()))
		}
	}
	res, err := r.cg.Apply(ctx, t, podWant, prev)
	if err != nil {
		return r.sandboxUndo(ctx, o, t, cur, lr, err)
	}
	if raise {
		if _, err := o.update(ctx, o.req); err != nil {
			return r.sandboxUndo(ctx, o, t, cur, lr, fmt.Errorf("runtime: %s", status.Convert(err).Message()))
		}
	}
	after, err := r.verify(t, podWant)
	if err != nil {
		return r.sandboxUndo(ctx, o, t, cur, lr, err)
	}
	for _, w := range res.Writes {
		o.rec.Repaired = append(o.rec.Repaired, sandboxWrite(w))
	}
	o.rec.InEffect = cgroupValues(after.Container)
	o.rec.Result = ResultApplied
	return nil
}

// sandboxForKubelet passes kubelet's update to the runtime: kubelet resizes
// the pod cgroup itself (before a raise, after a lowering), so inplaced only
// reads it afterwards, for the record.
func (r *Resizer) sandboxForKubelet(ctx context.Context, o *op, t resources.Target) error {
	if _, err := o.update(ctx, o.req); err != nil {
		return err
	}
	o.rec.Result = ResultApplied
	if after, err := r.cg.Read(t); err == nil {
		o.rec.InEffect = cgroupValues(after.Container)
	}
	return nil
}

// sandboxUndo puts the pod cgroup and the runtime's record back after a
// failed sandbox resize; the error says what is in effect.
func (r *Resizer) sandboxUndo(ctx context.Context, o *op, t resources.Target, before resources.Current, lr *runtimeapi.LinuxContainerResources, cause error) error {
	var restoreErrs []error
	if lr != nil {
		if _, err := o.update(ctx, &runtimeapi.UpdateContainerResourcesRequest{ContainerId: o.id, Linux: lr}); err != nil {
			restoreErrs = append(restoreErrs, fmt.Errorf("runtime: %s", status.Convert(err).Message()))
		}
	}
	old := limitsOf(before.Container)
	if _, err := r.cg.Apply(ctx, t, old, &old); err != nil {
		restoreErrs = append(restoreErrs, err)
	}
	cur, err := r.verify(t, old)
	if err == nil && len(restoreErrs) == 0 {
		o.rec.InEffect = cgroupValues(cur.Container)
		return errkind.Errorf(errkind.Aborted, "resize of sandbox %s failed and was undone: %v; in effect: %s", o.sandboxCgroup, cause, describe(o.rec.InEffect))
	}
	restoreErrs = append(restoreErrs, err)
	if cur.Container.Path != "" {
		o.rec.InEffect = cgroupValues(cur.Container)
	}
	return errkind.Errorf(errkind.Internal, "resize of sandbox %s failed and could not be undone: %v; restore: %v; in effect: %s",
		o.sandboxCgroup, cause, errors.Join(restoreErrs...), describe(o.rec.InEffect))
}

// others names the other containers of o's sandbox that are created or
// running: those a sandbox-level limit would be shared with.
func (r *Resizer) others(ctx context.Context, o *op) ([]string, error) {
	resp, err := r.rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{PodSandboxId: o.sandboxID}})
	if err != nil {
		return nil, fmt.Errorf("list the containers of sandbox %s: %w", short(o.sandboxID), err)
	}
	var names []string
	for _, c := range resp.GetContainers() {
		if c.GetId() == o.id || (c.GetState() != runtimeapi.ContainerState_CONTAINER_RUNNING && c.GetState() != runtimeapi.ContainerState_CONTAINER_CREATED) {
			continue
		}
		name := c.GetLabels()[swap.LabelContainerName]
		if name == "" {
			name = c.GetMetadata().GetName()
		}
		names = append(names, name)
	}
	return names, nil
}

// sandboxLimits is what the pod cgroup of a sandbox with one container
// gets for that container's limits: each limit plus the pod overhead (as
// kubelet sizes a pod cgroup), the CPU quota in the pod's own period, which
// is never changed. Unlimited stays unlimited.
func sandboxLimits(want resources.Limits, oh runtimeclass.Overhead, podPeriod uint64) resources.Limits {
	var l resources.Limits
	if m := want.MemoryLimit; m != nil {
		v := *m
		if v != resources.Unlimited {
			v += oh.MemoryBytes
		}
		l.MemoryLimit = &v
	}
	if q := want.CPUQuota; q != nil {
		v := *q
		if v != resources.Unlimited {
			period := uint64(defaultPeriod)
			if want.CPUPeriod != nil {
				period = *want.CPUPeriod
			}
			v = ceilDiv(v, podPeriod, period) + oh.CPUMillis*int64(podPeriod)/1000
		}
		l.CPUQuota = &v
	}
	if s := want.CPUShares; s != nil {
		v := *s
		if oh.CPUMillis > 0 {
			v += uint64(swap.MilliCPUToShares(oh.CPUMillis))
		}
		l.CPUShares = &v
	}
	return l
}

// ceilDiv is q*num/den rounded up (a quota moved to another period is never
// short by a rounding error).
func ceilDiv(q int64, num, den uint64) int64 {
	hi, lo := bits.Mul64(uint64(q), num)
	d, rem := bits.Div64(hi, lo, den)
	if rem != 0 {
		d++
	}
	return int64(d)
}

// raises reports whether any value of want goes up from c's.
func raises(c resources.Cgroup, want resources.Limits) bool {
	up := func(from, to int64) bool {
		return from != resources.Unlimited && (to == resources.Unlimited || to > from)
	}
	return (want.MemoryLimit != nil && up(c.MemoryLimit, *want.MemoryLimit)) ||
		(want.CPUQuota != nil && up(c.CPUQuota, *want.CPUQuota)) ||
		(want.CPUShares != nil && *want.CPUShares > c.CPUShares)
}

// limitsOf is what a cgroup is set to, as Limits (to put it back).
func limitsOf(c resources.Cgroup) resources.Limits {
	l := resources.Limits{CPUQuota: ptr(c.CPUQuota), MemoryLimit: ptr(c.MemoryLimit)}
	if c.CPUShares > 0 {
		l.CPUShares = ptr(c.CPUShares)
	}
	return l
}

// sandboxWrite spells a write of the sandbox method: its "container" level
// is the pod cgroup, its "pod" level the pod's parent.
func sandboxWrite(w resources.Write) string {
	level := "sandbox"
	if w.Level == resources.LevelPod {
		level = "sandbox parent"
	}
	return fmt.Sprintf("%s %s: %s -> %s", level, w.Path, w.From, w.To)
}
