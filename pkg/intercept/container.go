package intercept

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/pkg/errkind"
	"github.com/inplaced/inplaced/pkg/fence"
	"github.com/inplaced/inplaced/pkg/store"
	"github.com/inplaced/inplaced/pkg/swap"
	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

// waitFence makes kubelet's call wait for the swap behind fence f to end,
// bounded by the fence timeout.
func (i *Interceptors) waitFence(ctx context.Context, f *fence.Fence, method string) (fence.Outcome, error) {
	i.log.Info("kubelet call waits for a swap", zap.String("method", method), zap.String("swap_id", f.SwapID))
	wctx, cancel := context.WithTimeout(ctx, i.fenceTimeout)
	defer cancel()
	out, err := f.Wait(wctx)
	if err != nil {
		return out, errkind.Errorf(errkind.Unavailable, "container %s is being swapped by inplaced (swap %s): retry", f.Key, f.SwapID)
	}
	return out, nil
}

// waitContainerFence waits out a swap running on container id, if any: a
// kubelet call on the container waits for the swap's result.
func (i *Interceptors) waitContainerFence(ctx context.Context, id, method string) error {
	f := i.fences.ByContainer(id)
	if f == nil {
		return nil
	}
	i.count(f.Key.String() + "/" + method)
	_, err := i.waitFence(ctx, f, method)
	return err
}

func (i *Interceptors) createContainer(ctx context.Context, req *runtimeapi.CreateContainerRequest,
	next func(context.Context, *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error),
) (*runtimeapi.CreateContainerResponse, error) {
	name := req.GetConfig().GetMetadata().GetName()
	key := fence.Key{SandboxID: req.PodSandboxId, Name: name}
	i.count(key.String() + "/CreateContainer")
	if a := i.takeAdoption(key); a != nil {
		if id, ok := i.adopt(ctx, a, req); ok {
			return &runtimeapi.CreateContainerResponse{ContainerId: id}, nil
		}
	}
	if f := i.fences.Lookup(key); f != nil {
		out, err := i.waitFence(ctx, f, "CreateContainer")
		if err != nil {
			return nil, err
		}
		// kubelet raced the swap: it gets the swap's container rather than a
		// second one of the same name.
		if out.RunningID != "" {
			i.mu.Lock()
			i.handed[out.RunningID] = true
			i.mu.Unlock()
			i.log.Info("answered kubelet's CreateContainer with the swap's container",
				zap.String("swap_id", f.SwapID), zap.String("container_id", out.RunningID))
			return &runtimeapi.CreateContainerResponse{ContainerId: out.RunningID}, nil
		}
	}
	req = i.applyOverride(req)
	resp, err := next(ctx, req)
	if err != nil {
		return nil, err
	}
	if err := i.store.PutContainer(resp.ContainerId, req); err != nil {
		i.storeFailed("record container config", err, zap.String("container_id", resp.ContainerId))
	}
	return resp, nil
}

// applyOverride makes a committed swap sticky across kubelet's restarts of
// the container, unless kubelet's config carries a different hash: then the
// pod spec changed, and the declared spec wins.
func (i *Interceptors) applyOverride(req *runtimeapi.CreateContainerRequest) *runtimeapi.CreateContainerRequest {
	cfg := req.GetConfig()
	name := cfg.GetMetadata().GetName()
	o, err := i.store.Override(req.PodSandboxId, name)
	if err != nil {
		if !errors.Is(err, store.ErrNotFound) {
			i.storeFailed("read override", err)
		}
		return req
	}
	hash := cfg.GetAnnotations()[swap.AnnotationHash]
	if hash != o.Hash {
		i.log.Info("pod spec changed: dropping swap override",
			zap.String("sandbox_id", req.PodSandboxId), zap.String("container", name),
			zap.String("swap_id", o.SwapID), zap.String("override_hash", o.Hash), zap.String("kubelet_hash", hash))
		i.dropOverride(o, fmt.Sprintf("pod spec changed (container hash %s → %s): override of swap %s dropped, kubelet's config used", o.Hash, hash, o.SwapID))
		return req
	}
	out := proto.Clone(req).(*runtimeapi.CreateContainerRequest)
	c := out.Config
	if o.Image != "" {
		spec := &runtimeapi.ImageSpec{Image: o.Image, UserSpecifiedImage: o.Image}
		if c.Image != nil {
			spec.RuntimeHandler, spec.Annotations = c.Image.RuntimeHandler, c.Image.Annotations
		}
		c.Image = spec
	}
	c.Envs = nil
	for _, kv := range o.Env {
		c.Envs = append(c.Envs, &runtimeapi.KeyValue{Key: kv.Key, Value: []byte(kv.Value)})
	}
	c.Command, c.Args = o.Command, o.Args
	i.log.Info("applied swap override to kubelet's CreateContainer",
		zap.String("sandbox_id", req.PodSandboxId), zap.String("container", name), zap.String("swap_id", o.SwapID), zap.String("image", o.Image))
	return out
}

