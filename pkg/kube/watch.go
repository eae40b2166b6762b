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

// Run watches the pods bound to the node (and the node) until ctx ends,
// and hands each pod the watch delivers to the features (sync). It returns
// when the watch cannot be set up at all; an API server that goes away
// later is logged and the watch resumes when it is back.
func (c *Controller) Run(ctx context.Context) error {
	recorder := newEventRecorder(c.client.Events(), c.node, c.log.Named("events"), time.Now)
	var writer sync.WaitGroup
	defer writer.Wait()
	writerCtx, stopWriter := context.WithCancel(ctx)
	defer stopWriter() // before the Wait: Run may return while ctx lives on
	writer.Go(func() { recorder.run(writerCtx) })
	c.writer.setRecorder(recorder)
	var informers sync.WaitGroup
	defer informers.Wait()
	queue := workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "inplaced-pods"})
	defer queue.ShutDown()
	c.mu.Lock()
	c.ctx, c.queue = ctx, queue
	c.mu.Unlock()
	inf, err := c.startInformers(ctx, &informers, queue)
	if err != nil {
		return err
	}
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
	lister := listersv1.NewPodLister(inf.GetIndexer())
	uids := map[string]types.UID{} // queue key → pod UID, for deletions
	for {
		key, shutdown := queue.Get()
		if shutdown {
			c.images.cancelAll(errDeleted)
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

// startInformers starts the node informer and the pod informer, whose
// events queue the pod's key, and makes both caches readable (podCache).
func (c *Controller) startInformers(ctx context.Context, running *sync.WaitGroup, queue workqueue.TypedInterface[string]) (cache.SharedIndexInformer, error) {
	// The Node authorizer lets a node list and watch only its pods, and
	// only with exactly this selector.
	podSelector := fields.OneTermEqualSelector("spec.nodeName", c.node).String()
	pods := c.client.Pods("")
	inf := c.newInformer(&corev1.Pod{}, "pods", selectedListWatch(podSelector, pods.List, pods.Watch))
	// The node's own object, for affinity drift (a node may watch itself).
	nodeSelector := fields.OneTermEqualSelector("metadata.name", c.node).String()
	nodes := c.client.Nodes()
	nodeInf := c.newInformer(&corev1.Node{}, "nodes", selectedListWatch(nodeSelector, nodes.List, nodes.Watch))
	running.Go(func() { nodeInf.RunWithContext(ctx) })
	c.cache.set(listersv1.NewPodLister(inf.GetIndexer()), listersv1.NewNodeLister(nodeInf.GetIndexer()))
	enqueue := func(obj any) {
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			queue.Add(key)
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: enqueue,
		UpdateFunc: func(_, obj any) {
			c.cache.delivered(obj)
			enqueue(obj)
		},
		DeleteFunc: enqueue,
	}); err != nil {
		return nil, fmt.Errorf("pod watch: %w", err)
	}
	if err := inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
		c.log.Warn("pod watch interrupted (API server unreachable?): CRI calls are unaffected; resuming when it answers", zap.Error(err))
	}); err != nil {
		return nil, fmt.Errorf("pod watch: %w", err)
	}
	running.Go(func() { inf.RunWithContext(ctx) })
	return inf, nil
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

// sync hands one pod, with its running containers, to each feature: image
// changes, swap requests, env from metadata.
func (c *Controller) sync(ctx context.Context, lister listersv1.PodLister, key string, uids map[string]types.UID) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	pod, err := lister.Pods(ns).Get(name)
	if apierrors.IsNotFound(err) {
		if uid, ok := uids[key]; ok {
			delete(uids, key)
			c.podGone(uid)
		}
		return nil
	}
	if err != nil {
		return err
	}
	if old, ok := uids[key]; ok && old != pod.UID {
		c.podGone(old) // same name, new pod
	}
	uids[key] = pod.UID
	c.log.Debug("pod synced", zap.String("pod", key), zap.String("resource_version", pod.ResourceVersion))
	if pod.DeletionTimestamp != nil || pod.Spec.NodeName != c.node {
		c.podGone(pod.UID)
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
		c.images.sync(pod, &pod.Spec.Containers[i], running[pod.Spec.Containers[i].Name])
	}
	c.requests.sync(pod)
	c.env.sync(pod, running)
	return nil
}

// podGone ends what the features keep of a pod deleted, being deleted or
// replaced by a pod of the same name.
func (c *Controller) podGone(uid types.UID) {
	c.env.forget(uid)
	c.images.cancelPod(uid, errDeleted)
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
