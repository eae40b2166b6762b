package swap

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/pkg/fence"
	"github.com/inplaced/inplaced/pkg/store"
	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

// cleanupTimeout bounds the undo work, which runs on a fresh context so that
// an aborted swap still cleans up after itself.
const cleanupTimeout = 2 * time.Minute

// runtimeDownWait bounds how long the health gate waits for a runtime that
// answers Unavailable (restarting) before it counts as a failure.
const runtimeDownWait = time.Minute

// runtimeDown reports whether err says the runtime is not serving (being
// restarted): the container it was asked about is not the cause.
func runtimeDown(err error) bool { return status.Code(err) == codes.Unavailable }

// runtimeGone reports whether err is the runtime's NotFound: the container
// or sandbox asked about no longer exists, which a stop or a removal takes
// as done.
func runtimeGone(err error) bool { return status.Code(err) == codes.NotFound }

// sleepCtx waits d, or returns ctx's cause when it ends first.
func sleepCtx(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-time.After(d):
		return nil
	}
}

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
	kube    *kubeletRun // set for a kubelet-driven swap
	hooks   Hooks
	endErr  error
	// hold is what the swap does about new connections (connectionHold);
	// holdDone delivers the hold's result (nil: no hold).
	hold     holdPlan
	holdDone chan HoldResult
	// listeners delivers, once, the ports the old container listened on
	// that the new one had not by the hold's limit (watchHold);
	// neverListened keeps them for the record, holdListened are the ports
	// the old container listened on.
	listeners                   chan []uint16
	neverListened, holdListened []uint16
	// newStarted is closed once start-new has run (or the swap ended without
	// it); newAt is when. The new container's time to listen counts
	// from there, not from the hold's install: the old one's graceful stop
	// is not the new one's to pay for.
	newStarted chan struct{}
	newOnce    sync.Once
	newAt      time.Time
	// tk is an overlap swap's handover (nil: stop-first).
	tk *takeoverRun

	// The execution's state, owned by the run's goroutine (exec.go): the
	// context (the fence's once it is taken), how the fence is released,
	// and what the steps so far produced.
	ctx                 context.Context
	out                 fence.Outcome
	imageRef, userImage string
	newID, rollbackID   string
	stopped             bool // the old container was stopped
	// pastStop: the stop of the old container was asked for; from here the
	// swap goes on to a running container (forward or back) even when the
	// journal cannot be written.
	pastStop     bool
	journalError error // the first journal write that failed past the stop
	preStopStart time.Time
	downStart    time.Time

	// shown is a copy of rec for listings while the swap runs (rec itself
	// belongs to the run's goroutine); running is the step under way.
	shownMu sync.Mutex
	shown   *inplacedv1.SwapRecord
	running *inplacedv1.Step
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
		SandboxId: c.PodSandboxId, OldContainerId: c.Id, RunningContainerId: c.Id, RuntimeHandler: t.identity.handler,
		From:   summary(t.request.Config),
		Caller: &inplacedv1.Caller{Uid: caller.UID, Pid: caller.PID, Exe: caller.Exe, Description: caller.Description},
		State:  inplacedv1.SwapState_SWAP_STATE_RUNNING, StartedUnixNano: now.UnixNano(),
	}
	r.j = &store.JournalEntry{SwapID: id, Kind: kind, SandboxID: c.PodSandboxId, ContainerName: t.name, OldContainerID: c.Id}
	r.j.OldRequest, _ = proto.Marshal(t.request)
	return r
}

func (r *run) subscribe() *Subscription { return r.bc.subscribe() }

// admitted records the admission check's warning, if any.
func (r *run) admitted(warning string) {
	if warning == "" {
		return
	}
	now := r.e.now().UnixNano()
	r.rec.Steps = append(r.rec.Steps, &inplacedv1.Step{Name: StepAdmission, StartedUnixNano: now, Error: warning})
	r.log.Warn("swap goes on despite the admission check", zap.String("warning", warning))
}

// snapshot publishes a copy of the record for listings; running, when set,
// is the step under way.
func (r *run) snapshot(running ...*inplacedv1.Step) {
	c := proto.Clone(r.rec).(*inplacedv1.SwapRecord)
	c.Steps = append(c.Steps, running...)
	r.shownMu.Lock()
	r.shown = c
	r.shownMu.Unlock()
}

func (r *run) record() *inplacedv1.SwapRecord {
	r.shownMu.Lock()
	defer r.shownMu.Unlock()
	return r.shown
}

func (r *run) emit(step, msg string) {
	r.bc.publish(&inplacedv1.SwapEvent{SwapId: r.rec.Id, Step: step, Message: msg, TimeUnixNano: r.e.now().UnixNano()})
}

