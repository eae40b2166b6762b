package intercept

import (
	"context"
	"errors"
	"fmt"

	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func (i *Interceptors) runPodSandbox(ctx context.Context, req *runtimeapi.RunPodSandboxRequest,
	next func(context.Context, *runtimeapi.RunPodSandboxRequest) (*runtimeapi.RunPodSandboxResponse, error),
) (*runtimeapi.RunPodSandboxResponse, error) {
	resp, err := next(ctx, req)
	if err != nil {
		return nil, err
	}
	if err := i.store.PutSandbox(resp.PodSandboxId, req); err != nil {
		// The sandbox exists; a swap in it can still adopt its config from
		// the backend. Do not fail kubelet's call for our bookkeeping.
		i.storeFailed("record sandbox config", err, zap.String("sandbox_id", resp.PodSandboxId))
	}
	return resp, nil
}

// abortSwapsIn ends every swap in a sandbox that is going away: the pod
// deletion wins, the swaps clean up what they created.
func (i *Interceptors) abortSwapsIn(ctx context.Context, sandboxID, why string) {
	for _, f := range i.fences.BySandbox(sandboxID) {
		i.log.Info("aborting swap: "+why, zap.String("swap_id", f.SwapID), zap.String("sandbox_id", sandboxID))
		f.Abort(errors.New(why))
		wctx, cancel := context.WithTimeout(ctx, i.fenceTimeout)
		_, _ = f.Wait(wctx)
		cancel()
	}
}

func (i *Interceptors) stopPodSandbox(ctx context.Context, req *runtimeapi.StopPodSandboxRequest,
	next func(context.Context, *runtimeapi.StopPodSandboxRequest) (*runtimeapi.StopPodSandboxResponse, error),
) (*runtimeapi.StopPodSandboxResponse, error) {
	i.abortSwapsIn(ctx, req.PodSandboxId, "the pod sandbox is being stopped")
	resp, err := next(ctx, req)
	if err != nil {
		return nil, err
	}
	i.endOverrides(req.PodSandboxId, "stopped")
	return resp, nil
}

// endOverrides drops the overrides of a sandbox that has ended. kubelet
// never creates containers in a stopped sandbox (it makes a new one, with
// new containers from the pod spec), so an override there can never apply
// again; left in place until kubelet's garbage collection removes the
// sandbox (a minute or more), `inplacectl overrides` would show it as
// active next to the pod's new incarnation of the same name, which runs
// the declared spec.
func (i *Interceptors) endOverrides(sandboxID, how string) {
	all, err := i.store.Overrides()
	if err != nil {
		i.storeFailed("read overrides", err, zap.String("sandbox_id", sandboxID))
		return
	}
	for _, o := range all {
		if o.SandboxID != sandboxID {
			continue
		}
		i.log.Info("pod sandbox ended: dropping swap override", zap.String("sandbox_id", sandboxID),
			zap.String("container", o.Container), zap.String("swap_id", o.SwapID), zap.String("how", how))
		i.dropOverride(o, fmt.Sprintf("pod sandbox %s: override of swap %s ends with it", how, o.SwapID))
	}
}

// SweepOverrides drops the overrides of sandboxes the runtime no longer has
// ready: their stop or removal came while the state store could not be
// written (a full disk) or while inplaced was down, so endOverrides could not
// drop them then. Nothing is dropped when the runtime cannot be asked.
func (i *Interceptors) SweepOverrides(ctx context.Context, rt runtimeapi.RuntimeServiceClient) {
	all, err := i.store.Overrides()
	if err != nil || len(all) == 0 {
		return
	}
	resp, err := rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{Filter: &runtimeapi.PodSandboxFilter{
		State: &runtimeapi.PodSandboxStateValue{State: runtimeapi.PodSandboxState_SANDBOX_READY}}})
	if err != nil {
		i.log.Debug("override sweep: cannot list the pod sandboxes", zap.Error(err))
		return
	}
	ready := map[string]bool{}
	for _, sb := range resp.GetItems() {
		ready[sb.Id] = true
	}
	for _, o := range all {
		if ready[o.SandboxID] {
			continue
		}
		i.log.Info("pod sandbox no longer ready: dropping swap override left while it could not be dropped",
			zap.String("sandbox_id", o.SandboxID), zap.String("container", o.Container), zap.String("swap_id", o.SwapID))
		i.dropOverride(o, fmt.Sprintf("pod sandbox ended while the override could not be dropped: override of swap %s ends with it", o.SwapID))
	}
}

func (i *Interceptors) removePodSandbox(ctx context.Context, req *runtimeapi.RemovePodSandboxRequest,
	next func(context.Context, *runtimeapi.RemovePodSandboxRequest) (*runtimeapi.RemovePodSandboxResponse, error),
) (*runtimeapi.RemovePodSandboxResponse, error) {
	i.abortSwapsIn(ctx, req.PodSandboxId, "the pod sandbox is being removed")
	resp, err := next(ctx, req)
	if err != nil && status.Code(err) != codes.NotFound {
		return nil, err
	}
	i.endOverrides(req.PodSandboxId, "removed")
	if derr := i.store.DeleteSandbox(req.PodSandboxId); derr != nil {
		i.storeFailed("drop sandbox record", derr, zap.String("sandbox_id", req.PodSandboxId))
	}
	return resp, err
}
