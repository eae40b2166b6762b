package kube

import (
	"context"
	"encoding/json"
	"sync"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/inplaced/inplaced/pkg/kube/podapi"
	"github.com/inplaced/inplaced/pkg/kubeclient"
)

// apiTimeout bounds each write to the API server; nothing on the CRI path
// waits for them.
const apiTimeout = 10 * time.Second

// podWriter is what the features write on pods and the node: the status
// annotation and conditions (through pods/status, what a node's
// credentials may write), a swapped image in the spec, events, and — once
// per pod and action — what the identity may not do. Events go through the
// recorder Run starts; node events reported before are kept until then.
type podWriter struct {
	client kubeclient.Interface
	node   string
	log    *zap.Logger
	now    func() time.Time
	ctx    func() context.Context

	mu       sync.Mutex
	recorder *eventRecorder
	// nodeEvents: nodeEvent's before Run (type, reason, message).
	nodeEvents [][3]string
	// told: what the identity was refused, by pod UID and action.
	told map[string]bool
}

func newPodWriter(client kubeclient.Interface, node string, log *zap.Logger, now func() time.Time, ctx func() context.Context) *podWriter {
	return &podWriter{client: client, node: node, log: log, now: now, ctx: ctx, told: map[string]bool{}}
}

// writeStatus sets the status annotation.
func (w *podWriter) writeStatus(pod *corev1.Pod, st *podapi.SwapStatus) {
	st.UpdatedAt = w.now().UTC().Format(time.RFC3339Nano)
	b, _ := json.Marshal(st)
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{podapi.AnnotationSwapStatus: string(b)}}})
	ctx, cancel := context.WithTimeout(w.ctx(), apiTimeout)
	defer cancel()
	if _, err := w.client.Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
		w.log.Warn("cannot write the swap status annotation", zap.String("pod", pod.Namespace+"/"+pod.Name), zap.Error(err))
		w.cannot(pod, "write "+podapi.AnnotationSwapStatus, err)
	}
}

// setCondition writes one pod condition; kubelet keeps conditions it does
// not own.
func (w *podWriter) setCondition(pod *corev1.Pod, typ string, s corev1.ConditionStatus, reason, msg string) {
	cond := map[string]any{"type": typ, "status": string(s), "reason": reason, "message": msg,
		"lastTransitionTime": metav1.NewTime(w.now()).UTC().Format(time.RFC3339)}
	patch, _ := json.Marshal(map[string]any{"status": map[string]any{"conditions": []any{cond}}})
	ctx, cancel := context.WithTimeout(w.ctx(), apiTimeout)
	defer cancel()
	if _, err := w.client.Pods(pod.Namespace).Patch(ctx, pod.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
		w.log.Warn("cannot set pod condition", zap.String("pod", pod.Namespace+"/"+pod.Name), zap.String("condition", typ), zap.Error(err))
		w.cannot(pod, "set condition "+typ, err)
	}
}

// writeImage writes container's image into pod's spec: specPatch, as a
// dry run (authorization and admission only) with dryRun.
func (w *podWriter) writeImage(ctx context.Context, pod *corev1.Pod, container, image string, dryRun bool) error {
	opts := metav1.PatchOptions{}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	_, err := w.client.Pods(pod.Namespace).Patch(ctx, pod.Name, types.StrategicMergePatchType, specPatch(pod, container, image), opts)
	return err
}

// specPatch is the strategic merge patch of one container's image, with
// the pod's UID as a precondition.
func specPatch(pod *corev1.Pod, container, image string) []byte {
	b, _ := json.Marshal(map[string]any{
		"metadata": map[string]any{"uid": pod.UID},
		"spec":     map[string]any{"containers": []any{map[string]any{"name": container, "image": image}}},
	})
	return b
}

// setReady writes the readiness gate's condition True: no swap runs.
func (w *podWriter) setReady(pod *corev1.Pod) {
	w.setCondition(pod, podapi.ConditionInPlaceReady, corev1.ConditionTrue, "NoSwapRunning", "no in-place swap is running")
}

// cannot says once per pod and action what the identity may not do.
func (w *podWriter) cannot(pod *corev1.Pod, what string, err error) {
	key := string(pod.UID) + "/" + what
	w.mu.Lock()
	seen := w.told[key]
	w.told[key] = true
	w.mu.Unlock()
	if !seen {
		w.event(pod, corev1.EventTypeWarning, podapi.EventForbidden, "inplaced could not %s: %v (give inplaced the identity of deploy/kubernetes/rbac.yaml)", what, err)
	}
}

// event queues an event about pod (dropped before Run: no pod is known
// then).
func (w *podWriter) event(pod *corev1.Pod, typ, reason, format string, args ...any) {
	w.mu.Lock()
	rec := w.recorder
	w.mu.Unlock()
	if rec == nil {
		return
	}
	rec.Eventf(pod, typ, reason, format, args...)
}

// nodeEvent queues an event about this node, or keeps it until Run.
func (w *podWriter) nodeEvent(typ, reason, message string) {
	w.mu.Lock()
	rec := w.recorder
	if rec == nil {
		w.nodeEvents = append(w.nodeEvents, [3]string{typ, reason, message})
	}
	w.mu.Unlock()
	if rec != nil {
		rec.NodeEventf(w.node, typ, reason, "%s", message)
	}
}

// setRecorder makes r the events writer and writes the node events
// reported before.
func (w *podWriter) setRecorder(r *eventRecorder) {
	w.mu.Lock()
	w.recorder = r
	early := w.nodeEvents
	w.nodeEvents = nil
	w.mu.Unlock()
	for _, e := range early {
		r.NodeEventf(w.node, e[0], e[1], "%s", e[2])
	}
}

// conditionStatus is the status of pod's condition typ ("" when absent).
func conditionStatus(pod *corev1.Pod, typ string) corev1.ConditionStatus {
	for _, c := range pod.Status.Conditions {
		if string(c.Type) == typ {
			return c.Status
		}
	}
	return ""
}
