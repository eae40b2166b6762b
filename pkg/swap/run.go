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
	"github.com/inplaced/inplaced/pkg/store"
	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

// Step names, as shown to users and accepted by the crash test switch.
const (
	StepPull       = "pull"
	StepPreStop    = "pre-stop"
	StepStopOld    = "stop-old"
	StepCreateNew  = "create-new"
	StepStartNew   = "start-new"
	StepPostStart  = "post-start"
	StepHealthGate = "health-gate"
	StepCommit     = "commit"
	StepRollback   = "rollback"
)

// cleanupTimeout bounds the undo work, which runs on a fresh context so that
// an aborted swap still cleans up after itself.
const cleanupTimeout = 2 * time.Minute

type run struct {
	e      *Engine
	t      *target
	change *inplacedv1.Change
	opts   *inplacedv1.SwapOptions
	auth   *inplacedv1.RegistryAuth
	fence  *fence.Fence
	log    *zap.Logger

	rec     *inplacedv1.SwapRecord
	j       *store.JournalEntry
	oldReq  *runtimeapi.CreateContainerRequest
	newReq  *runtimeapi.CreateContainerRequest
	bc      broadcaster
	started time.Time
}

func newRun(e *Engine, id, kind string, t *target, change *inplacedv1.Change, opts *inplacedv1.SwapOptions,
	auth *inplacedv1.RegistryAuth, caller Caller, f *fence.Fence) *run {
	c := t.container
	now := e.now()
	r := &run{
		e: e, t: t, change: change, opts: opts, auth: auth, fence: f, started: now,
		oldReq: t.request,
		log: e.log.With(zap.String("swap_id", id), zap.String("container_id", c.Id),
			zap.String("sandbox_id", c.PodSandboxId), zap.String("container", t.name)),
	}
	r.rec = &inplacedv1.SwapRecord{
		Id: id, Kind: kind,
		Namespace: c.Labels[LabelPodNamespace], Pod: c.Labels[LabelPodName], Container: t.name,
		SandboxId: c.PodSandboxId, OldContainerId: c.Id, RunningContainerId: c.Id,
		From:   summary(t.request.Config),
		Caller: &inplacedv1.Caller{Uid: caller.UID, Pid: caller.PID},
		State:  inplacedv1.SwapState_SWAP_STATE_RUNNING, StartedUnixNano: now.UnixNano(),
	}
	r.j = &store.JournalEntry{SwapID: id, Kind: kind, SandboxID: c.PodSandboxId, ContainerName: t.name, OldContainerID: c.Id}
	r.j.OldRequest, _ = proto.Marshal(t.request)
	return r
}

func (r *run) subscribe() *Subscription { return r.bc.subscribe() }

func (r *run) emit(step, msg string) {
	r.bc.publish(&inplacedv1.SwapEvent{SwapId: r.rec.Id, Step: step, Message: msg, TimeUnixNano: r.e.now().UnixNano()})
}

func (r *run) journal(step store.JournalStep) error {
	r.j.Step = step
	r.j.Record, _ = proto.Marshal(r.rec)
	if err := r.e.store.PutJournal(r.j); err != nil {
		return fmt.Errorf("write swap journal: %w", err)
	}
	return nil
}

// step journals js (when set) before running fn, times it and reports it.
func (r *run) step(name string, js store.JournalStep, fn func() error) error {
	if js != "" {
		if err := r.journal(js); err != nil {
			return err
		}
	}
	start := r.e.now()
	r.emit(name, "started")
	err := fn()
	st := &inplacedv1.Step{Name: name, StartedUnixNano: start.UnixNano(), DurationNs: int64(r.e.now().Sub(start))}
	if err != nil {
		st.Error = err.Error()
		r.emit(name, "failed: "+err.Error())
		r.log.Warn("swap step failed", zap.String("step", name), zap.Error(err))
	} else {
		r.emit(name, fmt.Sprintf("done in %s", time.Duration(st.DurationNs).Round(time.Millisecond)))
		r.log.Info("swap step done", zap.String("step", name), zap.Duration("duration", time.Duration(st.DurationNs)))
	}
	r.rec.Steps = append(r.rec.Steps, st)
	if err == nil {
		r.e.maybeCrash(name)
	}
	return err
}

