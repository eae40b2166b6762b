// Package kube is inplaced's Kubernetes mode: it watches the pods bound to
// this node and turns kubelet's own restart of a container for a changed
// pod spec image into an in-place swap with the pull before the stop.
//
// kubelet, when a pod's spec image changes, kills the old container first
// and pulls the new image only while starting the replacement, so the whole
// pull is downtime and an image that cannot be pulled leaves the pod with no
// container. Here:
//
//  1. The pod watch sees the spec's hash for a container differ from the
//     running container's io.kubernetes.container.hash and starts pulling
//     the new image at once (swap.Engine.Prepare), with the credentials
//     kubelet would use (package credentials: the pod's imagePullSecrets,
//     the node's docker config, kubelet's credential-provider plugins).
//  2. kubelet's StopContainer for that container is held (HoldStop) until
//     the pull is done, bounded by kubelet's own deadline for the call.
//  3. Then the swap runs in place: the new container (spec image, kubelet's
//     hash for the new spec, next attempt) is created while the old one
//     still runs, the old one stopped, the new one started; the held
//     StopContainer returns, and kubelet's CreateContainer/StartContainer
//     for the name are answered with the new container (package intercept).
//
// Nothing here is on the path of a CRI call but HoldStop, which reads only
// local state: the API server being slow or gone never delays kubelet.
package kube

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/types"
	listersv1 "k8s.io/client-go/listers/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/pkg/credentials"
	"github.com/inplaced/inplaced/pkg/errkind"
	"github.com/inplaced/inplaced/pkg/intercept"
	"github.com/inplaced/inplaced/pkg/kubeclient"
	"github.com/inplaced/inplaced/pkg/store"
	"github.com/inplaced/inplaced/pkg/swap"
	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

// Pull failure policies (--on-pull-failure).
const (
	// KeepRunning: kubelet's StopContainer fails with the reason and the old
	// container keeps running until the image can be pulled.
	KeepRunning = "keep-running"
	// PassThrough: kubelet's stop goes ahead, as without inplaced.
	PassThrough = "pass-through"
)

// Engine is what Kubernetes mode needs of the swap engine.
type Engine interface {
	Prepare(ctx context.Context, c swap.KubeletChange) (*swap.Prepared, error)
	SetHandoff(swapID, handoff string, adopted bool) error
	RecordEvent(rec *inplacedv1.SwapRecord) error
	Discard(ctx context.Context, containerID string) error
	Start(ctx context.Context, req *inplacedv1.SwapRequest, caller swap.Caller, h swap.Hooks) (*swap.Subscription, error)
	SpecWritten(ctx context.Context, rec *inplacedv1.SwapRecord, specHash string, imageOnly bool) error
}

// Kubelet is what Kubernetes mode reads of kubelet's own view of the node
// (package kubeletview): the hash it is shown for a container, and when it
// inspected that container or relisted.
type Kubelet interface {
	PresentedHash(containerID string) (string, bool)
	WhenInspected(containerID string) <-chan struct{}
	NextRelist() <-chan struct{}
	FirstRelistAfter(t time.Time) (time.Time, bool)
}

// Options configures a Controller.
type Options struct {
	// Client is the API server (kubeclient.Client).
	Client   kubeclient.Interface
	NodeName string
	Engine   Engine
	Kubelet  Kubelet
	// Runtime is the backend (not the proxy): what runs on the node.
	Runtime runtimeapi.RuntimeServiceClient
	Store   *store.Store
	Logger  *zap.Logger
	// OnPullFailure is KeepRunning (default) or PassThrough.
	OnPullFailure string
	// Resync is the informer's resync period (default 5 minutes).
	Resync time.Duration
	// AffinityDrift is DriftWarn (default) or DriftRefuse.
	AffinityDrift string
	// Credentials finds the credentials kubelet would pull with (default:
	// the node's docker config only).
	Credentials *credentials.Resolver
}

