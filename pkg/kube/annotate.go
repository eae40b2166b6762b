package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/inplaced/inplaced/pkg/kube/podapi"
	"github.com/inplaced/inplaced/pkg/swap"
	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

func configStatus(s *inplacedv1.ConfigSummary) *podapi.ConfigStatus {
	if s == nil {
		return nil
	}
	return &podapi.ConfigStatus{Image: s.Image, Env: s.Env, Command: s.Command, Args: s.Args}
}

// statusFromRecord turns a swap record into the status annotation.
func statusFromRecord(digest string, rec *inplacedv1.SwapRecord) *podapi.SwapStatus {
	st := &podapi.SwapStatus{RequestDigest: digest, SwapID: rec.Id, Container: rec.Container,
		From: configStatus(rec.From), To: configStatus(rec.To), Error: rec.Error,
		DowntimeMs: float64(rec.DowntimeNs) / 1e6}
	for _, s := range rec.Steps {
		st.Steps = append(st.Steps, podapi.StepStatus{Name: s.Name, DurationMs: float64(s.DurationNs) / 1e6, Error: s.Error})
	}
	switch rec.State {
	case inplacedv1.SwapState_SWAP_STATE_RUNNING:
		st.State = podapi.StateRunning
	case inplacedv1.SwapState_SWAP_STATE_COMMITTED:
		st.State, st.Override = podapi.StateCommitted, true
	case inplacedv1.SwapState_SWAP_STATE_FAILED:
		st.State = podapi.StateFailed
		if rolledBack(rec) {
			st.State = podapi.StateRolledBack
		}
	case inplacedv1.SwapState_SWAP_STATE_ROLLBACK_FAILED:
		st.State = podapi.StateRollbackFailed
	default:
		st.State = podapi.StateAborted
	}
	return st
}

func rolledBack(rec *inplacedv1.SwapRecord) bool {
	for _, s := range rec.Steps {
		if s.Name == swap.StepRollback && s.Error == "" {
			return true
		}
	}
	return false
}

func conditionStatus(pod *corev1.Pod, typ string) corev1.ConditionStatus {
	for _, c := range pod.Status.Conditions {
		if string(c.Type) == typ {
			return c.Status
		}
	}
	return ""
}

// syncRequest starts the swap an inplaced.io/swap annotation asks for,
// once per distinct request, and keeps the readiness gate True while no
// swap runs.
func (c *Controller) syncRequest(pod *corev1.Pod) {
	raw := pod.Annotations[podapi.AnnotationSwap]
	running := c.requestRunning(pod.UID)
	if podapi.HasReadinessGate(pod) && !running && conditionStatus(pod, podapi.ConditionInPlaceReady) != corev1.ConditionTrue {
		c.setCondition(pod, podapi.ConditionInPlaceReady, corev1.ConditionTrue, "NoSwapRunning", "no in-place swap is running")
	}
	if raw == "" || running {
		return
	}
	digest := podapi.Digest(raw)
	if st := podapi.Status(pod); st != nil && st.RequestDigest == digest {
		return // seen: ran, runs, or was refused
	}
	c.mu.Lock()
	if c.seen[pod.UID] == digest {
		c.mu.Unlock()
		return // status write still on its way (or refused by the API)
	}
	c.seen[pod.UID] = digest
	c.mu.Unlock()
	log := c.log.With(zap.String("pod", pod.Namespace+"/"+pod.Name), zap.String("request", digest))
	req, err := podapi.ParseSwapRequest(raw)
	if err != nil {
		log.Warn("swap request refused", zap.Error(err))
		c.refuse(pod, digest, "", err)
		return
	}
	change, opts := changeOf(req)
	hooks := swap.Hooks{}
	if podapi.HasReadinessGate(pod) {
		drain := time.Duration(req.DrainSeconds) * time.Second
		hooks.BeforeStop = func(ctx context.Context) error {
			c.setCondition(pod, podapi.ConditionInPlaceReady, corev1.ConditionFalse, "InPlaceSwap",
				fmt.Sprintf("in-place swap of container %s: out of the Service endpoints for %s before the old container stops", req.Container, drain))
			// The endpoints follow the pod's Ready, which kubelet recomputes
			// from the gate some time after the write: the drain counts from
			// when the pod is NotReady, not from the write.
			c.awaitNotReady(ctx, pod, notReadyWait)
			select {
			case <-time.After(drain):
				return nil
			case <-ctx.Done():
				return context.Cause(ctx)
			}
		}
	}
	// The image goes into the spec after the commit when the identity may
	// write it; else it stays an override (and the pod says why once).
	var specHash string
	if req.Image != "" {
		if err := c.canPatchSpec(pod, req.Container, req.Image); err != nil {
			log.Info("the swapped image will stay an override: the spec cannot be written", zap.Error(err))
			c.cannot(pod, "patch the pod spec image (the new image stays an override, the spec names the old one)", err)
		} else {
			specHash = ContainerHash(req.Container, req.Image)
			hooks.SpecHash = specHash
		}
	}
	sub, err := c.engine.Start(c.ctx, &inplacedv1.SwapRequest{
		Target: &inplacedv1.Target{Namespace: pod.Namespace, Pod: pod.Name, Container: req.Container},
		Change: change, Options: opts,
	}, swap.Caller{Description: CallerAnnotation}, hooks)
	if err != nil {
		log.Warn("swap request refused by the engine", zap.Error(err))
		c.refuse(pod, digest, req.Container, err)
		return
	}
	c.mu.Lock()
	c.requests[pod.UID] = digest
	c.mu.Unlock()
	c.event(pod, corev1.EventTypeNormal, podapi.EventSwapStarted, "in-place swap of container %s requested by %s started", req.Container, podapi.AnnotationSwap)
	c.writeStatus(pod, &podapi.SwapStatus{RequestDigest: digest, State: podapi.StateRunning, Container: req.Container})
	go c.follow(pod, digest, req, specHash, sub)
}