// execute runs the swap to its end. It never returns with the container
// name left without a container unless the rollback itself failed, which
// it reports as ROLLBACK_FAILED after leaving things as kubelet would
// recreate them.
func (r *run) execute(ctx context.Context) {
	out := fence.Outcome{RunningID: r.t.container.Id}
	defer func() {
		r.e.fences.Release(r.fence, out)
		r.bc.close()
	}()
	r.log.Info("swap started", zap.String("kind", r.rec.Kind))

	var imageRef, userImage string
	err := r.step(StepPull, store.StepPrepared, func() (err error) {
		imageRef, userImage, err = r.pull(ctx)
		return err
	})
	if err != nil {
		r.finish(out, inplacedv1.SwapState_SWAP_STATE_FAILED, fmt.Errorf("pull failed, old container untouched: %w", err))
		return
	}
	newCfg := applyChange(r.oldReq.Config, r.change, imageRef, userImage)
	r.j.NewAttempt = nextAttempt(newCfg, r.oldReq.Config)
	r.newReq = &runtimeapi.CreateContainerRequest{PodSandboxId: r.oldReq.PodSandboxId, Config: newCfg, SandboxConfig: r.oldReq.SandboxConfig}
	r.j.NewRequest, _ = proto.Marshal(r.newReq)
	r.rec.To = summary(newCfg)

	// From here kubelet sees none of the swap's containers until the new
	// one has proved itself (or the rollback container runs); from the stop
	// on it sees the old container as it was.
	r.fence.MaskNew(r.e.fences, r.t.status, r.t.container)

	// The new container is created while the old one still runs: creating
	// it (snapshot, spec) is work that need not be downtime. containerd
	// starts no process before StartContainer.
	var newID string
	err = r.step(StepCreateNew, store.StepCreateNew, func() error {
		resp, err := r.e.rt.CreateContainer(ctx, r.newReq)
		if err != nil {
			return err
		}
		newID = resp.ContainerId
		r.fence.Hide(r.e.fences, newID)
		r.rec.NewContainerId = newID
		r.j.NewContainerID = newID
		return r.e.store.PutContainer(newID, r.newReq)
	})
	if err != nil {
		r.abandon(ctx, &out, newID, fmt.Errorf("create new container: %w", err))
		return
	}

	grace := r.gracePeriod()
	preStopStart := r.e.now()
	if !r.opts.GetSkipPreStop() {
		// kubelet goes on with the stop when preStop fails; so do we.
		_ = r.step(StepPreStop, store.StepPreStop, func() error { return r.preStop(ctx, grace) })
	}
	if ctx.Err() != nil {
		r.abandon(ctx, &out, newID, errors.New("aborted before the old container was stopped"))
		return
	}

	r.fence.Mask(r.e.fences, r.t.status, r.t.container)
	err = r.step(StepStopOld, store.StepStopOld, func() error {
		timeout := stopTimeout(grace, r.e.now().Sub(preStopStart))
		_, err := r.e.rt.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: r.t.container.Id, Timeout: timeout})
		return err
	})
	// Downtime as the issue defines it: old container stopped → new
	// container running. The stop itself (the app's own graceful shutdown)
	// is in the stop-old step's timing.
	downStart := r.e.now()
	if err != nil {
		r.fail(ctx, &out, newID, fmt.Errorf("stop old container: %w", err))
		return
	}
	err = r.step(StepStartNew, store.StepStartNew, func() error {
		_, err := r.e.rt.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: newID})
		return err
	})
	r.rec.DowntimeNs = int64(r.e.now().Sub(downStart))
	if err != nil {
		r.fail(ctx, &out, newID, fmt.Errorf("start new container: %w", err))
		return
	}
	if h := r.opts.GetPostStart(); h != nil {
		if err := r.step(StepPostStart, "", func() error { return r.runHandler(ctx, newID, h, grace) }); err != nil {
			r.fail(ctx, &out, newID, fmt.Errorf("postStart hook: %w", err))
			return
		}
	}
	if err := r.step(StepHealthGate, store.StepHealthGate, func() error { return r.healthGate(ctx, newID) }); err != nil {
		r.fail(ctx, &out, newID, fmt.Errorf("health gate: %w", err))
		return
	}
	if err := r.step(StepCommit, "", func() error { return r.commit(newID) }); err != nil {
		// The new container runs and kubelet will adopt it; only the sticky
		// override could not be written.
		r.log.Error("commit bookkeeping failed", zap.Error(err))
	}
	out = fence.Outcome{RunningID: newID, Committed: true}
	r.rec.RunningContainerId = newID
	r.finish(out, inplacedv1.SwapState_SWAP_STATE_COMMITTED, nil)
}