// Controller watches this node's pods and holds kubelet's stops for image
// changes.
type Controller struct {
	client        kubeclient.Interface
	node          string
	engine        Engine
	kubelet       Kubelet
	rt            runtimeapi.RuntimeServiceClient
	store         *store.Store
	log           *zap.Logger
	onPullFailure string
	creds         *credentials.Resolver
	resync        time.Duration
	now           func() time.Time

	mu      sync.Mutex
	changes map[containerKey]*change
	ctx     context.Context // the daemon's, once Run started
	lister  listersv1.PodLister
	nodes   listersv1.NodeLister
	// affinityDrift: what a swap of a pod that no longer fits gets.
	affinityDrift string

	// Annotation-driven swaps: the request digest last acted on per pod,
	// the requests running, and what the identity was refused (said once).
	seen     map[types.UID]string
	requests map[types.UID]string
	told     map[string]bool
	// envSwaps: env-from-metadata swaps by the container they replace;
	// envRetry: the back-off of those that did not commit, by pod container.
	envSwaps map[string]*envSwap
	envRetry map[containerKey]*envBackoff
	// requeue syncs a pod (by its watch key) again after a delay; set by Run.
	requeue func(podKey string, after time.Duration)
	// waiters: stops waiting for the watch to deliver a newer pod (watchLag).
	waiters  map[types.UID][]chan struct{}
	recorder *eventRecorder
	// nodeEvents: NodeEvent's before Run (type, reason, message).
	nodeEvents [][3]string
}

type containerKey struct {
	uid  types.UID
	name string
}

// change is a pod spec image change for one container, from detection
// until kubelet's stop was carried out (or the change went away).
type change struct {
	key        containerKey
	namespace  string
	pod        string
	image      string
	hash       string
	oldID      string
	detectedAt time.Time
	// pullSecrets are the pod's imagePullSecrets, read again for each pull.
	pullSecrets []string
	// metadataEnv is the container's env from the pod's labels and
	// annotations, as kubelet's create of the new container resolves it.
	metadataEnv map[string]string
	// creds: what the last credentials lookup covered (set by prepare
	// before ready closes).
	creds lookup

	ready chan struct{} // closed when prep is set or prepErr
	prep  *swap.Prepared
	// prepErr: the swap could not even be prepared (container gone, ...).
	prepErr error

	gone     chan struct{} // closed by cancel
	goneWhy  error
	proceed  bool // kubelet's stop is carrying it out: the watch leaves it alone
	doneOnce sync.Once
}

// Reasons a change goes away.
var (
	errReverted = errors.New("the pod spec went back to the running image")
	errDeleted  = errors.New("the pod is being deleted")
)

