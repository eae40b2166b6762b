package kube

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	listersv1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/pkg/swap"
)

// secretTimeout bounds reading a pull secret: the pull waits on it, and
// kubelet's held stop waits on the pull.
const secretTimeout = 5 * time.Second

// Run watches the pods bound to the node until ctx ends. It returns when
// the watch cannot be set up at all; an API server that goes away later is
// logged and the watch resumes when it is back.
func (c *Controller) Run(ctx context.Context) error {
	recorder := newEventRecorder(c.client.Events(), c.node, c.log.Named("events"), c.now)
	var writer sync.WaitGroup
	defer writer.Wait()
	writerCtx, stopWriter := context.WithCancel(ctx)
	defer stopWriter() // before the Wait: Run may return while ctx lives on
	writer.Go(func() { recorder.run(writerCtx) })
	c.mu.Lock()
	c.ctx = ctx
	c.mu.Unlock()
	c.setRecorder(recorder)
	// The Node authorizer lets a node list and watch only its pods, and
	// only with exactly this selector.
	podSelector := fields.OneTermEqualSelector("spec.nodeName", c.node).String()
	pods := c.client.Pods("")
	inf := c.newInformer(&corev1.Pod{}, "pods", selectedListWatch(podSelector, pods.List, pods.Watch))
	lister := listersv1.NewPodLister(inf.GetIndexer())
	// The node's own object, for affinity drift (a node may watch itself).
	nodeSelector := fields.OneTermEqualSelector("metadata.name", c.node).String()
	nodes := c.client.Nodes()
	nodeInf := c.newInformer(&corev1.Node{}, "nodes", selectedListWatch(nodeSelector, nodes.List, nodes.Watch))
	nodeLister := listersv1.NewNodeLister(nodeInf.GetIndexer())
	var informers sync.WaitGroup
	defer informers.Wait()
	informers.Go(func() { nodeInf.RunWithContext(ctx) })
	c.mu.Lock()
	c.lister, c.nodes = lister, nodeLister
	c.mu.Unlock()
	queue := workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "inplaced-pods"})
	defer queue.ShutDown()
	uids := map[string]types.UID{} // queue key → pod UID, for deletions
	c.mu.Lock()
	c.requeue = func(key string, after time.Duration) { queue.AddAfter(key, after) }
	c.mu.Unlock()
	enqueue := func(obj any) {
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			queue.Add(key)
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: enqueue,
		UpdateFunc: func(_, obj any) {
			c.delivered(obj)
			enqueue(obj)
		},
		DeleteFunc: enqueue,
	}); err != nil {
		return fmt.Errorf("pod watch: %w", err)
	}
	if err := inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
		c.log.Warn("pod watch interrupted (API server unreachable?): CRI calls are unaffected; resuming when it answers", zap.Error(err))
	}); err != nil {
		return fmt.Errorf("pod watch: %w", err)
	}
	informers.Go(func() { inf.RunWithContext(ctx) })
	c.log.Info("Kubernetes mode: watching this node's pods", zap.String("node", c.node))
	go func() {
		if cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
			c.log.Info("pod watch synced", zap.Int("pods", len(inf.GetStore().ListKeys())))
		}
	}()
	go func() {
		<-ctx.Done()
		queue.ShutDown()
	}()
	for {
		key, shutdown := queue.Get()
		if shutdown {
			c.cancelAll(errDeleted)
			return nil
		}
		if err := c.sync(ctx, lister, key, uids); err != nil {
			c.log.Warn("pod sync failed; retrying", zap.String("pod", key), zap.Error(err))
			queue.AddRateLimited(key)
		} else {
			queue.Forget(key)
		}
		queue.Done(key)
	}
}

