package kube

import (
	"context"
	"fmt"
	"strings"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"

	"github.com/inplaced/inplaced/pkg/kube/podapi"
	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

// An image requested on the pod (inplaced.io/swap) ends up in the pod's
// spec, so that `kubectl get pod` tells the truth and kubelet has nothing
// to do. kubelet restarts a container whose hash differs from its spec's,
// and it compares the spec it has with the container status it cached at
// the last relist that saw the pod's containers change — so the order is:
//
//  1. The swap creates the new container with kubelet's hash for the new
//     spec, and kubelet is shown the old hash for it (kubeletview's PresentHash).
//  2. The swap ends; kubelet's next relist sees the new container, caches
//     its status with the old hash and syncs the pod against the old spec:
//     nothing to do. Its status write names the new container: that sync
//     has taken its spec.
//  3. inplaced patches the spec image. A sync that took the old spec may
//     still be queued behind the one whose status was seen, waiting for a
//     relist newer than that one; kubelet's next relist lets it run, still
//     against the old hash. After that relist, inplaced shows the
//     container's own hash again and removes the stopped old container.
//     kubelet's sync for the spec change runs after the queued one, so it
//     waits for the relist after; that relist sees the old container gone
//     and reads the new one's status again, now with the hash of the new
//     spec.
//
// The identity needs `patch` on pods (deploy/kubernetes/rbac.yaml); a node's
// own credentials may not change a pod spec. Without it the image stays a
// sticky override, as for node-local swaps.

// StepSpecPatch names the status entry of writing the spec image.
const StepSpecPatch = "spec-patch"

// relistSettle is how long after a relist's ListContainers its cache
// update and the sync it releases take (milliseconds on a busy node); the
// next relist is most of a second away.
const relistSettle = 200 * time.Millisecond

// kubeletSeesWait bounds step 2: kubelet relists every second.
const kubeletSeesWait = 10 * time.Second

// specHandover writes a committed request's image into the pod spec, in
// the order above (handOver). It keeps no state of its own.
type specHandover struct {
	engine  Engine
	kubelet Kubelet
	cache   *podCache
	writer  *podWriter
	log     *zap.Logger
	now     func() time.Time
	ctx     func() context.Context
}

// canPatch asks the API server, with a dry run that goes through
// authorization and admission (NodeRestriction refuses a node's spec
// writes), whether the image can be written into the spec.
func (h *specHandover) canPatch(pod *corev1.Pod, container, image string) error {
	return h.writer.writeImage(h.ctx(), pod, container, image, true)
}

// handOver is steps 2 and 3 for a committed swap; it returns the
// step's entry for the status annotation.
func (h *specHandover) handOver(pod *corev1.Pod, rec *inplacedv1.SwapRecord, image, specHash string, imageOnly bool) podapi.StepStatus {
	ctx := h.ctx()
	start := h.now()
	log := h.log.With(zap.String("pod", pod.Namespace+"/"+pod.Name), zap.String("swap_id", rec.Id))
	// The relist that first shows kubelet the new container (R0) reads its
	// status: the presented hash.
	r0 := h.now()
	select {
	case <-h.kubelet.WhenInspected(rec.RunningContainerId):
		r0 = h.now()
	case <-time.After(kubeletSeesWait):
		log.Warn("kubelet did not look at the new container in time")
	case <-ctx.Done():
	}
	if err := h.waitKubeletSees(ctx, pod, rec.Container, rec.RunningContainerId); err != nil {
		log.Warn("writing the spec image without having seen kubelet's sync of the new container", zap.Error(err))
	}
	err := h.patchImage(ctx, pod, rec.Container, image)
	if err == nil {
		h.waitRelistAfter(ctx, r0, log)
	}
	st := podapi.StepStatus{Name: StepSpecPatch}
	if err != nil {
		// The container keeps showing kubelet the old spec's hash: the image
		// stays an override until the spec changes.
		log.Error("cannot write the swapped image into the pod spec; it stays an override", zap.Error(err))
		h.writer.cannot(pod, "patch the pod spec image", err)
		st.Error = fmt.Sprintf("the spec still names the old image, the new one runs as an override: %v", err)
	} else if err := h.engine.SpecWritten(ctx, rec, specHash, imageOnly); err != nil {
		st.Error = err.Error()
	} else {
		log.Info("pod spec image written after the swap", zap.String("image", image))
	}
	st.DurationMs = float64(h.now().Sub(start)) / 1e6
	return st
}

// patchImage writes the image into the spec, trying three times a second
// apart.
func (h *specHandover) patchImage(ctx context.Context, pod *corev1.Pod, container, image string) error {
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		err = h.writer.writeImage(ctx, pod, container, image, false)
		if err == nil || ctx.Err() != nil {
			break
		}
		time.Sleep(time.Second)
	}
	return err
}

// waitRelistAfter waits until kubelet's PLEG relist after r0 (R1) has
// released the sync R0 queued with the old spec, plus relistSettle — or
// returns at once when that is already past. PLEG relists once a second;
// other unfiltered lists (housekeeping, garbage collection) come at other
// times, so R1 is the first one from plegEarly after r0; without one, a
// second and a quarter after r0 is taken as past it.
func (h *specHandover) waitRelistAfter(ctx context.Context, r0 time.Time, log *zap.Logger) {
	deadline := r0.Add(plegLate)
	for {
		if r1, ok := h.kubelet.FirstRelistAfter(r0.Add(plegEarly)); ok {
			sleepUntil(ctx, r1.Add(relistSettle))
			return
		}
		now := h.now()
		if now.After(deadline) {
			log.Warn("no kubelet relist seen a second after the one that showed the new container; going on")
			sleepUntil(ctx, r0.Add(plegFallback))
			return
		}
		select {
		case <-h.kubelet.NextRelist():
		case <-time.After(deadline.Sub(now)):
		case <-ctx.Done():
			return
		}
	}
}

// PLEG relist timing (kubelet's relistPeriod is 1 s, counted from the end
// of the previous relist).
const (
	plegEarly    = 900 * time.Millisecond
	plegLate     = 1600 * time.Millisecond
	plegFallback = 1250 * time.Millisecond
)

func sleepUntil(ctx context.Context, t time.Time) {
	if d := time.Until(t); d > 0 {
		select {
		case <-time.After(d):
		case <-ctx.Done():
		}
	}
}

// waitKubeletSees waits until kubelet's pod status names the new
// container: kubelet wrote it from a sync that saw the container, and that
// sync took the pod spec before it looked.
func (h *specHandover) waitKubeletSees(ctx context.Context, pod *corev1.Pod, container, id string) error {
	deadline := h.now().Add(kubeletSeesWait)
	for {
		if h.statusNames(pod, container, id) {
			return nil
		}
		if h.now().After(deadline) {
			return fmt.Errorf("kubelet's pod status did not name container %s within %s", id, kubeletSeesWait)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// statusNames reports whether the cached pod's status names container id
// for container.
func (h *specHandover) statusNames(pod *corev1.Pod, container, id string) bool {
	lister := h.cache.podLister()
	if lister == nil {
		return false
	}
	p, err := lister.Pods(pod.Namespace).Get(pod.Name)
	if err != nil || p.UID != pod.UID {
		return false
	}
	for _, s := range p.Status.ContainerStatuses {
		if s.Name == container && strings.HasSuffix(s.ContainerID, "://"+id) {
			return true
		}
	}
	return false
}
