package e2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/inplaced/inplaced/pkg/kube/podapi"
)

func (km *kmenv) labelNode(t *testing.T, key string, value *string) {
	t.Helper()
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]*string{key: value}}})
	if _, err := km.cp.Admin.CoreV1().Nodes().Patch(ctx(t), km.node, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatalf("label node: %v", err)
	}
}

// testAffinityDrift: the node label a pod's
// required affinity needs is removed; the next swap warns (Event +
// condition) and goes on; with --affinity-drift=refuse it is refused with
// nothing changed; inplacectl check lists the pod.
func (km *kmenv) testAffinityDrift(t *testing.T) {
	zone := "a"
	km.labelNode(t, "inplaced-test/zone", &zone)
	km.createPodWith(t, "pinned", km.imgs.App1, func(p *corev1.Pod) {
		p.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
			NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{
				{Key: "inplaced-test/zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"a"}}}}}}}}
	})
	if out, err := km.px.Ctl("check"); err != nil || strings.Contains(out, "pinned") {
		t.Fatalf("inplacectl check before the label went: %s %v", out, err)
	}
	km.labelNode(t, "inplaced-test/zone", nil)
	eventually(t, 30*time.Second, "inplacectl check lists the pod", func() error {
		out, err := km.px.Ctl("check")
		if err != nil || !strings.Contains(out, "default/pinned") || !strings.Contains(out, "affinity") {
			return fmt.Errorf("check: %s %v", out, err)
		}
		return nil
	})
	out, _ := km.px.Ctl("check")
	t.Logf("inplacectl check:\n%s", out)

	warn := `{"container":"app","env":{"DRIFT":"warn"},"minRuntime":"500ms"}`
	km.requestSwap(t, "pinned", warn)
	if st := km.waitStatus(t, "pinned", warn, time.Minute); st.State != podapi.StateCommitted {
		t.Fatalf("warn mode: status %+v, want Committed", st)
	} else {
		found := false
		for _, s := range st.Steps {
			found = found || (s.Name == "affinity-check" && strings.Contains(s.Error, "affinity"))
		}
		if !found {
			t.Errorf("the swap record does not say the pod no longer fits: %+v", st.Steps)
		}
	}
	eventually(t, 30*time.Second, "AffinityDrift event and condition", func() error {
		if km.events(t, "pinned")["AffinityDrift"] == 0 {
			return errorf("no AffinityDrift event")
		}
		q, err := km.cp.Admin.CoreV1().Pods(km.ns).Get(ctx(t), "pinned", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if conditionOf(q, podapi.ConditionAffinityDrift) != corev1.ConditionTrue {
			return errorf("condition %s not True", podapi.ConditionAffinityDrift)
		}
		return nil
	})

	// Refuse mode: the same kind of request is refused, nothing changes.
	if err := km.px.Stop(); err != nil {
		t.Fatal(err)
	}
	km.px.ExtraArgs = append(km.px.ExtraArgs, "--affinity-drift", "refuse")
	if err := km.px.Start(); err != nil {
		t.Fatal(err)
	}
	// The runtime's running container (the pod status lags a swap).
	before, _ := km.processEnv(t, "pinned")
	refuse := `{"container":"app","env":{"DRIFT":"refuse"}}`
	km.requestSwap(t, "pinned", refuse)
	st := km.waitStatus(t, "pinned", refuse, time.Minute)
	if st.State != podapi.StateRefused || !strings.Contains(st.Error, "no longer fits") {
		t.Errorf("refuse mode: status %+v", st)
	}
	if after, _ := km.processEnv(t, "pinned"); after != before {
		t.Errorf("a refused swap changed the container: %s → %s", short(before), short(after))
	}
}

func conditionOf(p *corev1.Pod, typ string) corev1.ConditionStatus {
	for _, c := range p.Status.Conditions {
		if string(c.Type) == typ {
			return c.Status
		}
	}
	return ""
}
