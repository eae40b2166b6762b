package swap

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/pkg/fence"
	"github.com/inplaced/inplaced/pkg/holdmode"
	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

// execute runs the swap's plan to its end. It never returns with the
// container name left without a container unless the rollback itself
// failed, which it reports as ROLLBACK_FAILED after leaving things as
// kubelet would recreate them.
func (r *run) execute(ctx context.Context) {
	r.ctx = ctx
	r.out = fence.Outcome{RunningID: r.t.container.Id}
	defer r.release()
	r.log.Info("swap started", zap.String("kind", r.rec.Kind))
	r.e.tell(false, r.rec)

	r.hold = r.connectionHold()
	r.chooseStrategy()
	if !r.carryOut(planFor(r.spec()), undoNothing) {
		return
	}
	r.out = fence.Outcome{RunningID: r.newID, Committed: true}
	r.rec.RunningContainerId = r.newID
	r.finish(r.out, inplacedv1.SwapState_SWAP_STATE_COMMITTED, nil)
}

// carryOut runs plan's steps, the last undo reached so far being reached.
// It returns false when the swap ended in it (undone, or ended by a step);
// an overlap whose handover fell back goes on with fallbackPlan.
func (r *run) carryOut(plan []step, reached undo) bool {
	for _, s := range plan {
		if s.aborted != "" && r.ctx.Err() != nil {
			r.undo(reached, errors.New(s.aborted))
			return false
		}
		before := reached
		if s.undo != undoNothing {
			reached = s.undo
		}
		err := r.run(s)
		if err == nil || s.optional {
			continue
		}
		if fb := (*fellBack)(nil); errors.As(err, &fb) {
			return r.carryOut(fallbackPlan(r.spec()), reached)
		}
		if jf := (*journalFailed)(nil); errors.As(err, &jf) {
			reached = before // the step was not taken: undo what came before it
		}
		var end *ended
		if errors.As(err, &end) {
			r.finish(r.out, end.state, end.err)
			return false
		}
		if s.failure != "" {
			err = fmt.Errorf("%s: %w", s.failure, err)
		}
		r.undo(reached, err)
		return false
	}
	return true
}

// spec is what the swap's plan depends on.
func (r *run) spec() planSpec {
	return planSpec{kind: r.rec.Kind, drain: r.hooks.BeforeStop != nil, specHash: r.hooks.SpecHash != "",
		preStop: !r.opts.GetSkipPreStop(), postStart: r.opts.GetPostStart() != nil, hold: r.hold.mode != holdmode.Off,
		overlap: r.tk != nil}
}

// run carries out one step: a shown step is journaled, timed and reported
// (run.step); a bookkeeping step is only journaled.
func (r *run) run(s step) error {
	do := func() error { return actions[s.do](r) }
	if s.name != "" {
		return r.step(s.name, s.journal, do)
	}
	if s.journal != "" {
		if err := r.journal(s.journal); err != nil {
			return err
		}
	}
	return do()
}

// release lets kubelet's calls for the name go on once the swap has ended.
func (r *run) release() {
	if r.fence != nil {
		if r.kube == nil {
			r.fence.LingerOnRelease()
		}
		r.e.fences.Release(r.fence, r.out)
	}
	if r.kube != nil {
		r.kubeletResult(r.out, r.stopped, r.endErr)
	}
	r.bc.close()
}

// ended is an action's verdict that the swap ends here, with nothing to
// undo: Error is the step's own error, err the swap's.
type ended struct {
	state inplacedv1.SwapState
	step  error
	err   error
}

func (e *ended) Error() string { return e.step.Error() }

