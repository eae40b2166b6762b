package resize

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"strings"

	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/pkg/errkind"
	"github.com/inplaced/inplaced/pkg/resources"
)

// viaCgroups is the cgroup method (see the package documentation, steps 1-6).
func (r *Resizer) viaCgroups(ctx context.Context, o *op) error {
	o.rec.Method = MethodCgroup
	t := resources.Target{CgroupsPath: o.cgroupsPath}
	cur, err := r.cg.Read(t)
	if errors.Is(err, fs.ErrNotExist) && o.status.GetState() == runtimeapi.ContainerState_CONTAINER_RUNNING {
		// Running, yet its cgroup is not where the runtime's spec says from
		// here (inplaced in its own cgroup namespace, an unexpected driver):
		// the runtime is the only one who can resize it.
		r.log.Warn("resize: container cgroup not visible, resizing through the runtime only",
			zap.String("container_id", o.id), zap.String("cgroups_path", o.cgroupsPath), zap.Error(err))
		err := r.viaBackend(ctx, o)
		note := fmt.Sprintf("cgroup %s not visible to inplaced: resized through the runtime only", o.cgroupsPath)
		if o.rec.Error != "" {
			note += "; " + o.rec.Error
		}
		o.rec.Error = note
		return err
	}
	if err != nil {
		return readError(o.id, err)
	}
	o.rec.From = cgroupValues(cur.Container)
	o.rec.InEffect = o.rec.From
	if o.req == nil {
		o.req = &runtimeapi.UpdateContainerResourcesRequest{ContainerId: o.id, Linux: criResources(o.resources, cur.Container.CPUPeriod)}
	}
	want := resources.LimitsFromCRI(o.req.GetLinux())
	o.rec.To = targetValues(want, o.rec.From)
	old := before(cur.Container, want, o.status)
	// The pod rule: the control API moves the pod by the container's
	// change, never below what kubelet creates the container with
	// (podPrev); kubelet moves the pod itself, so for its calls the pod only
	// ever rises to the container's new limit (prev = want: a change of
	// nothing, with the pod rule's floor).
	prev := &want
	if o.exactPod {
		d, known := r.declared(o.id)
		pp := podPrev(old, want, d, known)
		prev = &pp
	}

	// Refuse what would be refused, before the runtime changes anything.
	if _, err := r.cg.Plan(cur, want, prev); err != nil {
		var ue *resources.UsageError
		switch {
		case errors.As(err, &ue) && (ue.Level == resources.LevelContainer || o.exactPod):
			o.rec.Result = ResultRefused
			return errkind.Errorf(errkind.Refused,
				"%s cgroup %s uses %d bytes of memory; the requested limit of %d bytes is not above that, and lowering a limit to or below usage would make the kernel reclaim or OOM-kill: nothing was changed",
				ue.Level, ue.Cgroup, ue.Usage, ue.Requested)
		case errors.As(err, &ue):
			// kubelet lowers the pod after its containers and checks the
			// pod's usage itself; Apply below will not lower the pod.
		case errors.Is(err, resources.ErrInvalidLimits):
			o.rec.Result = ResultRefused
			return errkind.Errorf(errkind.Invalid, "%v: nothing was changed", err)
		default:
			return errkind.Errorf(errkind.Internal, "plan the resize of %s: %v: nothing was changed", short(o.id), err)
		}
	}

	// From here on the resize finishes, or is undone, whatever the caller does.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.timeout)
	defer cancel()
	// The runtime changes the container between inplaced's pod raises and
	// the rest: the pod has room for it then (v1 refuses a child quota above
	// its parent's; on v2 and with systemd the container would sit above its
	// pod for a moment), and what the runtime missed is repaired after it.
	var rtErr error
	res, err := r.cg.Apply(ctx, t, want, prev, resources.BeforeContainer(func(ctx context.Context) {
		_, rtErr = o.update(ctx, o.req)
	}))
	var after resources.Current
	if err == nil {
		after, err = r.verify(t, want)
	}
	if err != nil {
		return r.undo(ctx, o, t, old, rtErr, err)
	}
	for _, w := range res.Writes {
		o.rec.Repaired = append(o.rec.Repaired, w.String())
	}
	o.rec.InEffect = cgroupValues(after.Container)
	o.rec.Result = ResultApplied
	if rtErr != nil {
		// The runtime refused (a v1 EINVAL of a quota above a pod inplaced
		// had not raised: kubelet's pod limits being lower, say), and Apply
		// repaired the container: let the runtime record what the cgroups are set to.
		if _, err := o.update(ctx, o.req); err != nil {
			o.rec.Error = fmt.Sprintf("in effect, but the runtime's record of the container still shows the previous values: it refused twice (%v; then %v)",
				status.Convert(rtErr).Message(), status.Convert(err).Message())
		}
	}
	return nil
}