// pull makes sure the new image is on the node before anything is touched.
func (r *run) pull(ctx context.Context) (imageRef, userImage string, err error) {
	if r.change.Image == nil {
		if img := r.oldReq.Config.GetImage(); img != nil {
			return img.Image, img.UserSpecifiedImage, nil
		}
		return "", "", errors.New("recorded config has no image")
	}
	userImage = r.change.GetImage()
	req := &runtimeapi.PullImageRequest{
		Image:         &runtimeapi.ImageSpec{Image: userImage, UserSpecifiedImage: userImage},
		SandboxConfig: r.oldReq.SandboxConfig,
	}
	if a := r.auth; a != nil {
		req.Auth = &runtimeapi.AuthConfig{Username: a.Username, Password: a.Password, Auth: a.Auth,
			ServerAddress: a.ServerAddress, IdentityToken: a.IdentityToken, RegistryToken: a.RegistryToken}
	}
	if h := r.oldReq.Config.GetImage().GetRuntimeHandler(); h != "" {
		req.Image.RuntimeHandler = h
	}
	resp, err := r.e.img.PullImage(ctx, req)
	r.auth = nil // credentials live for the pull only
	if err != nil {
		return "", "", fmt.Errorf("pull %s: %w", userImage, err)
	}
	return resp.ImageRef, userImage, nil
}

// commit makes the swap sticky: kubelet's next CreateContainer for this
// name gets the swapped config (see package intercept).
func (r *run) commit(newID string) error {
	c := r.t.container
	if r.rec.Kind == "revert" {
		return r.e.store.DeleteOverride(c.PodSandboxId, r.t.name)
	}
	cfg := r.newReq.Config
	o := &store.Override{
		SandboxID: c.PodSandboxId, Namespace: c.Labels[LabelPodNamespace], Pod: c.Labels[LabelPodName],
		PodUID: c.Labels[LabelPodUID], Container: r.t.name, SwapID: r.rec.Id,
		Hash:  r.oldReq.Config.GetAnnotations()[AnnotationHash],
		Image: cfg.GetImage().GetUserSpecifiedImage(), Command: cfg.Command, Args: cfg.Args,
	}
	if o.Image == "" {
		o.Image = cfg.GetImage().GetImage()
	}
	for _, kv := range cfg.Envs {
		o.Env = append(o.Env, store.KV{Key: kv.Key, Value: string(kv.Value)})
	}
	if prev, err := r.e.store.Override(c.PodSandboxId, r.t.name); err == nil {
		o.Declared = prev.Declared
	} else {
		o.Declared, _ = proto.Marshal(r.oldReq)
	}
	return r.e.store.PutOverride(o)
}

// abandon ends a swap that never stopped the old container: the new
// container (if created) goes, the old one runs on untouched.
func (r *run) abandon(ctx context.Context, out *fence.Outcome, newID string, cause error) {
	cctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	if newID != "" {
		r.removeContainer(cctx, newID)
	}
	state := inplacedv1.SwapState_SWAP_STATE_FAILED
	if ctx.Err() != nil {
		state = inplacedv1.SwapState_SWAP_STATE_ABORTED
		cause = fmt.Errorf("%v: %w", cause, context.Cause(ctx))
	}
	r.finish(*out, state, fmt.Errorf("%w; the old container was not stopped and runs on", cause))
}

