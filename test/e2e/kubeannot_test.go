package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/pkg/kube/podapi"
)

// createGatedPod is createPod with the readiness gate inplaced.io/InPlaceReady.
func (km *kmenv) createGatedPod(t *testing.T, name, image string) *corev1.Pod {
	t.Helper()
	// Ready at all only once inplaced set its condition True.
	return km.createPodWith(t, name, image, func(p *corev1.Pod) {
		p.Spec.ReadinessGates = []corev1.PodReadinessGate{{ConditionType: podapi.ConditionInPlaceReady}}
		p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "GREETING", Value: "hello"}}
	})
}

func (km *kmenv) requestSwap(t *testing.T, pod, request string) {
	t.Helper()
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{podapi.AnnotationSwap: request}}})
	if _, err := km.cp.Admin.CoreV1().Pods(km.ns).Patch(ctx(t), pod, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatalf("annotate %s: %v", pod, err)
	}
}

// waitStatus waits for the status annotation of this request to reach a
// final state (not Running).
func (km *kmenv) waitStatus(t *testing.T, pod, request string, timeout time.Duration) *podapi.SwapStatus {
	t.Helper()
	var st podapi.SwapStatus
	km.cp.WaitPod(t, km.ns, pod, timeout, func(p *corev1.Pod) error {
		if p == nil {
			return fmt.Errorf("pod gone")
		}
		raw := p.Annotations[podapi.AnnotationSwapStatus]
		if err := json.Unmarshal([]byte(raw), &st); err != nil {
			return fmt.Errorf("status %q", raw)
		}
		if st.RequestDigest != podapi.Digest(request) || st.State == podapi.StateRunning {
			return fmt.Errorf("status %s", raw)
		}
		return nil
	})
	return &st
}

func (km *kmenv) events(t *testing.T, pod string) map[string]int {
	t.Helper()
	l, err := km.cp.Admin.CoreV1().Events(km.ns).List(ctx(t), metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("involvedObject.name", pod).String()})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, e := range l.Items {
		if e.Source.Component == "inplaced" || e.ReportingController == "inplaced" {
			out[e.Reason] += int(max(e.Count, 1))
		}
	}
	return out
}

func readyStatus(p *corev1.Pod) corev1.ConditionStatus {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status
		}
	}
	return ""
}