// verify reads the cgroups back: the container must have exactly want and
// the pod at least that. With prev = want the pod rule moves nothing, so an
// empty plan means everything is in effect.
func (r *Resizer) verify(t resources.Target, want resources.Limits) (resources.Current, error) {
	cur, err := r.cg.Read(t)
	if err != nil {
		return cur, fmt.Errorf("read back: %w", err)
	}
	plan, err := r.cg.Plan(cur, want, &want)
	if err != nil {
		return cur, fmt.Errorf("read back: %w", err)
	}
	if len(plan) > 0 {
		diff := make([]string, len(plan))
		for i, w := range plan {
			diff[i] = w.String()
		}
		return cur, fmt.Errorf("read back: %w: %s", resources.ErrNotApplied, strings.Join(diff, "; "))
	}
	return cur, nil
}

// undo puts the container back to old after a failed resize: the runtime is
// asked for the old values (it may have applied some before failing), then
// Apply repairs the cgroups to them with the pod left where it is (prev =
// old: the pod moves by nothing). The error says what is in effect.
func (r *Resizer) undo(ctx context.Context, o *op, t resources.Target, old resources.Limits, rtErr, cause error) error {
	if rtErr != nil {
		cause = fmt.Errorf("runtime: %s; cgroups: %w", status.Convert(rtErr).Message(), cause)
	}
	var restoreErrs []error
	if _, err := o.update(ctx, &runtimeapi.UpdateContainerResourcesRequest{ContainerId: o.id, Linux: limitsCRI(old)}); err != nil {
		// Not fatal by itself: Apply below repairs what the runtime left.
		restoreErrs = append(restoreErrs, fmt.Errorf("runtime: %s", status.Convert(err).Message()))
	}
	if _, err := r.cg.Apply(ctx, t, old, &old); err != nil {
		restoreErrs = append(restoreErrs, err)
	}
	cur, err := r.verify(t, old)
	if err == nil {
		o.rec.InEffect = cgroupValues(cur.Container)
		return errkind.Errorf(errkind.Aborted, "resize of %s failed and was undone: %v; in effect: %s", short(o.id), cause, describe(o.rec.InEffect))
	}
	if errors.Is(err, fs.ErrNotExist) && status.Code(rtErr) == codes.NotFound {
		o.rec.InEffect = nil
		return errkind.Errorf(errkind.NotFound, "container %s is gone: %s", short(o.id), status.Convert(rtErr).Message())
	}
	restoreErrs = append(restoreErrs, err)
	if cur.Container.Path != "" {
		o.rec.InEffect = cgroupValues(cur.Container)
	}
	return errkind.Errorf(errkind.Internal, "resize of %s failed and could not be undone: %v; restore: %v; in effect: %s",
		short(o.id), cause, errors.Join(restoreErrs...), describe(o.rec.InEffect))
}