// actions maps each action of a plan to its code.
var actions = map[action]func(r *run) error{
	actPull:            (*run).doPull,
	actPullKubelet:     (*run).doPullKubelet,
	actProceed:         (*run).doProceed,
	actConfig:          func(r *run) error { r.setNewConfig(r.config(false)); return nil },
	actConfigSpec:      func(r *run) error { r.setNewConfig(r.config(true)); return nil },
	actKubeletConfig:   func(r *run) error { r.setNewConfig(r.kubeletConfig(r.imageRef, r.userImage)); return nil },
	actCreateNew:       (*run).doCreateNew,
	actDrain:           func(r *run) error { return r.hooks.BeforeStop(r.ctx) },
	actPreStop:         func(r *run) error { r.preStopStart = r.e.now(); return r.preStop(r.ctx, r.gracePeriod()) },
	actHoldConnections: (*run).holdConnections,
	actRecordNoHold:    (*run).recordNoHold,
	actStopOld:         func(r *run) error { return r.stopOld(stopTimeout(r.gracePeriod(), r.preStopSpent())) },
	actStopOldKube:     func(r *run) error { return r.stopOld(r.kube.stopTimeout) }, // kubelet already ran preStop and took its time off
	actStartNew:        (*run).doStartNew,
	actPostStart:       func(r *run) error { return r.runHandler(r.ctx, r.newID, r.opts.GetPostStart(), r.gracePeriod()) },
	actHealthGate:      (*run).doHealthGate,
	actCommit:          func(r *run) error { return r.logCommit(r.commit()) },
	actCommitRevert:    func(r *run) error { return r.logCommit(r.dropOverride()) },
	actCommitKubelet:   func(r *run) error { return r.logCommit(r.kubeletCommit()) },
	actRollback:        (*run).doRollback,
	actClearHold:       (*run).doClearHold,
	actRemoveNew:       (*run).doRemoveNew,
	actAdoptNew:        (*run).doAdoptNew,
	actRecordNew:       (*run).doRecordNew,
	actCreateTrapped:   (*run).doCreateTrapped,
	actStartOverlap:    (*run).doStartOverlap,
	actHandover:        (*run).doHandover,
}

func (r *run) doPull() (err error) {
	r.imageRef, r.userImage, err = r.pull(r.ctx)
	r.rec.ImageRef = r.imageRef
	return err
}

// doPullKubelet pulls with the pod's secrets and tells the Prepared how it
// went: kubelet's StopContainer waits for that.
func (r *run) doPullKubelet() (err error) {
	r.imageRef, r.userImage, err = r.pullWithAuths(r.ctx)
	r.rec.ImageRef = r.imageRef
	p := r.kube.prepared
	p.pullErr = err
	close(p.pulled)
	if err != nil && r.ctx.Err() != nil {
		return &ended{state: inplacedv1.SwapState_SWAP_STATE_ABORTED, step: err,
			err: fmt.Errorf("not carried out (%w) while pulling; the old container runs on", context.Cause(r.ctx))}
	}
	return err
}

// doProceed waits for kubelet's StopContainer, then takes the fence: from
// here the swap runs to its end, and only a pod removal or kubelet's own
// calls (through the fence) can abort it.
func (r *run) doProceed() error {
	if err := r.awaitProceed(r.ctx); err != nil {
		return err
	}
	f, fctx, err := r.e.fences.Acquire(context.Background(), fence.Key{SandboxID: r.t.container.PodSandboxId, Name: r.t.name}, r.rec.Id, r.t.container.Id)
	if err != nil {
		return &ended{state: inplacedv1.SwapState_SWAP_STATE_ABORTED, step: err,
			err: fmt.Errorf("not carried out: %w; kubelet's stop goes ahead", err)}
	}
	r.fence, r.ctx = f, fctx
	return nil
}

// config is the new container's config for a swap asked for by a caller:
// the recorded config with the change, and with specHash kubelet's hash for
// the spec the caller writes after the commit.
func (r *run) config(specHash bool) *runtimeapi.ContainerConfig {
	cfg := applyChange(r.oldReq.Config, r.change, r.imageRef, r.userImage)
	if specHash {
		if cfg.Annotations == nil {
			cfg.Annotations = map[string]string{}
		}
		cfg.Annotations[AnnotationHash] = r.hooks.SpecHash // cfg is applyChange's copy
	}
	return cfg
}

