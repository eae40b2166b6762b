package intercept

import (
	"context"
	"errors"

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
		i.log.Error("record sandbox config", zap.String("sandbox_id", resp.PodSandboxId), zap.Error(err))
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
	return next(ctx, req)
}

func (i *Interceptors) removePodSandbox(ctx context.Context, req *runtimeapi.RemovePodSandboxRequest,
	next func(context.Context, *runtimeapi.RemovePodSandboxRequest) (*runtimeapi.RemovePodSandboxResponse, error),
) (*runtimeapi.RemovePodSandboxResponse, error) {
	i.abortSwapsIn(ctx, req.PodSandboxId, "the pod sandbox is being removed")
	resp, err := next(ctx, req)
	if err != nil && status.Code(err) != codes.NotFound {
		return nil, err
	}
	if derr := i.store.DeleteSandbox(req.PodSandboxId); derr != nil {
		i.log.Error("drop sandbox record", zap.String("sandbox_id", req.PodSandboxId), zap.Error(derr))
	}
	return resp, err
}
