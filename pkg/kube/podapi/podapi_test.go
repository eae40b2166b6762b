package podapi

import (
	"encoding/json"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestNamesAreTheContract: tooling outside this repository writes and
// reads these strings; a rename here breaks it.
func TestNamesAreTheContract(t *testing.T) {
	for got, want := range map[string]string{
		AnnotationSwap:            "inplaced.io/swap",
		AnnotationSwapStatus:      "inplaced.io/swap-status",
		AnnotationEnvFromMetadata: "inplaced.io/env-from-metadata",
		ConditionInPlaceReady:     "inplaced.io/InPlaceReady",
		ConditionAffinityDrift:    "inplaced.io/AffinityDrift",
		EventSwapStarted:          "InPlaceSwapStarted",
		EventSwapCommitted:        "InPlaceSwapCommitted",
		EventSwapFailed:           "InPlaceSwapFailed",
		EventSwapRolledBack:       "InPlaceSwapRolledBack",
		EventNeverListened:        "InPlaceSwapNeverListened",
		EventAffinityDrift:        "AffinityDrift",
		EventForbidden:            "InPlacedForbidden",
		StateRefused:              "Refused",
		StateRunning:              "Running",
		StateCommitted:            "Committed",
		StateFailed:               "Failed",
		StateRolledBack:           "RolledBack",
		StateRollbackFailed:       "RollbackFailed",
		StateAborted:              "Aborted",
	} {
		if got != want {
			t.Errorf("%q, the contract says %q", got, want)
		}
	}
}

// TestStatusJSON: the status annotation's field names, every field set.
func TestStatusJSON(t *testing.T) {
	st := SwapStatus{RequestDigest: "sha256:0011223344556677", SwapID: "s1", State: StateCommitted, Container: "app",
		From:  &ConfigStatus{Image: "app:1", Env: []string{"A"}, Command: []string{"/app"}, Args: []string{"-v"}},
		To:    &ConfigStatus{Image: "app:2"},
		Steps: []StepStatus{{Name: "stop", DurationMs: 1.5, Error: "e"}}, DowntimeMs: 40, Error: "x", Override: true,
		UpdatedAt: "2025-01-02T03:04:05Z"}
	b, err := json.Marshal(&st)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"requestDigest":"sha256:0011223344556677","swapID":"s1","state":"Committed","container":"app",` +
		`"from":{"image":"app:1","env":["A"],"command":["/app"],"args":["-v"]},"to":{"image":"app:2"},` +
		`"steps":[{"name":"stop","durationMs":1.5,"error":"e"}],"downtimeMs":40,"error":"x","override":true,` +
		`"updatedAt":"2025-01-02T03:04:05Z"}`
	if string(b) != want {
		t.Errorf("status JSON\n got %s\nwant %s", b, want)
	}
}

func TestStatus(t *testing.T) {
	pod := func(raw string) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{}}}
		if raw != "" {
			p.Annotations[AnnotationSwapStatus] = raw
		}
		return p
	}
	if st := Status(pod("")); st != nil {
		t.Errorf("no annotation: %+v, want nil", st)
	}
	if st := Status(pod("{")); st != nil {
		t.Errorf("not JSON: %+v, want nil", st)
	}
	if st := Status(pod(`{"requestDigest":"d","state":"Running"}`)); st == nil || st.State != StateRunning || st.RequestDigest != "d" {
		t.Errorf("status %+v", st)
	}
}

func TestHasReadinessGate(t *testing.T) {
	p := &corev1.Pod{}
	if HasReadinessGate(p) {
		t.Error("a pod without gates has the gate")
	}
	p.Spec.ReadinessGates = []corev1.PodReadinessGate{{ConditionType: "other"}, {ConditionType: ConditionInPlaceReady}}
	if !HasReadinessGate(p) {
		t.Error("the gate is not seen")
	}
}