// journal writes the step about to be taken. Before the old container is
// stopped a failed write ends the swap (journalFailed): its undo leaves the
// old container running, and nothing is lost but the swap. Once the stop
// was asked for, the pod's container depends on the swap reaching its end,
// forward or rolled back, whatever the state store says (a full or failing
// disk): the failure is recorded and the swap goes on without the entry. A
// crash before the next write is recovered from the last step written,
// which recovery settles from what the runtime shows.
func (r *run) journal(step store.JournalStep) error {
	r.j.Step = step
	r.j.Record, _ = proto.Marshal(r.rec)
	err := r.e.journal.PutJournal(r.j)
	if err == nil {
		return nil
	}
	if !r.pastStop {
		return &journalFailed{err: err}
	}
	if r.journalError == nil {
		r.journalError = err
		r.rec.Steps = append(r.rec.Steps, &inplacedv1.Step{Name: StepJournal, StartedUnixNano: r.e.now().UnixNano(),
			Error: fmt.Sprintf("journal not written before %s (%v): the old container was already stopped, so the swap went on without it", step, err)})
	}
	r.log.Error("swap journal not written: going on, the old container is stopped", zap.String("journal_step", string(step)), zap.Error(err))
	return nil
}

// journalFailed is a journal write that failed before its step: the step
// was not taken.
type journalFailed struct{ err error }

func (j *journalFailed) Error() string { return "write swap journal: " + j.err.Error() }
func (j *journalFailed) Unwrap() error { return j.err }

// step journals js (when set) before running fn, times it and reports it.
func (r *run) step(name string, js store.JournalStep, fn func() error) error {
	if js != "" {
		if err := r.journal(js); err != nil {
			return err
		}
	}
	start := r.e.now()
	r.emit(name, "started")
	r.running = &inplacedv1.Step{Name: name, StartedUnixNano: start.UnixNano()}
	r.snapshot(r.running)
	r.e.obs.StepStarted(r.rec, name)
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
	r.snapshot()
	r.e.obs.StepEnded(r.rec, st)
	if err == nil {
		r.e.maybeCrash(name)
	}
	return err
}

// flushPulled writes back what the pull and the create left dirty in the
// page cache, while the old container still serves. Stopping the old
// container unmounts its overlay rootfs, and that unmount syncs the whole
// filesystem underneath (overlayfs' sync_fs): a freshly pulled image's
// pages would otherwise be written back inside the downtime. make bench
// measured it there at 250–450 ms of a 300–515 ms downtime with the 100 MiB
// image (containerd answered StopContainer that long after the old process
// exited). sync(2) because inplaced does not know where the runtime keeps
// its content; it is part of the create-new step's time.
func (r *run) flushPulled() {
	start := r.e.now()
	unix.Sync()
	r.log.Debug("flushed the pulled image before the stop", zap.Duration("took", r.e.now().Sub(start)))
}

// runToEnd makes a runtime call that an abort must not cut short. containerd
// finishes a create, stop or start it began even when its caller goes away,
// and until then refuses to remove the container ("container is in starting
// state"); a swap that gave up on the call would clean up too early and
// leave the container behind, failing kubelet's RemovePodSandbox. The call
// keeps ctx's values, not its cancellation, and is bounded by
// cleanupTimeout; the caller checks ctx for an abort afterwards.
func runToEnd[T any](ctx context.Context, call func(context.Context) (T, error)) (T, error) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	return call(cctx)
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
	ref, err := r.pullImage(ctx, req)
	r.auth = nil // credentials live for the pull only
	if err != nil {
		return "", "", fmt.Errorf("pull %s: %w", userImage, err)
	}
	return ref, userImage, nil
}

// pullImage pulls through the Puller when there is one, publishing its
// progress on the swap's event stream (at most every progressEvery).
func (r *run) pullImage(ctx context.Context, req *runtimeapi.PullImageRequest) (string, error) {
	if r.e.puller == nil {
		resp, err := r.e.img.PullImage(ctx, req)
		if err != nil {
			return "", err
		}
		return resp.ImageRef, nil
	}
	var last time.Time
	return r.e.puller.Pull(ctx, req, func(p *inplacedv1.PullProgress) {
		if now := r.e.now(); p.Done || now.Sub(last) >= progressEvery {
			last = now
			if st := r.running; st != nil && st.Name == StepPull {
				// Listings of running swaps show how far the pull is.
				shown := proto.Clone(st).(*inplacedv1.Step)
				shown.Pull = proto.Clone(p).(*inplacedv1.PullProgress)
				r.snapshot(shown)
			}
			r.bc.publish(&inplacedv1.SwapEvent{SwapId: r.rec.Id, Step: StepPull, Message: progressText(p),
				TimeUnixNano: now.UnixNano(), Pull: p})
		}
	})
}