// dropOverride deletes an override and records why in the swap history.
func (i *Interceptors) dropOverride(o *store.Override, why string) {
	if err := i.store.DeleteOverride(o.SandboxID, o.Container); err != nil {
		i.storeFailed("drop override", err)
	}
	now := i.now().UnixNano()
	i.recordEvent(&inplacedv1.SwapRecord{
		// History is trimmed in key order, oldest first: the ID starts
		// with the time, like the swap engine's IDs.
		Id:        time.Unix(0, now).UTC().Format("20060102T150405.000000000") + "-override-dropped",
		Kind:      "override-dropped",
		Namespace: o.Namespace, Pod: o.Pod, Container: o.Container, SandboxId: o.SandboxID,
		State: inplacedv1.SwapState_SWAP_STATE_ABORTED, StartedUnixNano: now, FinishedUnixNano: now,
		Error: why,
	})
}

func (i *Interceptors) startContainer(ctx context.Context, req *runtimeapi.StartContainerRequest,
	next func(context.Context, *runtimeapi.StartContainerRequest) (*runtimeapi.StartContainerResponse, error),
) (*runtimeapi.StartContainerResponse, error) {
	if err := i.waitContainerFence(ctx, req.ContainerId, "StartContainer"); err != nil {
		return nil, err
	}
	i.mu.Lock()
	handed := i.handed[req.ContainerId]
	delete(i.handed, req.ContainerId)
	i.mu.Unlock()
	if handed {
		// The swap already started it.
		return &runtimeapi.StartContainerResponse{}, nil
	}
	return next(ctx, req)
}

func (i *Interceptors) stopContainer(ctx context.Context, req *runtimeapi.StopContainerRequest,
	next func(context.Context, *runtimeapi.StopContainerRequest) (*runtimeapi.StopContainerResponse, error),
) (*runtimeapi.StopContainerResponse, error) {
	if i.holder != nil {
		d, err := i.holder.SwapInsteadOfStop(ctx, req)
		if d.Adopt != nil {
			i.offerAdoption(d.Adopt)
		}
		if d.Answered {
			if err != nil {
				return nil, err
			}
			return &runtimeapi.StopContainerResponse{}, nil
		}
	}
	if f := i.fences.ByContainer(req.ContainerId); f != nil {
		i.count(f.Key.String() + "/StopContainer")
		// kubelet's stop wins over the swap.
		f.Abort(errors.New("kubelet stopped the container"))
		if _, err := i.waitFence(ctx, f, "StopContainer"); err != nil {
			return nil, err
		}
	}
	return next(ctx, req)
}

func (i *Interceptors) removeContainer(ctx context.Context, req *runtimeapi.RemoveContainerRequest,
	next func(context.Context, *runtimeapi.RemoveContainerRequest) (*runtimeapi.RemoveContainerResponse, error),
) (*runtimeapi.RemoveContainerResponse, error) {
	if err := i.waitContainerFence(ctx, req.ContainerId, "RemoveContainer"); err != nil {
		return nil, err
	}
	resp, err := next(ctx, req)
	if err != nil && status.Code(err) != codes.NotFound {
		return nil, err
	}
	if derr := i.store.DeleteContainer(req.ContainerId); derr != nil {
		i.storeFailed("drop container record", derr, zap.String("container_id", req.ContainerId))
	}
	return resp, err
}
