package swap

import (
	"context"
	"errors"
	"fmt"

	"go.uber.org/zap"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/pkg/store"
	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

// SpecWritten ends the handover of a committed swap made with
// Hooks.SpecHash once the pod spec names its image: kubelet is shown the
// new container's own hash again, the sticky override follows the new spec
// (dropped when the swap changed nothing but the image, which the spec now
// declares), and the stopped old container is removed — the relist that
// sees it go makes kubelet read the new container's status again, now with
// the hash of the spec it has.
func (e *Engine) SpecWritten(ctx context.Context, rec *inplacedv1.SwapRecord, specHash string, imageOnly bool) error {
	if rec.GetState() != inplacedv1.SwapState_SWAP_STATE_COMMITTED || rec.GetRunningContainerId() == "" {
		return refusedf("swap %s did not commit", rec.GetId())
	}
	e.kubelet.EndPresent(rec.RunningContainerId)
	var errs []error
	o, err := e.store.Override(rec.SandboxId, rec.Container)
	switch {
	case errors.Is(err, store.ErrNotFound):
	case err != nil:
		errs = append(errs, fmt.Errorf("read override: %w", err))
	case o.SwapID != rec.Id:
		// A later swap owns it.
	case imageOnly:
		if err := e.store.DeleteOverride(rec.SandboxId, rec.Container); err != nil {
			errs = append(errs, fmt.Errorf("drop override: %w", err))
		} else {
			e.obs.OverrideChanged(rec, false)
		}
	default:
		o.Hash, o.Image = specHash, ""
		if err := e.store.PutOverride(o); err != nil {
			errs = append(errs, fmt.Errorf("update override: %w", err))
		}
	}
	if old := rec.OldContainerId; old != "" && old != rec.RunningContainerId {
		if _, err := e.rt.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: old}); err != nil && !runtimeGone(err) {
			errs = append(errs, fmt.Errorf("remove the old container %s: %w", short(old), err))
		} else {
			e.fences.EndLinger(old)
			_ = e.store.DeleteContainer(old)
		}
	}
	if err := errors.Join(errs...); err != nil {
		e.log.Warn("spec handover after swap", zap.String("swap_id", rec.Id), zap.Error(err))
		return err
	}
	e.log.Info("pod spec names the swapped image: kubelet sees the new container's own hash",
		zap.String("swap_id", rec.Id), zap.String("container_id", rec.RunningContainerId), zap.String("hash", specHash))
	return nil
}
