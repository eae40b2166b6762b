package swap

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/pkg/fence"
	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

// CallerKubelet describes who asked for a kubelet-driven swap.
const CallerKubelet = "kubelet (pod spec)"

// KubeletChange is a pod spec image change kubelet is about to carry out by
// killing the container and creating a new one (package kube detects it).
type KubeletChange struct {
	// ContainerID is the running container kubelet will stop.
	ContainerID string
	// Image is the spec's new image reference.
	Image string
	// Hash is kubelet's container hash for the new spec
	// (io.kubernetes.container.hash): the new container carries it, so that
	// kubelet adopts it.
	Hash string
	// MetadataEnv is the env kubelet resolves from the pod's labels and
	// annotations (downward API fieldRef) at each create, with the pod's
	// current values: kubelet's own create of the new container would
	// carry them, so the new container does too — an earlier in-place swap
	// of them (env from metadata) is kept, where the declared config has
	// the values of the pod's first create. Only values that differ from
	// the declared config change anything.
	MetadataEnv map[string]string
	// Auths are the credentials to try for the pull, in kubelet's order
	// (the pod's imagePullSecrets, the node's docker config, kubelet's
	// credential-provider plugins; package credentials finds them); none
	// means an anonymous pull.
	Auths []*inplacedv1.RegistryAuth
	// ExplainPull (optional) wraps a failed pull's error with what the
	// failure means for kubelet's stop, for the record and its Event.
	ExplainPull func(error) error
}

// KubeletResult is how a kubelet-driven swap ended, for kubelet's
// StopContainer (which waits for it) and the calls that follow it.
type KubeletResult struct {
	SwapID string
	// Stopped: the old container was stopped (kubelet's StopContainer is
	// answered with success).
	Stopped bool
	// NewID and NewRequest: the new container runs; kubelet's
	// CreateContainer for the name is answered with it.
	NewID      string
	NewRequest *runtimeapi.CreateContainerRequest
	Err        error
}

// Prepared is a kubelet-driven swap whose pull runs ahead of kubelet's
// StopContainer: nothing is touched until Proceed.
type Prepared struct {
	r       *run
	pulled  chan struct{}
	pullErr error
	proceed chan int64 // kubelet's stop timeout
	done    chan struct{}
	result  KubeletResult
	cancel  context.CancelCauseFunc

	once sync.Once
}

// ID is the swap ID.
func (p *Prepared) ID() string { return p.r.rec.Id }

// Image is the image the swap pulls.
func (p *Prepared) Image() string { return p.r.change.GetImage() }

// OldContainerID is the container the swap replaces.
func (p *Prepared) OldContainerID() string { return p.r.t.container.Id }

// Pulled is closed when the pull has ended; PullErr says how.
func (p *Prepared) Pulled() <-chan struct{} { return p.pulled }

// PullErr is the pull's error, valid once Pulled is closed.
func (p *Prepared) PullErr() error { return p.pullErr }

// Done is closed when the swap has ended; Result says how.
func (p *Prepared) Done() <-chan struct{} { return p.done }

// Result is valid once Done is closed.
func (p *Prepared) Result() KubeletResult { return p.result }

// Cancel ends a swap that has not proceeded yet; the old container is left
// as it is. After Proceed it does nothing.
func (p *Prepared) Cancel(cause error) { p.cancel(cause) }

// Proceed runs the swap once the pull has succeeded: kubelet's StopContainer
// (timeout in seconds, as kubelet passed it) is what lets it go. It blocks
// until the swap has ended or ctx ends.
func (p *Prepared) Proceed(ctx context.Context, stopTimeout int64) (KubeletResult, error) {
	p.once.Do(func() {
		select {
		case p.proceed <- stopTimeout:
		case <-p.done:
		}
	})
	select {
	case <-p.done:
		return p.result, nil
	case <-ctx.Done():
		return KubeletResult{}, ctx.Err()
	}
}