// newInformer is what client-go's generated informer for the type does
// (the same list and watch semantics, a namespace index), for the one
// type this client serves.
func (c *Controller) newInformer(obj runtime.Object, resource string, lw *cache.ListWatch) cache.SharedIndexInformer {
	return cache.NewSharedIndexInformerWithOptions(cache.ToListWatcherWithWatchListSemantics(lw, c.client), obj,
		cache.SharedIndexInformerOptions{
			ResyncPeriod: c.resync,
			Indexers:     cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc},
			Identifier:   (*cache.InformerName)(nil).WithResource(corev1.SchemeGroupVersion.WithResource(resource)),
		})
}

// sync compares one pod's spec with what runs and starts or ends changes.
func (c *Controller) sync(ctx context.Context, lister listersv1.PodLister, key string, uids map[string]types.UID) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	pod, err := lister.Pods(ns).Get(name)
	if apierrors.IsNotFound(err) {
		if uid, ok := uids[key]; ok {
			delete(uids, key)
			c.cancelPod(uid, errDeleted)
		}
		return nil
	}
	if err != nil {
		return err
	}
	if old, ok := uids[key]; ok && old != pod.UID {
		c.cancelPod(old, errDeleted) // same name, new pod
	}
	uids[key] = pod.UID
	c.log.Debug("pod synced", zap.String("pod", key), zap.String("resource_version", pod.ResourceVersion))
	if pod.DeletionTimestamp != nil || pod.Spec.NodeName != c.node {
		c.cancelPod(pod.UID, errDeleted)
		return nil
	}
	resp, err := c.rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{
		State:         &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_RUNNING},
		LabelSelector: map[string]string{swap.LabelPodUID: string(pod.UID)},
	}})
	if err != nil {
		return fmt.Errorf("list the pod's containers: %w", err)
	}
	running := newestByName(resp.Containers)
	for i := range pod.Spec.Containers {
		c.syncContainer(pod, &pod.Spec.Containers[i], running[pod.Spec.Containers[i].Name])
	}
	c.syncRequest(pod)
	c.syncEnvFromMetadata(pod, running)
	return nil
}

// newestByName: kubelet follows the newest container of a name.
func newestByName(cs []*runtimeapi.Container) map[string]*runtimeapi.Container {
	sort.Slice(cs, func(i, j int) bool { return cs[i].CreatedAt > cs[j].CreatedAt })
	out := map[string]*runtimeapi.Container{}
	for _, ct := range cs {
		n := ct.Labels[swap.LabelContainerName]
		if _, ok := out[n]; !ok && n != "" {
			out[n] = ct
		}
	}
	return out
}

func (c *Controller) syncContainer(pod *corev1.Pod, sc *corev1.Container, running *runtimeapi.Container) {
	key := containerKey{uid: pod.UID, name: sc.Name}
	hash := ContainerHash(sc.Name, sc.Image)
	c.mu.Lock()
	ch := c.changes[key]
	if ch != nil && ch.proceed {
		c.mu.Unlock()
		return // kubelet's stop is carrying it out
	}
	switch {
	case running == nil:
		c.mu.Unlock()
		if ch != nil {
			c.cancelChange(ch, fmt.Errorf("container %s no longer runs", sc.Name))
		}
		return
	case c.declares(running.Id, running.Annotations, hash):
		c.mu.Unlock()
		if ch != nil && ch.oldID != running.Id {
			c.log.Info("kubelet replaced the container itself: change dropped",
				zap.String("pod", pod.Namespace+"/"+pod.Name), zap.String("container", sc.Name), zap.String("image", sc.Image))
			c.cancelChange(ch, fmt.Errorf("kubelet replaced container %s itself", ch.oldID))
		} else if ch != nil {
			c.log.Info("pod spec went back to the running image: change dropped, nothing restarted",
				zap.String("pod", pod.Namespace+"/"+pod.Name), zap.String("container", sc.Name), zap.String("image", sc.Image))
			c.cancelChange(ch, errReverted)
		}
		return
	case ch != nil && ch.image == sc.Image && ch.oldID == running.Id:
		c.mu.Unlock()
		return // already pulling (or pulled)
	}
	next := c.newChange(pod, sc, running.Id)
	// Registered before anything slow, so that kubelet's StopContainer,
	// which follows the same spec change within milliseconds, finds it.
	c.changes[key] = next
	c.mu.Unlock()
	if ch != nil {
		ch.cancel(fmt.Errorf("superseded by image %s", sc.Image))
	}
	go c.prepare(next)
}

