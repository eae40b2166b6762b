package kube

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/pkg/errkind"
	"github.com/inplaced/inplaced/pkg/intercept"
	"github.com/inplaced/inplaced/pkg/swap"
	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

// holdMargin is what a held stop keeps of kubelet's deadline for the swap
// itself (create, start) and the answer, beyond the stop's own timeout.
const holdMargin = 15 * time.Second

// defaultHold bounds a hold when kubelet's call carries no deadline:
// kubelet's runtime request timeout.
const defaultHold = 2 * time.Minute

// errHoldExpired: kubelet's deadline for the stop is near.
var errHoldExpired = errors.New("kubelet's deadline for the stop is near")

// swapInsteadOfStop holds kubelet's StopContainer of the container change
// ch replaces until the new image is on the node, then carries the swap
// out inside the call: the stop is answered with the swap's new container
// to adopt. A change that goes away, a pull still running near kubelet's
// deadline or a pull that failed decide otherwise (release,
// answerPullFailure).
func (ic *imageChanges) swapInsteadOfStop(ctx context.Context, req *runtimeapi.StopContainerRequest, ch *change) (intercept.StopDecision, error) {
	log := ic.log.With(zap.String("container_id", req.ContainerId), zap.String("pod", ch.namespace+"/"+ch.pod),
		zap.String("container", ch.key.name), zap.String("image", ch.image))
	holdUntil := ic.now().Add(defaultHold)
	if dl, ok := ctx.Deadline(); ok {
		holdUntil = dl.Add(-time.Duration(req.Timeout)*time.Second - holdMargin)
	}
	timer := time.NewTimer(time.Until(holdUntil))
	defer timer.Stop()
	log.Info("holding kubelet's StopContainer until the new image is on the node", zap.Time("at_most_until", holdUntil))

	prep, err := ic.awaitPull(ctx, ch, timer.C)
	if prep == nil {
		return ic.release(ch, log, err)
	}
	if perr := prep.PullErr(); perr != nil {
		return ic.answerPullFailure(ch, prep, log, perr)
	}
	ic.mu.Lock()
	ch.proceed = true
	ic.mu.Unlock()
	res, err := prep.Proceed(ctx, req.Timeout)
	ic.forget(ch)
	if err != nil {
		// kubelet gave up on the call; the swap runs to its end regardless.
		return intercept.StopDecision{Answered: true}, errkind.Errorf(errkind.Timeout, "inplaced: in-place swap %s still running: %v", prep.ID(), err)
	}
	switch {
	case !res.Stopped:
		log.Warn("in-place swap not carried out; kubelet's stop goes ahead", zap.String("swap_id", res.SwapID), zap.Error(res.Err))
		return intercept.StopDecision{}, nil
	case res.NewID == "":
		log.Warn("in-place swap failed after the stop; kubelet creates the container itself", zap.String("swap_id", res.SwapID), zap.Error(res.Err))
		return intercept.StopDecision{Answered: true}, nil
	}
	log.Info("in-place swap done; kubelet's stop answered", zap.String("swap_id", res.SwapID), zap.String("new_container_id", res.NewID))
	return intercept.StopDecision{Answered: true, Adopt: ic.adoption(res)}, nil
}

// adoption offers kubelet's coming CreateContainer the swap's new
// container.
func (ic *imageChanges) adoption(res swap.KubeletResult) *intercept.Adoption {
	swapID, newID := res.SwapID, res.NewID
	return &intercept.Adoption{
		SwapID: swapID, ContainerID: newID, Request: res.NewRequest,
		Discard: func(ctx context.Context) error { return ic.engine.Discard(ctx, newID) },
		Handoff: func(text string, adopted bool) {
			if err := ic.engine.SetHandoff(swapID, text, adopted); err != nil {
				ic.log.Error("record handoff", zap.String("swap_id", swapID), zap.Error(err))
			}
		},
	}
}

// awaitPull waits until the change is prepared and its pull has ended
// (failed or not). It returns the prepared swap, or nil and why the stop
// is held no longer: the change went away or could not be prepared, the
// hold expired, kubelet gave up.
func (ic *imageChanges) awaitPull(ctx context.Context, ch *change, expire <-chan time.Time) (*swap.Prepared, error) {
	prep, err := ic.await(ctx, ch, expire, ch.ready)
	if err != nil || prep == nil {
		return nil, err
	}
	if _, err := ic.await(ctx, ch, expire, prep.Pulled()); err != nil {
		return nil, err
	}
	return prep, nil
}