// viaBackend is the backend method: VM sandboxes (host cgroups do not reach
// the guest) and runtimes that do not expose a cgroupsPath. The runtime is
// the only actor; its ContainerStatus resources are the read-back.
func (r *Resizer) viaBackend(ctx context.Context, o *op) error {
	o.rec.Method = MethodBackend
	lr := o.status.GetResources().GetLinux()
	o.rec.From = criValues(lr)
	o.rec.InEffect = o.rec.From
	if o.req == nil {
		o.req = &runtimeapi.UpdateContainerResourcesRequest{ContainerId: o.id, Linux: criResources(o.resources, uint64(lr.GetCpuPeriod()))}
	}
	want := resources.LimitsFromCRI(o.req.GetLinux())
	o.rec.To = targetValues(want, o.rec.From)
	if err := want.Validate(); err != nil {
		o.rec.Result = ResultRefused
		return errkind.Errorf(errkind.Invalid, "%v: nothing was changed", err)
	}
	if m := want.MemoryLimit; m != nil && *m != resources.Unlimited {
		if usage := r.memoryUsage(ctx, o.id); usage > 0 && uint64(*m) <= usage {
			o.rec.Result = ResultRefused
			return errkind.Errorf(errkind.Refused,
				"container %s uses %d bytes of memory (runtime stats); the requested limit of %d bytes is not above that: nothing was changed",
				short(o.id), usage, *m)
		}
	}

	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.timeout)
	defer cancel()
	_, rtErr := o.update(ctx, o.req)
	got, stErr := r.runtimeResources(ctx, o.id)
	if rtErr == nil && stErr == nil {
		switch {
		case got == nil:
			o.rec.InEffect = nil
			o.rec.Result = ResultApplied
			o.rec.Error = "the runtime reports no resources in ContainerStatus: accepted but not verified"
			return nil
		case criMatches(got, want):
			o.rec.InEffect = criValues(got)
			o.rec.Result = ResultApplied
			return nil
		}
	}
	var cause error
	switch {
	case rtErr != nil:
		if status.Code(rtErr) == codes.NotFound {
			return rtErr
		}
		cause = fmt.Errorf("runtime: %s", status.Convert(rtErr).Message())
	case stErr != nil:
		cause = fmt.Errorf("read back: %w", stErr)
	default:
		cause = fmt.Errorf("read back: the runtime reports %s", describe(criValues(got)))
	}

	old := resources.LimitsFromCRI(lr)
	var restoreErr error
	if lr != nil {
		if _, err := o.update(ctx, &runtimeapi.UpdateContainerResourcesRequest{ContainerId: o.id, Linux: lr}); err != nil {
			restoreErr = fmt.Errorf("runtime: %s", status.Convert(err).Message())
		}
	} else {
		restoreErr = errors.New("the runtime reported no resources before the resize")
	}
	got, stErr = r.runtimeResources(ctx, o.id)
	if stErr == nil {
		o.rec.InEffect = criValues(got)
	}
	if restoreErr == nil && stErr == nil && criMatches(got, old) {
		return errkind.Errorf(errkind.Aborted, "resize of %s failed and was undone: %v; in effect (runtime): %s", short(o.id), cause, describe(o.rec.InEffect))
	}
	return errkind.Errorf(errkind.Internal, "resize of %s failed and could not be verified as undone: %v; restore: %v; in effect (runtime): %s",
		short(o.id), cause, errors.Join(restoreErr, stErr), describe(o.rec.InEffect))
}

// runtimeResources is the runtime's record of a container's resources.
func (r *Resizer) runtimeResources(ctx context.Context, id string) (*runtimeapi.LinuxContainerResources, error) {
	resp, err := r.rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id})
	if err != nil {
		return nil, err
	}
	return resp.GetStatus().GetResources().GetLinux(), nil
}

// memoryUsage is the container's memory usage as the runtime reports it, 0
// when it does not.
func (r *Resizer) memoryUsage(ctx context.Context, id string) uint64 {
	resp, err := r.rt.ContainerStats(ctx, &runtimeapi.ContainerStatsRequest{ContainerId: id})
	if err != nil {
		r.log.Debug("resize: no container stats for the usage check", zap.String("container_id", id), zap.Error(err))
		return 0
	}
	m := resp.GetStats().GetMemory()
	if u := m.GetUsageBytes().GetValue(); u > 0 {
		return u
	}
	return m.GetWorkingSetBytes().GetValue()
}

// readError maps a failed first read of the cgroups: a container whose cgroup
// is gone has exited or been removed.
func readError(id string, err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return errkind.Errorf(errkind.NotFound, "container %s: its cgroup is gone (%v): has it exited?", short(id), err)
	}
	if errors.Is(err, resources.ErrInvalidTarget) {
		return errkind.Errorf(errkind.Refused, "container %s: %v", short(id), err)
	}
	return errkind.Errorf(errkind.Internal, "read the cgroups of %s: %v", short(id), err)
}
