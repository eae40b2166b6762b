// Package podapi is inplaced's pod API: the annotations, condition types,
// event reasons and status states through which Kubernetes tooling asks
// inplaced for a swap and reads how it went, with the request's parsing
// and checks, its digest and the status written back. These names and JSON
// fields are a contract that other tooling writes and reads: change none
// of them.
//
// pkg/kube, the controller on each node, reads requests and writes status
// through this package; cmd/kubectl-inplace writes requests and reads
// status through it too, without linking the daemon. So it imports the
// Kubernetes API types and the standard library only, no engine
// (cmd/kubectl-inplace's dependency test keeps it so).
package podapi

import (
	"encoding/json"

	corev1 "k8s.io/api/core/v1"
)

// The pod annotations and condition types of Kubernetes-native control.
const (
	// AnnotationSwap holds a swap request (SwapRequest's JSON), written by
	// the user or kubectl-inplace.
	AnnotationSwap = "inplaced.io/swap"
	// AnnotationSwapStatus holds SwapStatus's JSON, written by inplaced
	// through pods/status.
	AnnotationSwapStatus = "inplaced.io/swap-status"
	// AnnotationEnvFromMetadata "true" asks inplaced to swap a container in
	// place when the labels or annotations its env reads (fieldRef) change.
	AnnotationEnvFromMetadata = "inplaced.io/env-from-metadata"
	// ConditionInPlaceReady is the readiness gate inplaced turns False
	// around a requested swap's stop (the drain) and True otherwise.
	ConditionInPlaceReady = "inplaced.io/InPlaceReady"
	// ConditionAffinityDrift is True when the pod no longer fits its
	// node's affinity after a swap.
	ConditionAffinityDrift = "inplaced.io/AffinityDrift"
)

// Event reasons on the pod (a contract: tooling watches them).
const (
	EventSwapStarted    = "InPlaceSwapStarted"
	EventSwapCommitted  = "InPlaceSwapCommitted"
	EventSwapFailed     = "InPlaceSwapFailed"
	EventSwapRolledBack = "InPlaceSwapRolledBack"
	// EventNeverListened: the new container of a committed swap had not
	// listened by the hold's limit on a port the old one listened on (a
	// kubelet-driven swap, or a pod that opted out of the rollback).
	EventNeverListened = "InPlaceSwapNeverListened"
	// EventAffinityDrift: before a swap, the pod no longer fitted its
	// node's labels or taints (the condition ConditionAffinityDrift says
	// the same).
	EventAffinityDrift = "AffinityDrift"
	// EventForbidden: inplaced's identity may not write something on the
	// pod (its status, a condition, the spec image); said once per pod and
	// action.
	EventForbidden = "InPlacedForbidden"
)

// Status states written to inplaced.io/swap-status.
const (
	StateRefused        = "Refused"
	StateRunning        = "Running"
	StateCommitted      = "Committed"
	StateFailed         = "Failed"
	StateRolledBack     = "RolledBack"
	StateRollbackFailed = "RollbackFailed"
	StateAborted        = "Aborted"
)

// SwapStatus is the JSON of the inplaced.io/swap-status annotation.
type SwapStatus struct {
	RequestDigest string        `json:"requestDigest"`
	SwapID        string        `json:"swapID,omitempty"`
	State         string        `json:"state"`
	Container     string        `json:"container,omitempty"`
	From          *ConfigStatus `json:"from,omitempty"`
	To            *ConfigStatus `json:"to,omitempty"`
	Steps         []StepStatus  `json:"steps,omitempty"`
	DowntimeMs    float64       `json:"downtimeMs,omitempty"`
	Error         string        `json:"error,omitempty"`
	// Override: the container runs a config the pod spec does not declare
	// (env, command, args) until the spec changes.
	Override  bool   `json:"override,omitempty"`
	UpdatedAt string `json:"updatedAt"`
}

// ConfigStatus is what a swap changes; env values are never shown.
type ConfigStatus struct {
	Image   string   `json:"image,omitempty"`
	Env     []string `json:"env,omitempty"`
	Command []string `json:"command,omitempty"`
	Args    []string `json:"args,omitempty"`
}

// StepStatus is one timed step.
type StepStatus struct {
	Name       string  `json:"name"`
	DurationMs float64 `json:"durationMs"`
	Error      string  `json:"error,omitempty"`
}

// Status is the pod's inplaced.io/swap-status annotation, nil when there is
// none or it is not JSON.
func Status(pod *corev1.Pod) *SwapStatus {
	raw := pod.Annotations[AnnotationSwapStatus]
	if raw == "" {
		return nil
	}
	st := &SwapStatus{}
	if json.Unmarshal([]byte(raw), st) != nil {
		return nil
	}
	return st
}

// HasReadinessGate reports whether the pod declares the
// inplaced.io/InPlaceReady readiness gate.
func HasReadinessGate(pod *corev1.Pod) bool {
	for _, g := range pod.Spec.ReadinessGates {
		if string(g.ConditionType) == ConditionInPlaceReady {
			return true
		}
	}
	return false
}
