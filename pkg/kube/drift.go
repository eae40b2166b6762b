package kube

import (
	"context"
	"fmt"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	schedcorev1 "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/klog/v2"

	"github.com/inplaced/inplaced/pkg/errkind"
	"github.com/inplaced/inplaced/pkg/kube/podapi"
	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

// Affinity drift policies (--affinity-drift).
const (
	DriftWarn   = "warn"
	DriftRefuse = "refuse"
)

// Drift says why a pod no longer fits its node ("" when it fits): an
// in-place change bypasses the scheduler, so the pod's nodeSelector,
// required node affinity and the node's taints are checked again here with
// the scheduler's own matchers.
func Drift(pod *corev1.Pod, node *corev1.Node) string {
	var why []string
	if ok, err := nodeaffinity.GetRequiredNodeAffinity(pod).Match(node); err != nil {
		why = append(why, fmt.Sprintf("node affinity cannot be evaluated: %v", err))
	} else if !ok {
		why = append(why, fmt.Sprintf("node %s no longer matches the pod's nodeSelector/required node affinity", node.Name))
	}
	// NoExecute taints evict; NoSchedule would have kept the pod off the
	// node. The node.kubernetes.io/ taints (not-ready, unreachable, the
	// pressure conditions, unschedulable) say how the node is now, not where
	// the pod belongs: a cordon or a pressure is no reason to call it drift.
	if t, bad := schedcorev1.FindMatchingUntoleratedTaint(klog.Background(), node.Spec.Taints, pod.Spec.Tolerations, func(t *corev1.Taint) bool {
		return (t.Effect == corev1.TaintEffectNoSchedule || t.Effect == corev1.TaintEffectNoExecute) &&
			!strings.HasPrefix(t.Key, "node.kubernetes.io/")
	}, false); bad {
		why = append(why, fmt.Sprintf("node %s has taint %s=%s:%s that the pod does not tolerate", node.Name, t.Key, t.Value, t.Effect))
	}
	return strings.Join(why, "; ")
}

// affinityDrift is the swap engine's admission check of a pod against its
// node, and inplacectl check's list of the pods that no longer fit. It
// reads the informers' caches only and keeps no state of its own.
type affinityDrift struct {
	node string
	// policy: what a swap of a pod that no longer fits gets (DriftWarn,
	// DriftRefuse).
	policy string
	cache  *podCache
	writer *podWriter
}

// admit checks, before every swap of a pod's container, the pod against
// the node's current labels and taints. A pod that no longer fits gets a
// Warning event and the condition inplaced.io/AffinityDrift=True (written
// in the background: nothing here waits on the API server); with
// --affinity-drift=refuse the swap is refused.
func (d *affinityDrift) admit(_ context.Context, namespace, name, uid string) (string, error) {
	pod, node := d.podAndNode(namespace, name, uid)
	if pod == nil || node == nil {
		return "", nil // not (yet) in the caches: nothing to hold against it
	}
	why := Drift(pod, node)
	if why == "" {
		if conditionStatus(pod, podapi.ConditionAffinityDrift) == corev1.ConditionTrue {
			go d.writer.setCondition(pod, podapi.ConditionAffinityDrift, corev1.ConditionFalse, "Fits", "the pod fits its node again")
		}
		return "", nil
	}
	go func() {
		d.writer.event(pod, corev1.EventTypeWarning, podapi.EventAffinityDrift, "pod no longer fits its node: %s", why)
		d.writer.setCondition(pod, podapi.ConditionAffinityDrift, corev1.ConditionTrue, "NoLongerFits", why)
	}()
	if d.policy == DriftRefuse {
		return "", errkind.Errorf(errkind.Refused, "pod %s/%s no longer fits its node (%s): swap refused (--affinity-drift=refuse); the scheduler would place it elsewhere — recreate the pod", namespace, name, why)
	}
	return "affinity drift: " + why, nil
}

func (d *affinityDrift) podAndNode(namespace, name, uid string) (*corev1.Pod, *corev1.Node) {
	pods, nodes := d.cache.listers()
	if pods == nil || nodes == nil {
		return nil, nil
	}
	pod, err := pods.Pods(namespace).Get(name)
	if err != nil || (uid != "" && string(pod.UID) != uid) {
		return nil, nil
	}
	node, err := nodes.Get(d.node)
	if err != nil {
		return pod, nil
	}
	return pod, node
}

// misfits lists the pods on the node that no longer fit it.
func (d *affinityDrift) misfits() (node string, checked int, misfits []*inplacedv1.PodFit, err error) {
	pods, nodes := d.cache.listers()
	if pods == nil || nodes == nil {
		return d.node, 0, nil, errkind.Errorf(errkind.Unavailable, "the pod watch has not started yet: retry in a moment")
	}
	n, err := nodes.Get(d.node)
	if err != nil {
		return d.node, 0, nil, errkind.Errorf(errkind.Unavailable, "node %s not in the cache yet (%v): retry in a moment", d.node, err)
	}
	all, err := pods.List(labels.Everything())
	if err != nil {
		return d.node, 0, nil, err
	}
	sort.Slice(all, func(i, j int) bool { return all[i].Namespace+"/"+all[i].Name < all[j].Namespace+"/"+all[j].Name })
	for _, p := range all {
		if p.DeletionTimestamp != nil {
			continue
		}
		checked++
		if why := Drift(p, n); why != "" {
			misfits = append(misfits, &inplacedv1.PodFit{Namespace: p.Namespace, Pod: p.Name, Reason: why})
		}
	}
	return d.node, checked, misfits, nil
}
