package kube

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestDrift(t *testing.T) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{"zone": "a", "disk": "ssd"}}}
	affinity := func(key string, values ...string) *corev1.Affinity {
		return &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
			NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{
				{Key: key, Operator: corev1.NodeSelectorOpIn, Values: values}}}}}}}
	}
	cases := []struct {
		name string
		spec corev1.PodSpec
		node func(*corev1.Node)
		want string
	}{
		{"fits", corev1.PodSpec{NodeSelector: map[string]string{"zone": "a"}, Affinity: affinity("disk", "ssd")}, nil, ""},
		{"selector gone", corev1.PodSpec{NodeSelector: map[string]string{"zone": "b"}}, nil, "nodeSelector"},
		{"affinity gone", corev1.PodSpec{Affinity: affinity("zone", "a")}, func(n *corev1.Node) { delete(n.Labels, "zone") }, "affinity"},
		{"untolerated taint", corev1.PodSpec{}, func(n *corev1.Node) {
			n.Spec.Taints = []corev1.Taint{{Key: "maint", Value: "yes", Effect: corev1.TaintEffectNoSchedule}}
		}, "taint maint=yes:NoSchedule"},
		{"tolerated taint", corev1.PodSpec{Tolerations: []corev1.Toleration{{Key: "maint", Operator: corev1.TolerationOpExists}}}, func(n *corev1.Node) {
			n.Spec.Taints = []corev1.Taint{{Key: "maint", Value: "yes", Effect: corev1.TaintEffectNoExecute}}
		}, ""},
		{"node condition taint ignored", corev1.PodSpec{}, func(n *corev1.Node) {
			n.Spec.Taints = []corev1.Taint{{Key: "node.kubernetes.io/not-ready", Effect: corev1.TaintEffectNoSchedule}}
		}, ""},
		{"prefer taint ignored", corev1.PodSpec{}, func(n *corev1.Node) {
			n.Spec.Taints = []corev1.Taint{{Key: "x", Effect: corev1.TaintEffectPreferNoSchedule}}
		}, ""},
	}
	for _, c := range cases {
		n := node.DeepCopy()
		if c.node != nil {
			c.node(n)
		}
		got := Drift(&corev1.Pod{Spec: c.spec}, n)
		if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
			t.Errorf("%s: drift %q, want %q", c.name, got, c.want)
		}
	}
}