// notReadyWait bounds how long a gated swap waits for kubelet to turn the
// pod NotReady after the gate went False (kubelet's status sync is ~1 s).
const notReadyWait = 10 * time.Second

// awaitNotReady waits up to d until the watch shows pod's Ready condition
// other than True. It reads the watch's cache only: a slow API server makes
// the wait end at d, it never adds API calls.
func (c *Controller) awaitNotReady(ctx context.Context, pod *corev1.Pod, d time.Duration) {
	c.mu.Lock()
	lister := c.lister
	c.mu.Unlock()
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
			c.log.Info("pod still Ready after the readiness gate went False; draining anyway",
				zap.String("pod", pod.Namespace+"/"+pod.Name), zap.Duration("waited", d))
			return
		case <-ctx.Done():
			return
		}
	}
}

// follow writes the swap's progress and end to the pod, and after a
// commit hands the image over to the spec (specHash set).
func (c *Controller) follow(pod *corev1.Pod, digest string, req *podapi.SwapRequest, specHash string, sub *swap.Subscription) {
	container := req.Container
	readied := false
	ready := func() {
		if podapi.HasReadinessGate(pod) && !readied {
			c.setCondition(pod, podapi.ConditionInPlaceReady, corev1.ConditionTrue, "NoSwapRunning", "no in-place swap is running")
		}
		readied = true
	}
	defer func() {
		c.mu.Lock()
		delete(c.requests, pod.UID)
		c.mu.Unlock()
		ready()
	}()
	var last *inplacedv1.SwapEvent
	for ev := range sub.C {
		last = ev
		if ev.Record == nil && strings.HasPrefix(ev.Message, "done") {
			c.writeStatus(pod, &podapi.SwapStatus{RequestDigest: digest, SwapID: ev.SwapId, State: podapi.StateRunning, Container: container,
				Steps: []podapi.StepStatus{{Name: ev.Step}}})
		}
	}
	if last == nil || last.Record == nil {
		c.writeStatus(pod, &podapi.SwapStatus{RequestDigest: digest, State: podapi.StateAborted, Container: container, Error: "the swap ended without a record (inplaced stopping?)"})
		return
	}
	rec := last.Record
	st := statusFromRecord(digest, rec)
	c.writeStatus(pod, st)
	switch st.State {
	case podapi.StateCommitted:
		c.event(pod, corev1.EventTypeNormal, podapi.EventSwapCommitted, "container %s swapped in place (%s → %s), downtime %s",
			container, rec.From.GetImage(), rec.To.GetImage(), time.Duration(rec.DowntimeNs).Round(time.Millisecond))
		if specHash != "" {
			// The new container passed its health gate: back in the endpoints
			// now, not after the spec handover (a second or two).
			ready()
			step := c.handOverSpec(pod, rec, req.Image, specHash, req.ImageOnly())
			st.Steps = append(st.Steps, step)
			st.Override = step.Error != "" || !req.ImageOnly()
			c.writeStatus(pod, st)
		}
	case podapi.StateRolledBack:
		c.event(pod, corev1.EventTypeWarning, podapi.EventSwapFailed, "in-place swap of container %s failed: %s", container, rec.Error)
		c.event(pod, corev1.EventTypeWarning, podapi.EventSwapRolledBack, "container %s rolled back: the old configuration runs again", container)
	default:
		c.event(pod, corev1.EventTypeWarning, podapi.EventSwapFailed, "in-place swap of container %s ended %s: %s", container, st.State, rec.Error)
	}
}

