package kube

import (
	"context"
	"encoding/json"

	corev1 "k8s.io/api/core/v1"
)

// OpenKruise's in-place update contract (its apis/apps/pub/inplace_update.go).
const (
	// KruiseInPlaceUpdateReady is the readiness gate condition OpenKruise
	// sets False before an in-place update and True when it is complete.
	KruiseInPlaceUpdateReady corev1.PodConditionType = "InPlaceUpdateReady"
	// KruiseInPlaceUpdateState is the annotation with the update's state
	// (JSON); KruiseInPlaceUpdateStateOld is its older name, still read.
	KruiseInPlaceUpdateState    = "apps.kruise.io/inplace-update-state"
	KruiseInPlaceUpdateStateOld = "inplace-update-state"
)

// kruiseEnvUpdate reports whether OpenKruise is updating the pod in place
// with env from metadata: its InPlaceUpdateReady condition is False and its
// update state asks for env from metadata. Then kruise-daemon restarts the
// containers whose env from metadata differs, by a CRI stop.
func kruiseEnvUpdate(pod *corev1.Pod) bool {
	updating := false
	for _, cond := range pod.Status.Conditions {
		if cond.Type == KruiseInPlaceUpdateReady {
			updating = cond.Status == corev1.ConditionFalse
		}
	}
	if !updating {
		return false
	}
	raw, ok := pod.Annotations[KruiseInPlaceUpdateState]
	if !ok {
		raw = pod.Annotations[KruiseInPlaceUpdateStateOld]
	}
	var state struct {
		UpdateEnvFromMetadata bool `json:"updateEnvFromMetadata"`
	}
	return json.Unmarshal([]byte(raw), &state) == nil && state.UpdateEnvFromMetadata
}

// startForKruiseStop starts the env swap of container id for a stop of it,
// when OpenKruise is updating the cached pod's env from metadata and the
// container lacks that env; nil otherwise. kruise-daemon's stop of the
// container is how OpenKruise restarts it for the new env, and it may come
// before the pod watch delivered kruise's change to inplaced. Only local
// state is read.
func (e *envFromMetadata) startForKruiseStop(ctx context.Context, id string) *envSwap {
	_, _, pod, sc := cachedSpec(ctx, e.cache, e.containers, id)
	if sc == nil || !kruiseEnvUpdate(pod) {
		return nil
	}
	return e.start(pod, sc, id, CallerKruiseEnvFromMetadata)
}