func (c *Controller) newChange(pod *corev1.Pod, sc *corev1.Container, oldID string) *change {
	var secrets []string
	for _, s := range pod.Spec.ImagePullSecrets {
		if s.Name != "" {
			secrets = append(secrets, s.Name)
		}
	}
	return &change{key: containerKey{uid: pod.UID, name: sc.Name}, namespace: pod.Namespace, pod: pod.Name,
		image: sc.Image, hash: ContainerHash(sc.Name, sc.Image), oldID: oldID, pullSecrets: secrets,
		metadataEnv: metadataEnv(pod, sc), detectedAt: c.now(), ready: make(chan struct{}), gone: make(chan struct{})}
}

// detect is the stop's own look at the pod watch's cache, for a stop that
// came before the watch's worker got to the change: kubelet and inplaced
// see the same spec change at about the same time. It reads only local
// state (the informer cache, the store, the backend).
func (c *Controller) detect(ctx context.Context, containerID string) *change {
	c.mu.Lock()
	lister := c.lister
	c.mu.Unlock()
	if lister == nil {
		return nil
	}
	pc, annotations, ok := c.podContainerOf(ctx, containerID)
	if !ok {
		return nil
	}
	pod, sc := c.cachedSpec(lister, pc.ns, pc.pod, pc.uid, pc.name)
	if sc == nil || c.kubeletHash(containerID, annotations) == "" {
		return nil // not a pod on the watch, being deleted, or not kubelet's container
	}
	if c.declares(containerID, annotations, ContainerHash(sc.Name, sc.Image)) {
		// The cached spec declares what runs: a liveness kill, an
		// eviction... or a spec change kubelet's own watch delivered first
		// (seen ahead by 15 ms). Give the watch watchLag to catch up.
		if !c.awaitNewer(ctx, lister, pod, watchLag) {
			return nil
		}
		if pod, sc = c.cachedSpec(lister, pc.ns, pc.pod, pc.uid, pc.name); sc == nil ||
			c.declares(containerID, annotations, ContainerHash(sc.Name, sc.Image)) {
			return nil
		}
	}
	next := c.newChange(pod, sc, containerID)
	c.mu.Lock()
	if ch := c.changes[next.key]; ch != nil {
		c.mu.Unlock()
		if ch.oldID == containerID && ch.image == next.image && !ch.proceed {
			return ch // the worker was just as quick
		}
		return nil
	}
	c.changes[next.key] = next
	c.mu.Unlock()
	go c.prepare(next)
	return next
}

// podContainer names the pod container a CRI container is, by kubelet's
// labels on it.
type podContainer struct{ ns, pod, uid, name string }

// podContainerOf reads a container's kubelet labels (and its annotations);
// ok is false when they do not name a pod's container.
func (c *Controller) podContainerOf(ctx context.Context, id string) (pc podContainer, annotations map[string]string, ok bool) {
	labels, annotations := c.containerMeta(ctx, id)
	pc = podContainer{ns: labels[swap.LabelPodNamespace], pod: labels[swap.LabelPodName],
		uid: labels[swap.LabelPodUID], name: labels[swap.LabelContainerName]}
	return pc, annotations, pc.ns != "" && pc.pod != "" && pc.name != ""
}

// watchLag bounds how long a stop of a container whose cached spec declares
// what runs waits for the pod watch to deliver a newer pod: kubelet's
// watch and inplaced's see the same change at about the same time, and
// kubelet's can be first. Stops of pods being deleted, or not on the watch,
// never wait; nor does anything wait on the API server itself.
const watchLag = 500 * time.Millisecond