// Prepare starts a kubelet-driven swap: it resolves the running container
// and its recorded configuration, and pulls the new image in the
// background at once. ctx bounds the wait for kubelet's StopContainer (the
// daemon's lifetime); once Proceed is called the swap runs to its end
// whatever happens to ctx.
func (e *Engine) Prepare(ctx context.Context, c KubeletChange) (*Prepared, error) {
	if c.Image == "" || c.Hash == "" || c.ContainerID == "" {
		return nil, invalidf("swap.Prepare: container ID, image and hash are required")
	}
	if err := e.checkReady(); err != nil {
		return nil, err
	}
	t, err := e.resolve(ctx, &inplacedv1.Target{ContainerId: c.ContainerID})
	if err != nil {
		return nil, err
	}
	warning, err := e.admission(ctx, t)
	if err != nil {
		return nil, err
	}
	base, hadOverride := e.declared(t)
	img := c.Image
	change := &inplacedv1.Change{Image: &img, SetEnv: envChanges(base, c.MetadataEnv)}
	id := newID(e.now())
	r := newRun(e, id, KindKubelet, t, change, &inplacedv1.SwapOptions{SkipPreStop: true}, nil,
		Caller{Description: CallerKubelet}, nil)
	r.rec.PodUid = t.container.Labels[LabelPodUID]
	r.admitted(warning)
	runCtx, cancel := context.WithCancelCause(context.Background())
	p := &Prepared{r: r, pulled: make(chan struct{}), proceed: make(chan int64, 1), done: make(chan struct{}), cancel: cancel}
	r.kube = &kubeletRun{prepared: p, hash: c.Hash, base: base, hadOverride: hadOverride, auths: c.Auths, explain: c.ExplainPull, parent: ctx}
	r.snapshot()
	e.launch(runCtx, r, p.done)
	return p, nil
}

// kubeletRun is what a kubelet-driven swap adds to a run.
type kubeletRun struct {
	prepared    *Prepared
	hash        string
	base        *runtimeapi.ContainerConfig // kubelet's declared config
	hadOverride bool
	auths       []*inplacedv1.RegistryAuth
	explain     func(error) error
	parent      context.Context
	stopTimeout int64
}

// declared is the config kubelet asked for: under an override (an earlier
// node-local swap) that is the override's declared request, since the spec
// change drops the override.
func (e *Engine) declared(t *target) (*runtimeapi.ContainerConfig, bool) {
	o, err := e.store.Override(t.container.PodSandboxId, t.name)
	if err != nil || len(o.Declared) == 0 {
		return t.request.Config, false
	}
	req := &runtimeapi.CreateContainerRequest{}
	if err := proto.Unmarshal(o.Declared, req); err != nil || req.Config == nil {
		e.log.Warn("override's declared config unreadable: swapping from the running config")
		return t.request.Config, true
	}
	return req.Config, true
}

// envChanges is what of env differs from cfg's (nil when nothing does).
func envChanges(cfg *runtimeapi.ContainerConfig, env map[string]string) map[string]string {
	have := map[string]string{}
	for _, kv := range cfg.GetEnvs() {
		have[kv.Key] = string(kv.Value)
	}
	var set map[string]string
	for k, v := range env {
		if hv, ok := have[k]; !ok || hv != v {
			if set == nil {
				set = map[string]string{}
			}
			set[k] = v
		}
	}
	return set
}

// pullWithAuths tries each credential in turn, as kubelet does with the
// credentials it finds for an image, then anonymously when there are none.
func (r *run) pullWithAuths(ctx context.Context) (imageRef, userImage string, err error) {
	imageRef, userImage, err = r.pullEach(ctx)
	if err != nil && r.kube.explain != nil {
		err = r.kube.explain(err)
	}
	return imageRef, userImage, err
}