// await waits for one of a change's channels, the change going away, the
// hold's end or kubelet giving up.
func (ic *imageChanges) await(ctx context.Context, ch *change, expire <-chan time.Time, which <-chan struct{}) (*swap.Prepared, error) {
	select {
	case <-which:
		ic.mu.Lock()
		defer ic.mu.Unlock()
		if ch.prepErr != nil {
			return nil, ch.prepErr
		}
		return ch.prep, nil
	case <-ch.gone:
		return nil, ch.goneWhy
	case <-expire:
		return nil, errHoldExpired
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// release decides a held stop that ends without a swap.
func (ic *imageChanges) release(ch *change, log *zap.Logger, why error) (intercept.StopDecision, error) {
	switch {
	case errors.Is(why, errReverted):
		log.Info("pod spec reverted while kubelet's stop was held: the container keeps running")
		return intercept.StopDecision{Answered: true}, errkind.Errorf(errkind.Aborted,
			"inplaced: %v (%s); container %s keeps running, nothing to do", errReverted, ch.image, ch.key.name)
	case errors.Is(why, errDeleted):
		// kubelet's pod worker is inside this sync: a stop that went
		// through would send it on to pull the new image before it gets to
		// the pod's termination. Ending the sync lets the termination (whose
		// stops go straight through) run now.
		log.Info("pod deleted while kubelet's stop was held: ending that sync so the termination runs")
		return intercept.StopDecision{Answered: true}, errkind.Errorf(errkind.Aborted,
			"inplaced: %v; the image change is dropped and the container is left to the pod's termination", errDeleted)
	case errors.Is(why, errHoldExpired):
		log.Warn("pull still running near kubelet's deadline: letting the stop through (kubelet pulls the image itself)")
		ic.recordLetThrough(ch, fmt.Sprintf("pull of %s not finished before kubelet's deadline for StopContainer: the stop went through, kubelet restarts the container the usual way", ch.image))
		ic.cancel(ch, why)
	default:
		log.Info("kubelet's stop goes through", zap.NamedError("why", why))
	}
	return intercept.StopDecision{}, nil
}

// answerPullFailure answers a held stop whose pull failed
// (decidePullFailure).
func (ic *imageChanges) answerPullFailure(ch *change, prep *swap.Prepared, log *zap.Logger, perr error) (intercept.StopDecision, error) {
	ic.mu.Lock()
	l := ch.creds
	ic.mu.Unlock()
	v := decidePullFailure(ic.onPullFailure, pullFailureKind(perr), l)
	log = log.With(zap.String("swap_id", prep.ID()), zap.String("pull_failure", v.kind), zap.String("why", v.why))
	if v.pass {
		log.Warn("pull failed: kubelet's stop goes ahead", zap.Error(perr))
		ic.cancel(ch, perr)
		return intercept.StopDecision{}, nil
	}
	log.Warn("pull failed: kubelet's stop refused, the old container keeps running", zap.Error(perr))
	ic.retryLater(ch)
	return intercept.StopDecision{Answered: true}, errkind.Errorf(errkind.Refused,
		"inplaced: image %s for container %q of pod %s/%s cannot be pulled (%v); the old container keeps running. To do: %s (swap %s)",
		ch.image, ch.key.name, ch.namespace, ch.pod, perr, v.todo, prep.ID())
}

// retryLater makes the next held stop of a failed change pull again.
func (ic *imageChanges) retryLater(ch *change) {
	ic.mu.Lock()
	defer ic.mu.Unlock()
	if ic.changes[ch.key] == ch {
		ch.detectedAt = ic.now()
		ch.prepErr = nil
	}
}

func (ic *imageChanges) recordLetThrough(ch *change, why string) {
	now := ic.now().UnixNano()
	if err := ic.engine.RecordEvent(&inplacedv1.SwapRecord{
		Kind: "stop-let-through", Namespace: ch.namespace, Pod: ch.pod, Container: ch.key.name, PodUid: string(ch.key.uid),
		OldContainerId: ch.oldID, State: inplacedv1.SwapState_SWAP_STATE_ABORTED, StartedUnixNano: now, FinishedUnixNano: now,
		Caller: &inplacedv1.Caller{Description: swap.CallerKubelet}, To: &inplacedv1.ConfigSummary{Image: ch.image}, Error: why,
	}); err != nil {
		ic.log.Error("record let-through stop", zap.Error(err))
	}
}