func (c *Controller) requestRunning(uid types.UID) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.requests[uid]
	return ok
}

func (c *Controller) refuse(pod *corev1.Pod, digest, container string, err error) {
	msg := err.Error()
	if s, ok := status.FromError(err); ok {
		msg = s.Message()
	}
	c.writeStatus(pod, &podapi.SwapStatus{RequestDigest: digest, State: podapi.StateRefused, Container: container, Error: msg})
	c.event(pod, corev1.EventTypeWarning, podapi.EventSwapFailed, "%s refused, nothing changed: %s", podapi.AnnotationSwap, msg)
}

// apiTimeout bounds each write to the API server; nothing on the CRI path
// waits for them.
const apiTimeout = 10 * time.Second

// writeStatus sets the status annotation through pods/status (what a
// node's credentials may write).
func (c *Controller) writeStatus(pod *corev1.Pod, st *podapi.SwapStatus) {
	st.UpdatedAt = c.now().UTC().Format(time.RFC3339Nano)
	b, _ := json.Marshal(st)
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{podapi.AnnotationSwapStatus: string(b)}}})
	ctx, cancel := context.WithTimeout(c.ctx, apiTimeout)
	defer cancel()
	if _, err := c.client.Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
		c.log.Warn("cannot write the swap status annotation", zap.String("pod", pod.Namespace+"/"+pod.Name), zap.Error(err))
		c.cannot(pod, "write "+podapi.AnnotationSwapStatus, err)
	}
}

// setCondition writes one pod condition through pods/status; kubelet keeps
// conditions it does not own.
func (c *Controller) setCondition(pod *corev1.Pod, typ string, s corev1.ConditionStatus, reason, msg string) {
	cond := map[string]any{"type": typ, "status": string(s), "reason": reason, "message": msg,
		"lastTransitionTime": metav1.NewTime(c.now()).UTC().Format(time.RFC3339)}
	patch, _ := json.Marshal(map[string]any{"status": map[string]any{"conditions": []any{cond}}})
	ctx, cancel := context.WithTimeout(c.ctx, apiTimeout)
	defer cancel()
	if _, err := c.client.Pods(pod.Namespace).Patch(ctx, pod.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
		c.log.Warn("cannot set pod condition", zap.String("pod", pod.Namespace+"/"+pod.Name), zap.String("condition", typ), zap.Error(err))
		c.cannot(pod, "set condition "+typ, err)
	}
}

// cannot says once per pod and action what the identity may not do.
func (c *Controller) cannot(pod *corev1.Pod, what string, err error) {
	key := string(pod.UID) + "/" + what
	c.mu.Lock()
	seen := c.told[key]
	c.told[key] = true
	c.mu.Unlock()
	if !seen {
		c.event(pod, corev1.EventTypeWarning, "InPlacedForbidden", "inplaced could not %s: %v (give inplaced the identity of deploy/kubernetes/rbac.yaml)", what, err)
	}
}