// cachedSpec returns the pod in the watch's cache and its container name,
// if the pod is this node's, is the one with uid and is not being deleted.
func (c *Controller) cachedSpec(lister listersv1.PodLister, ns, podName, uid, name string) (*corev1.Pod, *corev1.Container) {
	pod, err := lister.Pods(ns).Get(podName)
	if err != nil || string(pod.UID) != uid || pod.DeletionTimestamp != nil || pod.Spec.NodeName != c.node {
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
func (c *Controller) awaitNewer(ctx context.Context, lister listersv1.PodLister, pod *corev1.Pod, d time.Duration) bool {
	wake := make(chan struct{})
	c.mu.Lock()
	c.waiters[pod.UID] = append(c.waiters[pod.UID], wake)
	c.mu.Unlock()
	defer c.dropWaiter(pod.UID, wake)
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

// delivered wakes the stops waiting for a newer version of obj's pod.
func (c *Controller) delivered(obj any) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	c.mu.Lock()
	ws := c.waiters[pod.UID]
	delete(c.waiters, pod.UID)
	c.mu.Unlock()
	for _, w := range ws {
		close(w)
	}
}

func (c *Controller) dropWaiter(uid types.UID, wake chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ws := c.waiters[uid]
	for i, w := range ws {
		if w == wake {
			c.waiters[uid] = append(ws[:i], ws[i+1:]...)
			break
		}
	}
	if len(c.waiters[uid]) == 0 {
		delete(c.waiters, uid)
	}
}

// kubeletHash is the container hash kubelet sees for a container: its own
// annotation, unless a spec write after an annotation swap is pending.
func (c *Controller) kubeletHash(id string, annotations map[string]string) string {
	if h, ok := c.kubelet.PresentedHash(id); ok {
		return h
	}
	return annotations[swap.AnnotationHash]
}

// declares reports whether a spec with hash specHash declares what the
// container runs: the hash kubelet is shown for it, or — while the spec
// write after an annotation swap is being handed over — its own.
func (c *Controller) declares(id string, annotations map[string]string, specHash string) bool {
	return specHash == c.kubeletHash(id, annotations) || specHash == annotations[swap.AnnotationHash]
}

// containerMeta is a container's labels and annotations: from the record
// of kubelet's create, else from the backend.
func (c *Controller) containerMeta(ctx context.Context, id string) (labels, annotations map[string]string) {
	if req, err := c.store.Container(id); err == nil && req.GetConfig() != nil {
		return req.Config.Labels, req.Config.Annotations
	}
	st, err := c.rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id})
	if err != nil {
		return nil, nil
	}
	return st.GetStatus().GetLabels(), st.GetStatus().GetAnnotations()
}

func (c *Controller) cancelPod(uid types.UID, why error) {
	c.forgetEnv(uid)
	c.mu.Lock()
	var drop []*change
	for k, ch := range c.changes {
		if k.uid == uid && !ch.proceed {
			drop = append(drop, ch)
			delete(c.changes, k)
		}
	}
	c.mu.Unlock()
	for _, ch := range drop {
		ch.cancel(why)
	}
}

func (c *Controller) cancelAll(why error) {
	c.mu.Lock()
	all := c.changes
	c.changes = map[containerKey]*change{}
	c.mu.Unlock()
	for _, ch := range all {
		ch.cancel(why)
	}
}

// selectedListWatch lists and watches one resource with a field selector
// that every request carries, whatever options the informer passes.
func selectedListWatch[L runtime.Object](selector string, list func(context.Context, metav1.ListOptions) (L, error),
	watchFn func(context.Context, metav1.ListOptions) (watch.Interface, error)) *cache.ListWatch {
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = selector
			return list(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = selector
			return watchFn(ctx, o)
		},
	}
}
