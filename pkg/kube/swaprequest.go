package kube

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/inplaced/inplaced/pkg/kube/podapi"
	"github.com/inplaced/inplaced/pkg/swap"
	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

// CallerAnnotation describes who asked for an annotation-driven swap.
const CallerAnnotation = "pod annotation " + podapi.AnnotationSwap

// swapRequests runs the swaps the inplaced.io/swap annotation asks for —
// once per distinct request, with every guarantee of a node-local swap —
// and writes on the pod how each went (the status annotation, events, the
// readiness gate's condition); after an image swap commits, the image is
// handed over to the spec (specHandover). Swaps asked for otherwise get
// the same status and events (report, status.go).
type swapRequests struct {
	engine   Engine
	cache    *podCache
	writer   *podWriter
	handover *specHandover
	log      *zap.Logger
	now      func() time.Time
	ctx      func() context.Context

	mu sync.Mutex
	// seen: the request digest last acted on, per pod.
	seen map[types.UID]string
	// running: the digest of the request running, per pod.
	running map[types.UID]string
}

// sync starts the swap the pod's annotation asks for, once per distinct
// request, and keeps the readiness gate True while no swap runs.
func (r *swapRequests) sync(pod *corev1.Pod) {
	running := r.isRunning(pod.UID)
	if !running && podapi.HasReadinessGate(pod) && conditionStatus(pod, podapi.ConditionInPlaceReady) != corev1.ConditionTrue {
		r.writer.setReady(pod)
	}
	raw := pod.Annotations[podapi.AnnotationSwap]
	if raw == "" || running {
		return
	}
	digest := podapi.Digest(raw)
	if r.seenBefore(pod, digest) {
		return
	}
	r.start(pod, raw, digest)
}