// New returns a controller; Run starts it.
func New(o Options) (*Controller, error) {
	if o.Client == nil || o.Engine == nil || o.Kubelet == nil || o.Runtime == nil || o.Store == nil || o.NodeName == "" {
		return nil, errors.New("kube.New: client, engine, kubelet view, runtime, store and node name are required")
	}
	for _, w := range []struct {
		flag  string
		value *string
		words [2]string // the default first
	}{
		{"on-pull-failure", &o.OnPullFailure, [2]string{KeepRunning, PassThrough}},
		{"affinity-drift", &o.AffinityDrift, [2]string{DriftWarn, DriftRefuse}},
	} {
		switch *w.value {
		case "":
			*w.value = w.words[0]
		case w.words[0], w.words[1]:
		default:
			return nil, fmt.Errorf("--%s %q: want %s or %s", w.flag, *w.value, w.words[0], w.words[1])
		}
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	if o.Resync <= 0 {
		o.Resync = 5 * time.Minute
	}
	if o.Credentials == nil {
		o.Credentials = newCredentials()
	}
	return &Controller{client: o.Client, node: o.NodeName, engine: o.Engine, kubelet: o.Kubelet, rt: o.Runtime, store: o.Store,
		log: o.Logger, onPullFailure: o.OnPullFailure, creds: o.Credentials, resync: o.Resync, now: time.Now,
		changes: map[containerKey]*change{}, ctx: context.Background(),
		seen: map[types.UID]string{}, requests: map[types.UID]string{}, told: map[string]bool{}, envSwaps: map[string]*envSwap{}, envRetry: map[containerKey]*envBackoff{}, waiters: map[types.UID][]chan struct{}{}, affinityDrift: o.AffinityDrift}, nil
}

func (c *change) cancel(why error) {
	c.doneOnce.Do(func() {
		c.goneWhy = why
		close(c.gone)
		if c.prep != nil {
			c.prep.Cancel(why)
		}
	})
}

// holdMargin is what a held stop keeps of kubelet's deadline for the swap
// itself (create, start) and the answer, beyond the stop's own timeout.
const holdMargin = 15 * time.Second

// defaultHold bounds a hold when kubelet's call carries no deadline:
// kubelet's runtime request timeout.
const defaultHold = 2 * time.Minute

// retryPullAfter spaces new pull attempts of an image that failed: each of
// kubelet's retried stops after that tries again.
const retryPullAfter = 5 * time.Second

// HoldStop implements intercept.StopHolder.
func (c *Controller) HoldStop(ctx context.Context, req *runtimeapi.StopContainerRequest) (intercept.StopDecision, error) {
	if s := c.envSwapFor(ctx, req.ContainerId); s != nil {
		return c.holdForEnvSwap(ctx, req.ContainerId, s)
	}
	ch := c.changeFor(ctx, req.ContainerId)
	if ch == nil {
		// detect may have waited for the watch: it can have delivered
		// OpenKruise's env-from-metadata update meanwhile.
		if s := c.envSwapFor(ctx, req.ContainerId); s != nil {
			return c.holdForEnvSwap(ctx, req.ContainerId, s)
		}
		return intercept.StopDecision{}, nil // every other stop goes through at once
	}
	log := c.log.With(zap.String("container_id", req.ContainerId), zap.String("pod", ch.namespace+"/"+ch.pod),
		zap.String("container", ch.key.name), zap.String("image", ch.image))
	holdUntil := c.now().Add(defaultHold)
	if dl, ok := ctx.Deadline(); ok {
		holdUntil = dl.Add(-time.Duration(req.Timeout)*time.Second - holdMargin)
	}
	timer := time.NewTimer(time.Until(holdUntil))
	defer timer.Stop()
	log.Info("holding kubelet's StopContainer until the new image is on the node", zap.Time("at_most_until", holdUntil))

	prep, err := c.await(ctx, ch, timer.C, func(ch *change) <-chan struct{} { return ch.ready })
	if err != nil || prep == nil {
		return c.release(ch, log, err)
	}
	if _, err := c.await(ctx, ch, timer.C, func(*change) <-chan struct{} { return prep.Pulled() }); err != nil {
		return c.release(ch, log, err)
	}
	if perr := prep.PullErr(); perr != nil {
		return c.pullFailed(ch, prep, log, perr)
	}
	c.mu.Lock()
	ch.proceed = true
	c.mu.Unlock()
	res, err := prep.Proceed(ctx, req.Timeout)
	c.forget(ch)
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
	swapID := res.SwapID
	return intercept.StopDecision{Answered: true, Adopt: &intercept.Adoption{
		SwapID: swapID, ContainerID: res.NewID, Request: res.NewRequest,
		Discard: func(ctx context.Context) error { return c.engine.Discard(ctx, res.NewID) },
		Handoff: func(text string, adopted bool) {
			if err := c.engine.SetHandoff(swapID, text, adopted); err != nil {
				c.log.Error("record handoff", zap.String("swap_id", swapID), zap.Error(err))
			}
		},
	}}, nil
}

// errHoldExpired: kubelet's deadline for the stop is near.
var errHoldExpired = errors.New("kubelet's deadline for the stop is near")

// await waits for one of a change's channels, the change going away, the
// hold's end or kubelet giving up.
func (c *Controller) await(ctx context.Context, ch *change, expire <-chan time.Time, which func(*change) <-chan struct{}) (*swap.Prepared, error) {
	select {
	case <-which(ch):
		c.mu.Lock()
		defer c.mu.Unlock()
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
func (c *Controller) release(ch *change, log *zap.Logger, why error) (intercept.StopDecision, error) {
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
		c.recordLetThrough(ch, fmt.Sprintf("pull of %s not finished before kubelet's deadline for StopContainer: the stop went through, kubelet restarts the container the usual way", ch.image))
		c.cancelChange(ch, why)
	default:
		log.Info("kubelet's stop goes through", zap.NamedError("why", why))
	}
	return intercept.StopDecision{}, nil
}

// pullFailed answers a held stop whose pull failed (decidePullFailure).
func (c *Controller) pullFailed(ch *change, prep *swap.Prepared, log *zap.Logger, perr error) (intercept.StopDecision, error) {
	c.mu.Lock()
	l := ch.creds
	c.mu.Unlock()
	v := decidePullFailure(c.onPullFailure, pullFailureKind(perr), l)
	log = log.With(zap.String("swap_id", prep.ID()), zap.String("pull_failure", v.kind), zap.String("why", v.why))
	if v.pass {
		log.Warn("pull failed: kubelet's stop goes ahead", zap.Error(perr))
		c.cancelChange(ch, perr)
		return intercept.StopDecision{}, nil
	}
	log.Warn("pull failed: kubelet's stop refused, the old container keeps running", zap.Error(perr))
	c.retryLater(ch)
	return intercept.StopDecision{Answered: true}, errkind.Errorf(errkind.Refused,
		"inplaced: image %s for container %q of pod %s/%s cannot be pulled (%v); the old container keeps running. To do: %s (swap %s)",
		ch.image, ch.key.name, ch.namespace, ch.pod, perr, v.todo, prep.ID())
}

// retryLater makes the next held stop of a failed change pull again.
func (c *Controller) retryLater(ch *change) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.changes[ch.key] == ch {
		ch.detectedAt = c.now()
		ch.prepErr = nil
	}
}

func (c *Controller) recordLetThrough(ch *change, why string) {
	now := c.now().UnixNano()
	if err := c.engine.RecordEvent(&inplacedv1.SwapRecord{
		Kind: "stop-let-through", Namespace: ch.namespace, Pod: ch.pod, Container: ch.key.name, PodUid: string(ch.key.uid),
		OldContainerId: ch.oldID, State: inplacedv1.SwapState_SWAP_STATE_ABORTED, StartedUnixNano: now, FinishedUnixNano: now,
		Caller: &inplacedv1.Caller{Description: swap.CallerKubelet}, To: &inplacedv1.ConfigSummary{Image: ch.image}, Error: why,
	}); err != nil {
		c.log.Error("record let-through stop", zap.Error(err))
	}
}

// changeFor returns the pending change for the container kubelet stops, if
// any; a change whose pull failed a while ago is prepared again, so that
// kubelet's retry pulls again.
func (c *Controller) changeFor(ctx context.Context, containerID string) *change {
	c.mu.Lock()
	var found *change
	for _, ch := range c.changes {
		if ch.oldID == containerID && !ch.proceed {
			found = ch
			break
		}
	}
	c.mu.Unlock()
	if found == nil {
		return c.detect(ctx, containerID)
	}
	select {
	case <-found.ready:
		if p := found.prep; p != nil {
			select {
			case <-p.Pulled():
				if p.PullErr() != nil && c.now().Sub(found.detectedAt) >= retryPullAfter {
					return c.reprepare(found)
				}
			default:
			}
		}
	default:
	}
	return found
}

// reprepare replaces a failed change by a new attempt with the same
// credentials lookup.
func (c *Controller) reprepare(old *change) *change {
	ch := &change{key: old.key, namespace: old.namespace, pod: old.pod, image: old.image, hash: old.hash,
		oldID: old.oldID, pullSecrets: old.pullSecrets, metadataEnv: old.metadataEnv, detectedAt: c.now(), ready: make(chan struct{}), gone: make(chan struct{})}
	c.mu.Lock()
	if c.changes[old.key] != old {
		c.mu.Unlock()
		return nil
	}
	c.changes[old.key] = ch
	c.mu.Unlock()
	old.cancel(errors.New("superseded by a new pull attempt"))
	go c.prepare(ch)
	return ch
}

func (c *Controller) forget(ch *change) {
	c.mu.Lock()
	if c.changes[ch.key] == ch {
		delete(c.changes, ch.key)
	}
	c.mu.Unlock()
}

func (c *Controller) cancelChange(ch *change, why error) {
	c.forget(ch)
	ch.cancel(why)
}

// prepare pulls for a change: the credentials kubelet would use (the pod's
// pull secrets, the node's docker config, credential-provider plugins:
// pullAuths), then the engine's Prepare, which pulls in the background.
func (c *Controller) prepare(ch *change) {
	auths, l := c.pullAuths(ch)
	prep, err := c.engine.Prepare(c.ctx, swap.KubeletChange{ContainerID: ch.oldID, Image: ch.image, Hash: ch.hash,
		MetadataEnv: ch.metadataEnv, Auths: auths, ExplainPull: c.explainPull(l)})
	c.mu.Lock()
	ch.prep, ch.prepErr, ch.creds = prep, err, l
	c.mu.Unlock()
	close(ch.ready)
	if err != nil {
		c.log.Warn("cannot prepare the in-place swap; kubelet's restart goes the usual way",
			zap.String("pod", ch.namespace+"/"+ch.pod), zap.String("container", ch.key.name), zap.Error(err))
		c.forget(ch)
		return
	}
	select {
	case <-ch.gone: // cancelled while preparing
		prep.Cancel(ch.goneWhy)
	default:
	}
	c.log.Info("pod spec image changed: pulling ahead of kubelet's stop",
		zap.String("pod", ch.namespace+"/"+ch.pod), zap.String("container", ch.key.name),
		zap.String("container_id", ch.oldID), zap.String("image", ch.image), zap.String("swap_id", prep.ID()))
}