// NodeEvent writes an event about this node (inplaced's own health). One
// made before Run has started is written once it has.
func (c *Controller) NodeEvent(typ, reason, message string) {
	c.mu.Lock()
	rec := c.recorder
	if rec == nil {
		c.nodeEvents = append(c.nodeEvents, [3]string{typ, reason, message})
	}
	c.mu.Unlock()
	if rec != nil {
		rec.NodeEventf(c.node, typ, reason, "%s", message)
	}
}

// setRecorder makes r the events writer and writes the Node events
// reported before.
func (c *Controller) setRecorder(r *eventRecorder) {
	c.mu.Lock()
	c.recorder = r
	early := c.nodeEvents
	c.nodeEvents = nil
	c.mu.Unlock()
	for _, e := range early {
		r.NodeEventf(c.node, e[0], e[1], "%s", e[2])
	}
}

func (c *Controller) event(pod *corev1.Pod, typ, reason, format string, args ...any) {
	if c.recorder == nil {
		return
	}
	c.recorder.Eventf(pod, typ, reason, format, args...)
}

// Report is the engine's swap news (swap.Engine.OnSwap): swaps not asked
// for by annotation — node-local (inplacectl), kubelet-driven, env from
// metadata — get the same events and status annotation on their pod.
// Everything is written in the background; nothing here blocks the engine.
func (c *Controller) Report(n swap.SwapNews) {
	rec := n.Record
	if rec.GetCaller().GetDescription() == CallerAnnotation {
		return // follow reports those, with the request's digest
	}
	c.mu.Lock()
	lister := c.lister
	c.mu.Unlock()
	if lister == nil || rec.Pod == "" {
		return
	}
	pod, err := lister.Pods(rec.Namespace).Get(rec.Pod)
	if err != nil || (rec.PodUid != "" && string(pod.UID) != rec.PodUid) {
		return
	}
	go func() {
		if !n.Ended {
			c.event(pod, corev1.EventTypeNormal, podapi.EventSwapStarted, "in-place swap of container %s started (%s)", rec.Container, callerOf(rec))
			return
		}
		st := statusFromRecord("", rec)
		if cur := podapi.Status(pod); cur != nil {
			st.RequestDigest = cur.RequestDigest // a request on the pod must not run again
		}
		c.writeStatus(pod, st)
		switch st.State {
		case podapi.StateCommitted:
			c.event(pod, corev1.EventTypeNormal, podapi.EventSwapCommitted, "container %s swapped in place (%s → %s, %s), downtime %s%s",
				rec.Container, rec.From.GetImage(), rec.To.GetImage(), callerOf(rec), time.Duration(rec.DowntimeNs).Round(time.Millisecond), holdNote(rec))
			if never := rec.GetHold().GetNeverListened(); len(never) > 0 {
				c.event(pod, corev1.EventTypeWarning, podapi.EventNeverListened, "container %s (%s) did not listen on port %v within the connection hold's limit; the old container did",
					rec.Container, rec.To.GetImage(), never)
			}
		case podapi.StateRolledBack:
			c.event(pod, corev1.EventTypeWarning, podapi.EventSwapFailed, "in-place swap of container %s failed (%s): %s", rec.Container, callerOf(rec), rec.Error)
			c.event(pod, corev1.EventTypeWarning, podapi.EventSwapRolledBack, "container %s rolled back: the old configuration runs again%s", rec.Container, holdNote(rec))
		default:
			c.event(pod, corev1.EventTypeWarning, podapi.EventSwapFailed, "in-place swap of container %s ended %s (%s): %s", rec.Container, st.State, callerOf(rec), rec.Error)
		}
	}()
}

// holdNote is the connection hold's part of an event message.
func holdNote(rec *inplacedv1.SwapRecord) string {
	if rec.Hold == nil {
		return ""
	}
	return "; connections: " + rec.Hold.Summary()
}

func callerOf(rec *inplacedv1.SwapRecord) string {
	if d := rec.GetCaller().GetDescription(); d != "" {
		return d
	}
	return fmt.Sprintf("inplacectl, uid %d", rec.GetCaller().GetUid())
}