// seenBefore reports whether the request with digest was acted on already
// (ran, runs, or was refused), and remembers it.
func (r *swapRequests) seenBefore(pod *corev1.Pod, digest string) bool {
	if st := podapi.Status(pod); st != nil && st.RequestDigest == digest {
		return true
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.seen[pod.UID] == digest {
		return true // status write still on its way (or refused by the API)
	}
	r.seen[pod.UID] = digest
	return false
}

// start parses the request and starts its swap, or says why not.
func (r *swapRequests) start(pod *corev1.Pod, raw, digest string) {
	log := r.log.With(zap.String("pod", pod.Namespace+"/"+pod.Name), zap.String("request", digest))
	req, err := podapi.ParseSwapRequest(raw)
	if err != nil {
		log.Warn("swap request refused", zap.Error(err))
		r.refuse(pod, digest, "", err)
		return
	}
	change, opts := changeOf(req)
	specHash := r.specHash(pod, req, log)
	sub, err := r.engine.Start(r.ctx(), &inplacedv1.SwapRequest{
		Target: &inplacedv1.Target{Namespace: pod.Namespace, Pod: pod.Name, Container: req.Container},
		Change: change, Options: opts,
	}, swap.Caller{Description: CallerAnnotation}, swap.Hooks{BeforeStop: r.drain(pod, req), SpecHash: specHash})
	if err != nil {
		log.Warn("swap request refused by the engine", zap.Error(err))
		r.refuse(pod, digest, req.Container, err)
		return
	}
	r.mu.Lock()
	r.running[pod.UID] = digest
	r.mu.Unlock()
	r.writer.event(pod, corev1.EventTypeNormal, podapi.EventSwapStarted, "in-place swap of container %s requested by %s started", req.Container, podapi.AnnotationSwap)
	r.writer.writeStatus(pod, &podapi.SwapStatus{RequestDigest: digest, State: podapi.StateRunning, Container: req.Container})
	go r.follow(pod, digest, req, specHash, sub)
}

// specHash is kubelet's hash for the spec with the requested image, when
// the image goes into the spec after the commit ("" when the request sets
// no image, or the identity may not write the spec: then the image stays
// an override, and the pod says why once).
func (r *swapRequests) specHash(pod *corev1.Pod, req *podapi.SwapRequest, log *zap.Logger) string {
	if req.Image == "" {
		return ""
	}
	if err := r.handover.canPatch(pod, req.Container, req.Image); err != nil {
		log.Info("the swapped image will stay an override: the spec cannot be written", zap.Error(err))
		r.writer.cannot(pod, "patch the pod spec image (the new image stays an override, the spec names the old one)", err)
		return ""
	}
	return ContainerHash(req.Container, req.Image)
}

// drain is the swap's BeforeStop for a pod with the readiness gate (nil
// without): the gate goes False, and the old container stops drainSeconds
// after the pod is out of its Services' endpoints.
func (r *swapRequests) drain(pod *corev1.Pod, req *podapi.SwapRequest) func(context.Context) error {
	if !podapi.HasReadinessGate(pod) {
		return nil
	}
	drain := time.Duration(req.DrainSeconds) * time.Second
	return func(ctx context.Context) error {
		r.writer.setCondition(pod, podapi.ConditionInPlaceReady, corev1.ConditionFalse, "InPlaceSwap",
			fmt.Sprintf("in-place swap of container %s: out of the Service endpoints for %s before the old container stops", req.Container, drain))
		// The endpoints follow the pod's Ready, which kubelet recomputes
		// from the gate some time after the write: the drain counts from
		// when the pod is NotReady, not from the write.
		r.awaitNotReady(ctx, pod, notReadyWait)
		select {
		case <-time.After(drain):
			return nil
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
}

// notReadyWait bounds how long a gated swap waits for kubelet to turn the
// pod NotReady after the gate went False (kubelet's status sync is ~1 s).
const notReadyWait = 10 * time.Second

// awaitNotReady waits up to d until the watch shows pod's Ready condition
// other than True. It reads the watch's cache only: a slow API server makes
// the wait end at d, it never adds API calls.
func (r *swapRequests) awaitNotReady(ctx context.Context, pod *corev1.Pod, d time.Duration) {
	lister := r.cache.podLister()
	if lister == nil {
		return
	}
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		now, err := lister.Pods(pod.Namespace).Get(pod.Name)
		if err != nil || now.UID != pod.UID || conditionStatus(now, string(corev1.PodReady)) != corev1.ConditionTrue {
			return
		}
		select {
		case <-tick.C:
		case <-deadline.C:
			r.log.Info("pod still Ready after the readiness gate went False; draining anyway",
				zap.String("pod", pod.Namespace+"/"+pod.Name), zap.Duration("waited", d))
			return
		case <-ctx.Done():
			return
		}
	}
}

// follow writes the swap's progress and end to the pod, and after a
// commit hands the image over to the spec (specHash set).
func (r *swapRequests) follow(pod *corev1.Pod, digest string, req *podapi.SwapRequest, specHash string, sub *swap.Subscription) {
	container := req.Container
	readied := false
	ready := func() {
		if podapi.HasReadinessGate(pod) && !readied {
			r.writer.setReady(pod)
		}
		readied = true
	}
	defer func() {
		r.mu.Lock()
		delete(r.running, pod.UID)
		r.mu.Unlock()
		ready()
	}()
	var last *inplacedv1.SwapEvent
	for ev := range sub.C {
		last = ev
		if ev.Record == nil && strings.HasPrefix(ev.Message, "done") {
			r.writer.writeStatus(pod, &podapi.SwapStatus{RequestDigest: digest, SwapID: ev.SwapId, State: podapi.StateRunning, Container: container,
				Steps: []podapi.StepStatus{{Name: ev.Step}}})
		}
	}
	if last == nil || last.Record == nil {
		r.writer.writeStatus(pod, &podapi.SwapStatus{RequestDigest: digest, State: podapi.StateAborted, Container: container, Error: "the swap ended without a record (inplaced stopping?)"})
		return
	}
	rec := last.Record
	st := statusFromRecord(digest, rec)
	r.writer.writeStatus(pod, st)
	switch st.State {
	case podapi.StateCommitted:
		r.writer.event(pod, corev1.EventTypeNormal, podapi.EventSwapCommitted, "container %s swapped in place (%s → %s), downtime %s",
			container, rec.From.GetImage(), rec.To.GetImage(), time.Duration(rec.DowntimeNs).Round(time.Millisecond))
		if specHash != "" {
			// The new container passed its health gate: back in the endpoints
			// now, not after the spec handover (a second or two).
			ready()
			step := r.handover.handOver(pod, rec, req.Image, specHash, req.ImageOnly())
			st.Steps = append(st.Steps, step)
			st.Override = step.Error != "" || !req.ImageOnly()
			r.writer.writeStatus(pod, st)
		}
	case podapi.StateRolledBack:
		r.writer.event(pod, corev1.EventTypeWarning, podapi.EventSwapFailed, "in-place swap of container %s failed: %s", container, rec.Error)
		r.writer.event(pod, corev1.EventTypeWarning, podapi.EventSwapRolledBack, "container %s rolled back: the old configuration runs again", container)
	default:
		r.writer.event(pod, corev1.EventTypeWarning, podapi.EventSwapFailed, "in-place swap of container %s ended %s: %s", container, st.State, rec.Error)
	}
}

func (r *swapRequests) isRunning(uid types.UID) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.running[uid]
	return ok
}

func (r *swapRequests) refuse(pod *corev1.Pod, digest, container string, err error) {
	msg := err.Error()
	if s, ok := status.FromError(err); ok {
		msg = s.Message()
	}
	r.writer.writeStatus(pod, &podapi.SwapStatus{RequestDigest: digest, State: podapi.StateRefused, Container: container, Error: msg})
	r.writer.event(pod, corev1.EventTypeWarning, podapi.EventSwapFailed, "%s refused, nothing changed: %s", podapi.AnnotationSwap, msg)
}

// changeOf is the request as the swap engine's change and options.
func changeOf(req *podapi.SwapRequest) (*inplacedv1.Change, *inplacedv1.SwapOptions) {
	c := &inplacedv1.Change{SetEnv: req.Env, UnsetEnv: req.UnsetEnv}
	if req.Image != "" {
		img := req.Image
		c.Image = &img
	}
	if req.SetsCommand() {
		c.Command, c.SetCommand = req.Command, true
	}
	if req.SetsArgs() {
		c.Args, c.SetArgs = req.Args, true
	}
	o := &inplacedv1.SwapOptions{Strategy: req.Strategy}
	if req.MinRuntime != "" {
		d, _ := time.ParseDuration(req.MinRuntime)
		o.MinRuntimeMs = d.Milliseconds()
	}
	switch {
	case req.HealthHTTP != "":
		port, path := req.HealthHTTPGet()
		o.HealthCheck = &inplacedv1.Handler{HttpGet: &inplacedv1.HTTPGet{Port: port, Path: path}}
	case req.HealthTCP != 0:
		o.HealthCheck = &inplacedv1.Handler{TcpPort: int64(req.HealthTCP)}
	case len(req.HealthExec) > 0:
		o.HealthCheck = &inplacedv1.Handler{Exec: req.HealthExec}
	}
	return c, o
}
