// Package kube is inplaced's Kubernetes mode: it watches the pods bound to
// this node and the node itself, and carries out on them what Kubernetes
// asks of a container in place.
//
// The Controller owns the informers and the work queue, and composes one
// type per feature, each with its own state and lock:
//
//   - imageChanges (imagechange.go, imagestop.go, pullcreds.go): kubelet's
//     own restart of a container for a changed pod spec image becomes an
//     in-place swap with the pull before the stop.
//   - swapRequests (swaprequest.go, status.go, specpatch.go): the swaps the
//     inplaced.io/swap annotation asks for, the status annotation and
//     events of every swap on a pod, and the hand-over of a requested image
//     to the pod spec (specHandover).
//   - envFromMetadata (envmeta.go, kruise.go): a container whose env reads
//     a label or annotation that changed is swapped to the new values, for
//     pods that opt in and for OpenKruise's in-place updates.
//   - affinityDrift (drift.go): the swap engine's admission check of a pod
//     against its node's current labels and taints.
//
// Two helpers are shared by the features: podCache (podcache.go), the
// informers' caches as the features read them, and podWriter
// (podwrite.go), what is written on pods and the node.
//
// kubelet's image change, in order:
//
//  1. The pod watch sees the spec's hash for a container differ from the
//     running container's io.kubernetes.container.hash and starts pulling
//     the new image at once (swap.Engine.Prepare), with the credentials
//     kubelet would use (package credentials: the pod's imagePullSecrets,
//     the node's docker config, kubelet's credential-provider plugins).
//  2. kubelet's StopContainer for that container asks SwapInsteadOfStop,
//     which holds it until the pull is done, bounded by kubelet's own
//     deadline for the call.
//  3. Then the swap runs in place: the new container (spec image, kubelet's
//     hash for the new spec, next attempt) is created while the old one
//     still runs, the old one stopped, the new one started; the held
//     StopContainer returns, and kubelet's CreateContainer/StartContainer
//     for the name are answered with the new container (package intercept).
//
// Nothing here is on the path of a CRI call but SwapInsteadOfStop, which
// reads only local state: the API server being slow or gone never delays
// kubelet.
package kube

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/pkg/credentials"
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

// Controller watches this node's pods and its node, and hands each pod to
// the features (see the package comment).
type Controller struct {
	client kubeclient.Interface
	node   string
	rt     runtimeapi.RuntimeServiceClient
	log    *zap.Logger
	resync time.Duration

	images   *imageChanges
	requests *swapRequests
	env      *envFromMetadata
	drift    *affinityDrift

	cache  *podCache
	writer *podWriter

	mu sync.Mutex
	// ctx is the daemon's once Run started: the controller's own work
	// (pulls, swaps, API writes) runs under it, never under a CRI call's.
	ctx context.Context
	// queue is Run's work queue of pod keys (nil before Run).
	queue workqueue.TypedRateLimitingInterface[string]
}

// containerKey names a pod's container across its CRI containers.
type containerKey struct {
	uid  types.UID
	name string
}

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
	return compose(o), nil
}

// compose makes the controller and its features from checked options.
func compose(o Options) *Controller {
	c := &Controller{client: o.Client, node: o.NodeName, rt: o.Runtime, log: o.Logger, resync: o.Resync, ctx: context.Background()}
	c.cache = newPodCache(o.NodeName)
	c.writer = newPodWriter(o.Client, o.NodeName, o.Logger, time.Now, c.runContext)
	containers := nodeContainers{store: o.Store, rt: o.Runtime}
	c.images = &imageChanges{client: o.Client, engine: o.Engine, kubelet: o.Kubelet, containers: containers, cache: c.cache,
		creds: o.Credentials, onPullFailure: o.OnPullFailure, log: o.Logger, now: time.Now, ctx: c.runContext,
		changes: map[containerKey]*change{}}
	c.env = &envFromMetadata{engine: o.Engine, containers: containers, cache: c.cache, writer: c.writer, images: c.images,
		requeue: c.requeue, log: o.Logger, now: time.Now, ctx: c.runContext,
		swaps: map[string]*envSwap{}, retry: map[containerKey]*envBackoff{}}
	handover := &specHandover{engine: o.Engine, kubelet: o.Kubelet, cache: c.cache, writer: c.writer,
		log: o.Logger, now: time.Now, ctx: c.runContext}
	c.requests = &swapRequests{engine: o.Engine, cache: c.cache, writer: c.writer, handover: handover,
		log: o.Logger, now: time.Now, ctx: c.runContext, seen: map[types.UID]string{}, running: map[types.UID]string{}}
	c.drift = &affinityDrift{node: o.NodeName, policy: o.AffinityDrift, cache: c.cache, writer: c.writer}
	return c
}

// runContext is the daemon's context once Run started (Background before).
func (c *Controller) runContext() context.Context {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ctx
}

// requeue syncs a pod (by its watch key) again after a delay, once Run
// has started.
func (c *Controller) requeue(podKey string, after time.Duration) {
	c.mu.Lock()
	q := c.queue
	c.mu.Unlock()
	if q != nil {
		q.AddAfter(podKey, after)
	}
}

// SwapInsteadOfStop implements intercept.StopHolder. A StopContainer of a
// container that an in-place swap replaces waits for that swap, or carries
// it out, and is answered with its outcome: an env-from-metadata swap
// (kruise-daemon's stop is how OpenKruise restarts a container for new
// env), or a pod spec image change (kubelet's stop before it pulls). Every
// other stop goes through at once.
func (c *Controller) SwapInsteadOfStop(ctx context.Context, req *runtimeapi.StopContainerRequest) (intercept.StopDecision, error) {
	if s := c.envSwapReplacing(ctx, req.ContainerId); s != nil {
		return c.env.answerStop(ctx, req.ContainerId, s)
	}
	if ch := c.images.forStop(ctx, req.ContainerId); ch != nil {
		return c.images.swapInsteadOfStop(ctx, req, ch)
	}
	// Looking for an image change may have waited for the watch
	// (watchLag): it can have delivered OpenKruise's update meanwhile.
	if s := c.envSwapReplacing(ctx, req.ContainerId); s != nil {
		return c.env.answerStop(ctx, req.ContainerId, s)
	}
	return intercept.StopDecision{}, nil
}

// envSwapReplacing is the env-from-metadata swap that replaces container
// id: one running or done, else one started now for an OpenKruise update
// whose stop came before the pod watch delivered it.
func (c *Controller) envSwapReplacing(ctx context.Context, id string) *envSwap {
	if s := c.env.swapOf(id); s != nil {
		return s
	}
	return c.env.startForKruiseStop(ctx, id)
}

// Admit is the swap engine's admission check (swap.Admission): see
// affinityDrift.admit.
func (c *Controller) Admit(ctx context.Context, namespace, name, uid string) (string, error) {
	return c.drift.admit(ctx, namespace, name, uid)
}

// Misfits lists the pods on the node that no longer fit it (inplacectl check).
func (c *Controller) Misfits() (node string, checked int, misfits []*inplacedv1.PodFit, err error) {
	return c.drift.misfits()
}

// Report is the engine's swap news (swap.Engine.OnSwap): see
// swapRequests.report.
func (c *Controller) Report(n swap.SwapNews) {
	c.requests.report(n)
}

// NodeEvent writes an event about this node (inplaced's own health). One
// made before Run has started is written once it has.
func (c *Controller) NodeEvent(typ, reason, message string) {
	c.writer.nodeEvent(typ, reason, message)
}
