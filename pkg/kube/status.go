package kube

import (
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"

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

// report gives swaps not asked for by annotation — node-local
// (inplacectl), kubelet-driven, env from metadata — the same events and
// status annotation on their pod (follow writes those of requests, with the
// request's digest). Everything is written in the background; nothing here
// blocks the engine.
func (r *swapRequests) report(n swap.SwapNews) {
	rec := n.Record
	if rec.GetCaller().GetDescription() == CallerAnnotation {
		return
	}
	lister := r.cache.podLister()
	if lister == nil || rec.Pod == "" {
		return
	}
	pod, err := lister.Pods(rec.Namespace).Get(rec.Pod)
	if err != nil || (rec.PodUid != "" && string(pod.UID) != rec.PodUid) {
		return
	}
	if !n.Ended {
		go r.writer.event(pod, corev1.EventTypeNormal, podapi.EventSwapStarted, "in-place swap of container %s started (%s)", rec.Container, callerOf(rec))
		return
	}
	go r.writeEnd(pod, rec)
}

// writeEnd writes how a swap reported by the engine ended.
func (r *swapRequests) writeEnd(pod *corev1.Pod, rec *inplacedv1.SwapRecord) {
	st := statusFromRecord("", rec)
	if cur := podapi.Status(pod); cur != nil {
		st.RequestDigest = cur.RequestDigest // a request on the pod must not run again
	}
	r.writer.writeStatus(pod, st)
	switch st.State {
	case podapi.StateCommitted:
		r.writer.event(pod, corev1.EventTypeNormal, podapi.EventSwapCommitted, "container %s swapped in place (%s → %s, %s), downtime %s%s",
			rec.Container, rec.From.GetImage(), rec.To.GetImage(), callerOf(rec), time.Duration(rec.DowntimeNs).Round(time.Millisecond), holdNote(rec))
		if never := rec.GetHold().GetNeverListened(); len(never) > 0 {
			r.writer.event(pod, corev1.EventTypeWarning, podapi.EventNeverListened, "container %s (%s) did not listen on port %v within the connection hold's limit; the old container did",
				rec.Container, rec.To.GetImage(), never)
		}
	case podapi.StateRolledBack:
		r.writer.event(pod, corev1.EventTypeWarning, podapi.EventSwapFailed, "in-place swap of container %s failed (%s): %s", rec.Container, callerOf(rec), rec.Error)
		r.writer.event(pod, corev1.EventTypeWarning, podapi.EventSwapRolledBack, "container %s rolled back: the old configuration runs again%s", rec.Container, holdNote(rec))
	default:
		r.writer.event(pod, corev1.EventTypeWarning, podapi.EventSwapFailed, "in-place swap of container %s ended %s (%s): %s", rec.Container, st.State, callerOf(rec), rec.Error)
	}
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