// progressEvery spaces the pull progress events of a swap.
const progressEvery = 500 * time.Millisecond

// progressText is a pull's progress in words, for event messages.
func progressText(p *inplacedv1.PullProgress) string {
	if !p.BytesKnown {
		return fmt.Sprintf("pulling %s, %s elapsed (%s)", p.Image, time.Duration(p.ElapsedNs).Round(time.Second), p.Note)
	}
	return fmt.Sprintf("%s: %.1f/%.1f MiB, %d/%d layers, %.1f MiB/s", p.Image, float64(p.BytesDone)/(1<<20),
		float64(p.BytesTotal)/(1<<20), p.LayersDone, p.LayersTotal, float64(p.BytesPerSecond)/(1<<20))
}

// dropOverride commits a revert: kubelet's declared config runs again, so
// the sticky override goes.
func (r *run) dropOverride() error {
	if err := r.e.store.DeleteOverride(r.t.container.PodSandboxId, r.t.name); err != nil {
		return err
	}
	r.e.obs.OverrideChanged(r.rec, false)
	return nil
}

// commit makes the swap sticky: kubelet's next CreateContainer for this
// name gets the swapped config (see package intercept).
func (r *run) commit() error {
	c := r.t.container
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
	if err := r.e.store.PutOverride(o); err != nil {
		return err
	}
	r.e.obs.OverrideChanged(r.rec, true)
	return nil
}

// recreate creates and starts a container from req as the attempt after
// `after`, recording it. It undoes its create when the start fails so that
// no exited newest container is left for kubelet to chase.
func (e *Engine) recreate(ctx context.Context, req *runtimeapi.CreateContainerRequest, after *runtimeapi.ContainerConfig) (string, error) {
	cfg := proto.Clone(req.Config).(*runtimeapi.ContainerConfig)
	nextAttempt(cfg, after)
	rb := &runtimeapi.CreateContainerRequest{PodSandboxId: req.PodSandboxId, Config: cfg, SandboxConfig: req.SandboxConfig}
	resp, err := e.rt.CreateContainer(ctx, rb)
	// A rollback is what puts the old container back: while the runtime
	// restarts, wait for it (within ctx, the cleanup bound) rather than
	// leave the name without a container.
	for err != nil && runtimeDown(err) {
		if werr := sleepCtx(ctx, 500*time.Millisecond); werr != nil {
			break
		}
		resp, err = e.rt.CreateContainer(ctx, rb)
	}
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
	r.e.kubelet.EndPresent(id)
	// Through a runtime restart too: a swapped-in container left running
	// would be a second one of the name.
	_, err := r.e.rt.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: id, Timeout: 2})
	for err != nil && runtimeDown(err) && sleepCtx(ctx, 500*time.Millisecond) == nil {
		_, err = r.e.rt.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: id, Timeout: 2})
	}
	if err != nil {
		r.log.Warn("stop swapped-in container", zap.String("new_container_id", id), zap.Error(err))
	}
	_, err = r.e.rt.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: id})
	for err != nil && runtimeDown(err) && sleepCtx(ctx, 500*time.Millisecond) == nil {
		_, err = r.e.rt.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: id})
	}
	if err != nil {
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
	r.markStarted() // a swap that ended before start-new: the hold's watcher waits for no start
	r.endHold()
	r.endTakeover()
	r.rec.State = state
	r.rec.FinishedUnixNano = r.e.now().UnixNano()
	r.rec.SandboxKept = r.e.sandboxKept(r.rec.SandboxId, r.t.identity)
	r.endErr = err
	if err != nil {
		r.rec.Error = err.Error()
	}
	r.snapshot()
	if perr := r.e.store.PutSwap(r.rec); perr != nil {
		r.log.Error("record swap", zap.Error(perr))
	}
	if derr := r.e.journal.DeleteJournal(r.rec.Id); derr != nil {
		r.log.Error("clear swap journal", zap.Error(derr))
	}
	fields := []zap.Field{zap.String("state", state.String()), zap.Duration("downtime", time.Duration(r.rec.DowntimeNs)),
		zap.String("running_container_id", out.RunningID)}
	if err != nil {
		r.log.Warn("swap ended", append(fields, zap.Error(err))...)
	} else {
		r.log.Info("swap ended", fields...)
	}
	r.e.tell(true, r.rec)
	r.bc.publish(&inplacedv1.SwapEvent{SwapId: r.rec.Id, Step: "end", Message: state.String(),
		TimeUnixNano: r.e.now().UnixNano(), Record: proto.Clone(r.rec).(*inplacedv1.SwapRecord)})
}