func (r *run) pullEach(ctx context.Context) (imageRef, userImage string, err error) {
	auths := r.kube.auths
	if len(auths) == 0 {
		return r.pull(ctx)
	}
	var errs []error
	for _, a := range auths {
		r.auth = a
		imageRef, userImage, err = r.pull(ctx)
		if err == nil {
			return imageRef, userImage, nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	r.kube.auths = nil // credentials live for the pull only
	return "", "", errors.Join(errs...)
}

// awaitProceed waits for kubelet's StopContainer. The swap ends here
// (nothing touched) when it is cancelled or the daemon stops.
func (r *run) awaitProceed(ctx context.Context) error {
	r.emit(StepPull, "image on the node; waiting for kubelet's StopContainer")
	var err error
	select {
	case t := <-r.kube.prepared.proceed:
		r.kube.stopTimeout = t
		return nil
	case <-ctx.Done():
		err = fmt.Errorf("not carried out: %w; the old container runs on", context.Cause(ctx))
	case <-r.kube.parent.Done():
		err = errors.New("not carried out: inplaced is stopping; the old container runs on")
	}
	return &ended{state: inplacedv1.SwapState_SWAP_STATE_ABORTED, step: err, err: err}
}

// kubeletConfig is the new container's config: kubelet's declared config
// with the new image (and the env kubelet resolves from the pod's current
// metadata), as the next attempt, with kubelet's hash for the new spec.
func (r *run) kubeletConfig(imageRef, userImage string) *runtimeapi.ContainerConfig {
	cfg := applyChange(r.kube.base, r.change, imageRef, userImage)
	ann := make(map[string]string, len(cfg.Annotations))
	for k, v := range cfg.Annotations {
		ann[k] = v
	}
	ann[AnnotationHash] = r.kube.hash
	cfg.Annotations = ann
	return cfg
}

// kubeletCommit drops an override the spec change ended; the spec now
// declares the image, so no new override is needed.
func (r *run) kubeletCommit() error {
	if !r.kube.hadOverride {
		return nil
	}
	return r.e.store.DeleteOverride(r.t.container.PodSandboxId, r.t.name)
}

// kubeletResult fills the Prepared's result from the run's end.
func (r *run) kubeletResult(out fence.Outcome, stopped bool, err error) {
	p := r.kube.prepared
	p.result = KubeletResult{SwapID: r.rec.Id, Stopped: stopped, Err: err}
	if out.Committed {
		p.result.NewID = out.RunningID
		p.result.NewRequest = r.newReq
	}
}

// SetHandoff records what became of kubelet's calls after a kubelet-driven
// swap (package intercept knows). Unless kubelet adopted the new container,
// kubelet's own create replaced it.
func (e *Engine) SetHandoff(swapID, handoff string, adopted bool) error {
	rec, err := e.store.Swap(swapID)
	if err != nil {
		return fmt.Errorf("swap %s: %w", swapID, err)
	}
	rec.Handoff = handoff
	if !adopted {
		rec.RunningContainerId = ""
	}
	return e.store.PutSwap(rec)
}

// RecordEvent writes a record into the swap history (kubelet's stop let
// through, a refused change) that is not a swap run.
func (e *Engine) RecordEvent(rec *inplacedv1.SwapRecord) error {
	if rec.Id == "" {
		rec.Id = newID(e.now()) + "-" + rec.Kind
	}
	return e.store.PutSwap(rec)
}

// Discard stops and removes a container a kubelet-driven swap made, when
// kubelet's own create wins (its config differs from the prepared one).
func (e *Engine) Discard(ctx context.Context, id string) error {
	if _, err := e.rt.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: id, Timeout: 2}); err != nil && !runtimeGone(err) {
		return fmt.Errorf("stop %s: %w", short(id), err)
	}
	if _, err := e.rt.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: id}); err != nil && !runtimeGone(err) {
		return fmt.Errorf("remove %s: %w", short(id), err)
	}
	return e.store.DeleteContainer(id)
}