// fail undoes a swap that got past stopping the old container. An abort
// (pod removed, kubelet stopped the container) cleans up and lets kubelet's
// intent win; anything else rolls back to the old configuration.
func (r *run) fail(ctx context.Context, out *fence.Outcome, newID string, cause error) {
	cctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	if ctx.Err() != nil {
		if newID != "" {
			r.removeContainer(cctx, newID)
		}
		*out = fence.Outcome{}
		r.rec.RunningContainerId = "" // the old container was stopped; kubelet decides what runs next
		r.finish(*out, inplacedv1.SwapState_SWAP_STATE_ABORTED, fmt.Errorf("%v (aborted: %w)", cause, context.Cause(ctx)))
		return
	}
	if newID != "" {
		r.rec.ExitCode = r.exitCode(cctx, newID)
	}
	var rbID string
	err := r.step(StepRollback, store.StepRollingBack, func() (err error) {
		if newID != "" {
			r.removeContainer(cctx, newID)
		}
		rbID, err = r.e.recreate(cctx, r.oldReq, r.newReq.Config)
		return err
	})
	if err != nil {
		r.fence.Unmask()
		r.log.Error("ROLLBACK FAILED: the old container is stopped and kubelet will recreate it from the pod spec",
			zap.Error(err), zap.NamedError("cause", cause))
		*out = fence.Outcome{}
		r.rec.RunningContainerId = ""
		r.finish(*out, inplacedv1.SwapState_SWAP_STATE_ROLLBACK_FAILED,
			fmt.Errorf("%v; ROLLBACK FAILED: %v — the container is stopped and kubelet will recreate it from the pod spec", cause, err))
		return
	}
	*out = fence.Outcome{RunningID: rbID}
	r.rec.RunningContainerId = rbID
	r.finish(*out, inplacedv1.SwapState_SWAP_STATE_FAILED, fmt.Errorf("%w; rolled back: the old configuration runs again as %s", cause, short(rbID)))
}

// recreate creates and starts a container from req as the attempt after
// `after`, recording it. It undoes its create when the start fails so that
// no exited newest container is left for kubelet to chase.
func (e *Engine) recreate(ctx context.Context, req *runtimeapi.CreateContainerRequest, after *runtimeapi.ContainerConfig) (string, error) {
	cfg := proto.Clone(req.Config).(*runtimeapi.ContainerConfig)
	nextAttempt(cfg, after)
	rb := &runtimeapi.CreateContainerRequest{PodSandboxId: req.PodSandboxId, Config: cfg, SandboxConfig: req.SandboxConfig}
	resp, err := e.rt.CreateContainer(ctx, rb)
	if err != nil {
		return "", fmt.Errorf("recreate old configuration: %w", err)
	}
	if _, err := e.rt.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: resp.ContainerId}); err != nil {
		_, _ = e.rt.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: resp.ContainerId})
		return "", fmt.Errorf("start recreated old configuration: %w", err)
	}
	if err := e.store.PutContainer(resp.ContainerId, rb); err != nil {
		e.log.Error("record recreated container", zap.String("container_id", resp.ContainerId), zap.Error(err))
	}
	return resp.ContainerId, nil
}

func (r *run) removeContainer(ctx context.Context, id string) {
	if _, err := r.e.rt.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: id, Timeout: 2}); err != nil {
		r.log.Warn("stop swapped-in container", zap.String("new_container_id", id), zap.Error(err))
	}
	if _, err := r.e.rt.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: id}); err != nil {
		r.log.Warn("remove swapped-in container", zap.String("new_container_id", id), zap.Error(err))
	}
	_ = r.e.store.DeleteContainer(id)
}

func (r *run) exitCode(ctx context.Context, id string) int32 {
	st, err := r.e.rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id})
	if err != nil {
		return 0
	}
	return st.GetStatus().GetExitCode()
}

// finish records the end of the swap: history first, then the journal entry
// goes, so a crash in between leaves a journal that recovery finds settled.
func (r *run) finish(out fence.Outcome, state inplacedv1.SwapState, err error) {
	r.rec.State = state
	r.rec.FinishedUnixNano = r.e.now().UnixNano()
	if err != nil {
		r.rec.Error = err.Error()
	}
	if perr := r.e.store.PutSwap(r.rec); perr != nil {
		r.log.Error("record swap", zap.Error(perr))
	}
	if derr := r.e.store.DeleteJournal(r.rec.Id); derr != nil {
		r.log.Error("clear swap journal", zap.Error(derr))
	}
	fields := []zap.Field{zap.String("state", state.String()), zap.Duration("downtime", time.Duration(r.rec.DowntimeNs)),
		zap.String("running_container_id", out.RunningID)}
	if err != nil {
		r.log.Warn("swap ended", append(fields, zap.Error(err))...)
	} else {
		r.log.Info("swap ended", fields...)
	}
	r.bc.publish(&inplacedv1.SwapEvent{SwapId: r.rec.Id, Step: "end", Message: state.String(),
		TimeUnixNano: r.e.now().UnixNano(), Record: proto.Clone(r.rec).(*inplacedv1.SwapRecord)})
}