// testAnnotationEnv: an env change requested by
// annotation on a gated pod: NotReady before the old container stops, Ready
// after the health gate; the new process has the env; same UID and IP;
// status Committed with downtime; Started/Committed events; a crashing
// command gives Failed/RolledBack.
func (km *kmenv) testAnnotationEnv(t *testing.T) {
	before := km.createGatedPod(t, "gated", km.imgs.App1)
	oldID := criID(appStatus(before))
	// Poll Ready through the swap.
	type sample struct {
		at    time.Time
		ready corev1.ConditionStatus
	}
	var (
		mu      sync.Mutex
		samples []sample
	)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			c, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			p, err := km.cp.Admin.CoreV1().Pods(km.ns).Get(c, "gated", metav1.GetOptions{})
			cancel()
			if err == nil {
				mu.Lock()
				samples = append(samples, sample{time.Now(), readyStatus(p)})
				mu.Unlock()
			}
		}
	}()
	req := `{"container":"app","env":{"GREETING":"bonjour","EXTRA":"1"},"healthHttp":"8080/healthz","minRuntime":"1s","drainSeconds":2}`
	km.requestSwap(t, "gated", req)
	st := km.waitStatus(t, "gated", req, 2*time.Minute)
	after := km.cp.WaitPod(t, km.ns, "gated", time.Minute, func(p *corev1.Pod) error {
		if s := appStatus(p); s == nil || criID(s) == oldID {
			return fmt.Errorf("still the old container")
		}
		return podReady(p)
	})
	close(stop)
	<-done
	// WaitPod may see Ready before the poller's next sample does.
	mu.Lock()
	samples = append(samples, sample{time.Now(), readyStatus(after)})
	mu.Unlock()
	if st.State != podapi.StateCommitted || st.DowntimeMs <= 0 || st.SwapID == "" || !st.Override {
		t.Fatalf("status %+v", st)
	}
	if after.UID != before.UID || after.Status.PodIP != before.Status.PodIP {
		t.Errorf("pod changed: UID %s→%s, IP %s→%s", before.UID, after.UID, before.Status.PodIP, after.Status.PodIP)
	}
	newID := criID(appStatus(after))
	_, in := containerInfo(t, km.direct, newID)
	env, err := os.ReadFile("/proc/" + strconv.Itoa(in.Pid) + "/environ")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(env), "GREETING=bonjour\x00") || !strings.Contains(string(env), "EXTRA=1\x00") {
		t.Errorf("new process env lacks the change: %q", env)
	}
	oldSt, _ := containerInfo(t, km.direct, oldID)
	newSt, _ := containerInfo(t, km.direct, newID)
	mu.Lock()
	var notReadyAt, readyAgainAt time.Time
	for _, s := range samples {
		if s.ready == corev1.ConditionFalse && notReadyAt.IsZero() {
			notReadyAt = s.at
		}
		if !notReadyAt.IsZero() && s.ready == corev1.ConditionTrue && readyAgainAt.IsZero() {
			readyAgainAt = s.at
		}
	}
	mu.Unlock()
	stopped := time.Unix(0, oldSt.FinishedAt)
	switch {
	case notReadyAt.IsZero():
		t.Errorf("the pod never went NotReady during the swap")
	case !notReadyAt.Before(stopped):
		t.Errorf("NotReady at %s, not before the old container stopped at %s", notReadyAt.Format(time.StampMilli), stopped.Format(time.StampMilli))
	case readyAgainAt.IsZero():
		t.Errorf("the pod did not become Ready again")
	case readyAgainAt.Before(time.Unix(0, newSt.StartedAt).Add(time.Second)):
		t.Errorf("Ready again at %s, before the health gate (new container started %s, minRuntime 1s)",
			readyAgainAt.Format(time.StampMilli), time.Unix(0, newSt.StartedAt).Format(time.StampMilli))
	}
	t.Logf("env swap by annotation: %s, downtime %.0f ms; NotReady %s before the old container stopped, Ready again %s after the new one started",
		st.State, st.DowntimeMs, stopped.Sub(notReadyAt).Round(time.Millisecond), readyAgainAt.Sub(time.Unix(0, newSt.StartedAt)).Round(time.Millisecond))

	// The same request seen again (a re-applied manifest) runs once.
	km.requestSwap(t, "gated", req)
	time.Sleep(2 * kubeletSync)
	if p, _ := km.cp.Admin.CoreV1().Pods(km.ns).Get(ctx(t), "gated", metav1.GetOptions{}); criID(appStatus(p)) != newID {
		t.Errorf("the same request ran twice")
	}

	// An image that crashes: Failed and RolledBack, the old config runs again.
	crash := fmt.Sprintf(`{"container":"app","image":%q,"minRuntime":"1s"}`, km.imgs.Crash)
	km.requestSwap(t, "gated", crash)
	st = km.waitStatus(t, "gated", crash, 2*time.Minute)
	if st.State != podapi.StateRolledBack {
		t.Errorf("crashing image: status %+v, want RolledBack", st)
	}
	km.cp.WaitPod(t, km.ns, "gated", time.Minute, podReady)
	eventually(t, 30*time.Second, "the four kinds of events", func() error {
		ev := km.events(t, "gated")
		for _, r := range []string{podapi.EventSwapStarted, podapi.EventSwapCommitted, podapi.EventSwapFailed, podapi.EventSwapRolledBack} {
			if ev[r] == 0 {
				return errorf("no %s event yet: %v", r, ev)
			}
		}
		return nil
	})
}

// testAnnotationRefused, end to end: bad requests
// get a status naming the field and change nothing; inplaced keeps running.
func (km *kmenv) testAnnotationRefused(t *testing.T) {
	p := km.createPod(t, "picky", km.imgs.App1)
	oldID := criID(appStatus(p))
	st0, _ := containerInfo(t, km.direct, oldID)
	for req, field := range map[string]string{
		`{"container":"app","volumeMounts":[{"name":"x","mountPath":"/x"}]}`: "volumeMounts",
		`{"container":"app","env":{"A":1}}`:                                  "env",
		`{"container":"nope","env":{"A":"1"}}`:                               "nope",
		`{not json`:                                                          "JSON",
	} {
		km.requestSwap(t, "picky", req)
		st := km.waitStatus(t, "picky", req, time.Minute)
		if st.State != podapi.StateRefused || !strings.Contains(st.Error, field) {
			t.Errorf("%s: status %+v, want Refused naming %s", req, st, field)
		}
	}
	if st, _ := containerInfo(t, km.direct, oldID); st.State != runtimeapi.ContainerState_CONTAINER_RUNNING || st.StartedAt != st0.StartedAt {
		t.Errorf("a refused request changed the container: %s", st.State)
	}
	if km.px.Exited() != nil {
		select {
		case <-km.px.Exited():
			t.Fatalf("inplaced exited")
		default:
		}
	}
}