// setNewConfig records the new container's request in the journal and the
// record, before create-new is journaled.
func (r *run) setNewConfig(cfg *runtimeapi.ContainerConfig) {
	setLimits(cfg, r.t.limits) // cfg is a copy (applyChange's)
	r.j.NewAttempt = nextAttempt(cfg, r.oldReq.Config)
	r.newReq = &runtimeapi.CreateContainerRequest{PodSandboxId: r.oldReq.PodSandboxId, Config: cfg, SandboxConfig: r.oldReq.SandboxConfig}
	r.j.NewRequest, _ = proto.Marshal(r.newReq)
	r.rec.To = summary(cfg)
}

// doCreateNew creates the new container while the old one still runs. From
// here kubelet sees none of the swap's containers until the new one has
// proved itself (or the rollback container runs).
func (r *run) doCreateNew() error { return r.createNew(r.newReq) }

// createNew creates the new container from req (newReq, or an overlap's
// copy of it with the bind trap); newReq is what is recorded.
func (r *run) createNew(req *runtimeapi.CreateContainerRequest) error {
	r.fence.MaskNew(r.e.fences, r.t.status, r.t.container)
	resp, err := runToEnd(r.ctx, func(ctx context.Context) (*runtimeapi.CreateContainerResponse, error) {
		return r.e.rt.CreateContainer(ctx, req)
	})
	if err != nil {
		return err
	}
	r.newID = resp.ContainerId
	r.fence.Hide(r.e.fences, r.newID)
	if r.hooks.SpecHash != "" && r.kube == nil {
		r.e.kubelet.PresentHash(r.newID, r.oldReq.Config.GetAnnotations()[AnnotationHash])
	}
	r.rec.NewContainerId = r.newID
	r.j.NewContainerID = r.newID
	if err := r.e.store.PutContainer(r.newID, r.newReq); err != nil {
		return err
	}
	if r.change.Image != nil {
		r.flushPulled()
	}
	return nil
}

// stopOld masks the old container — from the stop on kubelet sees it as it
// was — and stops it. Downtime as the swap defines it starts when the stop
// returns: the stop itself (the app's own graceful shutdown) is in the
// stop-old step's timing.
func (r *run) stopOld(timeout int64) error {
	r.pastStop = true
	r.fence.Mask(r.e.fences, r.t.status, r.t.container)
	_, err := runToEnd(r.ctx, func(ctx context.Context) (*runtimeapi.StopContainerResponse, error) {
		return r.e.rt.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: r.t.container.Id, Timeout: timeout})
	})
	r.stopped = err == nil
	r.downStart = r.e.now()
	return err
}

// doHealthGate waits for the new container to prove healthy: the request's
// checks, and a listener on every port the old container listened on. A
// port that never came ends the gate at once: the clients parked on it wait
// for the rollback.
func (r *run) doHealthGate() error {
	if r.listeners == nil || !r.hold.requireListeners {
		return r.healthGate(r.ctx, r.newID)
	}
	ctx, cancel := context.WithCancelCause(r.ctx)
	defer cancel(nil)
	verdict := make(chan error, 1)
	go func() {
		err := r.awaitListeners(ctx)
		if err != nil {
			cancel(err)
		}
		verdict <- err
	}()
	if err := r.healthGate(ctx, r.newID); err != nil {
		if cause := context.Cause(ctx); ctx.Err() != nil && r.ctx.Err() == nil {
			return cause
		}
		return err
	}
	return <-verdict
}

func (r *run) doStartNew() error {
	_, err := runToEnd(r.ctx, func(ctx context.Context) (*runtimeapi.StartContainerResponse, error) {
		return r.e.rt.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: r.newID})
	})
	r.rec.DowntimeNs = int64(r.e.now().Sub(r.downStart))
	r.markStarted()
	return err
}

// preStopSpent is the time preStop took so far (none when it did not run):
// like kubelet, the stop gets what is left of the grace period.
func (r *run) preStopSpent() time.Duration {
	if r.preStopStart.IsZero() {
		return 0
	}
	return r.e.now().Sub(r.preStopStart)
}

// logCommit reports a failed commit: the new container runs and kubelet
// will adopt it; only the bookkeeping (the sticky override) failed.
func (r *run) logCommit(err error) error {
	if err != nil {
		r.log.Error("commit bookkeeping failed", zap.Error(err))
	}
	return err
}

