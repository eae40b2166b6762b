package kube

import (
	"context"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	listersv1 "k8s.io/client-go/listers/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/pkg/store"
	"github.com/inplaced/inplaced/pkg/swap"
)

// watchLag bounds how long a stop of a container whose cached spec declares
// what runs waits for the pod watch to deliver a newer pod: kubelet's
// watch and inplaced's see the same change at about the same time, and
// kubelet's can be first. Stops of pods being deleted, or not on the watch,
// never wait; nor does anything wait on the API server itself.
const watchLag = 500 * time.Millisecond

// podCache is the pod and node informers' caches as the features read
// them, and the stops waiting for the pod watch to deliver a newer pod
// (watchLag). Nothing here asks the API server. The listers are nil until
// Run has started the informers.
type podCache struct {
	node string

	mu      sync.Mutex
	pods    listersv1.PodLister
	nodes   listersv1.NodeLister
	waiters map[types.UID][]chan struct{}
}

func newPodCache(node string) *podCache {
	return &podCache{node: node, waiters: map[types.UID][]chan struct{}{}}
}

// set makes the informers' listers readable (Run, once they exist).
func (p *podCache) set(pods listersv1.PodLister, nodes listersv1.NodeLister) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pods, p.nodes = pods, nodes
}

// podLister is the pod informer's lister, nil before Run.
func (p *podCache) podLister() listersv1.PodLister {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pods
}

// listers are both informers' listers, nil before Run.
func (p *podCache) listers() (listersv1.PodLister, listersv1.NodeLister) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pods, p.nodes
}

// spec returns the cached pod and its container name, if the pod is this
// node's, is the one with uid and is not being deleted.
func (p *podCache) spec(ns, podName, uid, name string) (*corev1.Pod, *corev1.Container) {
	lister := p.podLister()
	if lister == nil {
		return nil, nil
	}
	pod, err := lister.Pods(ns).Get(podName)
	if err != nil || string(pod.UID) != uid || pod.DeletionTimestamp != nil || pod.Spec.NodeName != p.node {
		return nil, nil
	}
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name == name {
			return pod, &pod.Spec.Containers[i]
		}
	}
	return nil, nil
}

// awaitNewer waits up to d for the watch to deliver a version of pod newer
// than the one given; it reports whether one came.
func (p *podCache) awaitNewer(ctx context.Context, pod *corev1.Pod, d time.Duration) bool {
	wake := make(chan struct{})
	p.mu.Lock()
	lister := p.pods
	p.waiters[pod.UID] = append(p.waiters[pod.UID], wake)
	p.mu.Unlock()
	defer p.dropWaiter(pod.UID, wake)
	if lister == nil {
		return false
	}
	if now, err := lister.Pods(pod.Namespace).Get(pod.Name); err == nil && now.ResourceVersion != pod.ResourceVersion {
		return true // delivered between the caller's read and the registration
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-wake:
		return true
	case <-t.C:
		return false
	case <-ctx.Done():
		return false
	}
}

// delivered wakes the stops waiting for a newer version of obj's pod (the
// pod informer's updates).
func (p *podCache) delivered(obj any) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	p.mu.Lock()
	ws := p.waiters[pod.UID]
	delete(p.waiters, pod.UID)
	p.mu.Unlock()
	for _, w := range ws {
		close(w)
	}
}

func (p *podCache) dropWaiter(uid types.UID, wake chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ws := p.waiters[uid]
	for i, w := range ws {
		if w == wake {
			p.waiters[uid] = append(ws[:i], ws[i+1:]...)
			break
		}
	}
	if len(p.waiters[uid]) == 0 {
		delete(p.waiters, uid)
	}
}

// nodeContainers reads what the node knows of a CRI container: the labels
// and annotations kubelet gave it, from the record of kubelet's create,
// else from the backend.
type nodeContainers struct {
	store *store.Store
	rt    runtimeapi.RuntimeServiceClient
}

// podContainer names the pod container a CRI container is, by kubelet's
// labels on it.
type podContainer struct{ ns, pod, uid, name string }

// podContainerOf reads a container's kubelet labels (and its annotations);
// ok is false when they do not name a pod's container.
func (n nodeContainers) podContainerOf(ctx context.Context, id string) (pc podContainer, annotations map[string]string, ok bool) {
	labels, annotations := n.meta(ctx, id)
	pc = podContainer{ns: labels[swap.LabelPodNamespace], pod: labels[swap.LabelPodName],
		uid: labels[swap.LabelPodUID], name: labels[swap.LabelContainerName]}
	return pc, annotations, pc.ns != "" && pc.pod != "" && pc.name != ""
}

// cachedSpec is CRI container id's pod container, its annotations, and the
// cached pod and container spec it runs for: what a stop of the container
// looks up before the pod watch may have delivered a change. sc is nil
// when the watch has not started (the container is not read then), the
// container is not a pod's, or its pod is not on the watch or is being
// deleted.
func cachedSpec(ctx context.Context, cache *podCache, containers nodeContainers, id string) (pc podContainer, annotations map[string]string, pod *corev1.Pod, sc *corev1.Container) {
	if cache.podLister() == nil {
		return pc, nil, nil, nil
	}
	pc, annotations, ok := containers.podContainerOf(ctx, id)
	if !ok {
		return pc, annotations, nil, nil
	}
	pod, sc = cache.spec(pc.ns, pc.pod, pc.uid, pc.name)
	return pc, annotations, pod, sc
}

// meta is a container's labels and annotations.
func (n nodeContainers) meta(ctx context.Context, id string) (labels, annotations map[string]string) {
	if req, err := n.store.Container(id); err == nil && req.GetConfig() != nil {
		return req.Config.Labels, req.Config.Annotations
	}
	st, err := n.rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id})
	if err != nil {
		return nil, nil
	}
	return st.GetStatus().GetLabels(), st.GetStatus().GetAnnotations()
}

// recordedEnv is the env kubelet created container id with; ok is false
// for a container not created through inplaced (its env is unknown here).
func (n nodeContainers) recordedEnv(id string) (env map[string]string, ok bool) {
	req, err := n.store.Container(id)
	if err != nil || req.GetConfig() == nil {
		return nil, false
	}
	env = map[string]string{}
	for _, kv := range req.Config.Envs {
		env[kv.Key] = string(kv.Value)
	}
	return env, true
}