// undo runs the undo of the last step reached and ends the swap.
func (r *run) undo(u undo, cause error) {
	cctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	switch {
	case u == undoNothing:
		r.finish(r.out, inplacedv1.SwapState_SWAP_STATE_FAILED, cause)
	case u == undoRemoveNew:
		r.abandon(cctx, cause)
	case r.ctx.Err() != nil:
		r.abortStopped(cctx, cause)
	case u == undoStepAside:
		r.stepAside(cctx, cause)
	default:
		r.rollBack(cctx, cause)
	}
}

// abandon ends a swap that never stopped the old container: the new
// container (if created) goes, the old one runs on untouched.
func (r *run) abandon(cctx context.Context, cause error) {
	if r.newID != "" {
		r.removeContainer(cctx, r.newID)
	}
	state := inplacedv1.SwapState_SWAP_STATE_FAILED
	if r.ctx.Err() != nil {
		state = inplacedv1.SwapState_SWAP_STATE_ABORTED
		cause = fmt.Errorf("%v: %w", cause, context.Cause(r.ctx))
	}
	r.finish(r.out, state, fmt.Errorf("%w; the old container was not stopped and runs on", cause))
}

// abortStopped ends a swap aborted after the old container was stopped (pod
// removed, kubelet stopped the container): it cleans up and lets kubelet's
// intent win.
func (r *run) abortStopped(cctx context.Context, cause error) {
	if r.newID != "" {
		r.removeContainer(cctx, r.newID)
	}
	r.out = fence.Outcome{}
	r.rec.RunningContainerId = "" // the old container was stopped; kubelet decides what runs next
	r.finish(r.out, inplacedv1.SwapState_SWAP_STATE_ABORTED, fmt.Errorf("%v (aborted: %w)", cause, context.Cause(r.ctx)))
}

// stepAside ends a failed kubelet-driven swap: kubelet is about to create
// the container from the spec itself, so the swap steps aside rather than
// roll back to a config kubelet would kill.
func (r *run) stepAside(cctx context.Context, cause error) {
	if r.newID != "" {
		r.rec.ExitCode = r.exitCode(cctx, r.newID)
		r.removeContainer(cctx, r.newID)
	}
	r.out = fence.Outcome{}
	r.rec.RunningContainerId = ""
	r.finish(r.out, inplacedv1.SwapState_SWAP_STATE_FAILED, fmt.Errorf("%w; the old container is stopped and kubelet creates the new one itself", cause))
}

// rollBack runs the rollback plan after a failure past stop-old.
func (r *run) rollBack(cctx context.Context, cause error) {
	if r.newID != "" {
		r.rec.ExitCode = r.exitCode(cctx, r.newID)
	}
	r.ctx = cctx // the rollback runs on the cleanup context: the abort it answers must not cut it short
	for _, s := range rollbackPlan() {
		if err := r.run(s); err != nil {
			r.fence.Unmask()
			r.log.Error("ROLLBACK FAILED: the old container is stopped and kubelet will recreate it from the pod spec",
				zap.Error(err), zap.NamedError("cause", cause))
			r.out = fence.Outcome{}
			r.rec.RunningContainerId = ""
			r.finish(r.out, inplacedv1.SwapState_SWAP_STATE_ROLLBACK_FAILED,
				fmt.Errorf("%v; ROLLBACK FAILED: %v — the container is stopped and kubelet will recreate it from the pod spec", cause, err))
			return
		}
	}
	r.out = fence.Outcome{RunningID: r.rollbackID}
	r.rec.RunningContainerId = r.rollbackID
	r.finish(r.out, inplacedv1.SwapState_SWAP_STATE_FAILED, fmt.Errorf("%w; rolled back: the old configuration runs again as %s", cause, short(r.rollbackID)))
}

// doRollback removes the new container (kubelet must never see a newer
// exited container of the name: it would chase it) and creates the old
// configuration again as the next attempt.
func (r *run) doRollback() (err error) {
	if r.newID != "" {
		r.removeContainer(r.ctx, r.newID)
	}
	r.rollbackID, err = r.e.recreate(r.ctx, r.oldReq, r.newReq.Config)
	return err
}
