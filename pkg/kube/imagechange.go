package kube

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/pkg/credentials"
	"github.com/inplaced/inplaced/pkg/kubeclient"
	"github.com/inplaced/inplaced/pkg/swap"
)

// imageChanges turns kubelet's restart of a container for a changed pod
// spec image into an in-place swap with the pull before the stop. kubelet,
// when a pod's spec image changes, kills the old container first and pulls
// the new image only while starting the replacement, so the whole pull is
// downtime and an image that cannot be pulled leaves the pod with no
// container. Here the pod watch registers a change and starts the pull at
// once (sync); kubelet's StopContainer finds the change (forStop), is held
// until the pull is done and then carries the swap out (swapInsteadOfStop,
// imagestop.go).
type imageChanges struct {
	client        kubeclient.Interface // the pods' pull secrets
	engine        Engine
	kubelet       Kubelet
	containers    nodeContainers
	cache         *podCache
	creds         *credentials.Resolver
	onPullFailure string
	log           *zap.Logger
	now           func() time.Time
	ctx           func() context.Context

	mu sync.Mutex
	// changes: the change of each pod container, from detection until
	// kubelet's stop carried it out or it went away. mu also guards the
	// fields of each change that say so.
	changes map[containerKey]*change
}

// change is a pod spec image change for one container, from detection
// until kubelet's stop was carried out (or the change went away).
type change struct {
	key        containerKey
	namespace  string
	pod        string
	image      string
	hash       string
	oldID      string
	detectedAt time.Time // guarded by imageChanges.mu
	// pullSecrets are the pod's imagePullSecrets, read again for each pull.
	pullSecrets []string
	// metadataEnv is the container's env from the pod's labels and
	// annotations, as kubelet's create of the new container resolves it.
	metadataEnv map[string]string

	// ready is closed once prepare set prep, prepErr and creds (under
	// imageChanges.mu).
	ready chan struct{}
	prep  *swap.Prepared
	// prepErr: the swap could not even be prepared (container gone, ...).
	prepErr error
	// creds: what the credentials lookup for the pull covered.
	creds lookup

	gone     chan struct{} // closed by cancel
	goneWhy  error
	doneOnce sync.Once
	// proceed: kubelet's stop is carrying it out; the watch leaves it
	// alone (guarded by imageChanges.mu).
	proceed bool
}

// Reasons a change goes away.
var (
	errReverted = errors.New("the pod spec went back to the running image")
	errDeleted  = errors.New("the pod is being deleted")
)

func (ch *change) cancel(why error) {
	ch.doneOnce.Do(func() {
		ch.goneWhy = why
		close(ch.gone)
		if ch.prep != nil {
			ch.prep.Cancel(why)
		}
	})
}

// sync compares one spec container with the container of its name that
// runs, and starts, replaces or drops its change.
func (ic *imageChanges) sync(pod *corev1.Pod, sc *corev1.Container, running *runtimeapi.Container) {
	key := containerKey{uid: pod.UID, name: sc.Name}
	hash := ContainerHash(sc.Name, sc.Image)
	ic.mu.Lock()
	ch := ic.changes[key]
	if ch != nil && ch.proceed {
		ic.mu.Unlock()
		return // kubelet's stop is carrying it out
	}
	switch {
	case running == nil:
		ic.mu.Unlock()
		if ch != nil {
			ic.cancel(ch, fmt.Errorf("container %s no longer runs", sc.Name))
		}
		return
	case ic.declares(running.Id, running.Annotations, hash):
		ic.mu.Unlock()
		ic.dropDeclared(pod, sc, ch, running.Id)
		return
	case ch != nil && ch.image == sc.Image && ch.oldID == running.Id:
		ic.mu.Unlock()
		return // already pulling (or pulled)
	}
	next := ic.newChange(pod, sc, running.Id)
	// Registered before anything slow, so that kubelet's StopContainer,
	// which follows the same spec change within milliseconds, finds it.
	ic.changes[key] = next
	ic.mu.Unlock()
	if ch != nil {
		ch.cancel(fmt.Errorf("superseded by image %s", sc.Image))
	}
	go ic.prepare(next)
}

// dropDeclared ends change ch (if any) of a container whose spec declares
// what runs: kubelet replaced the container itself, or the spec went back.
func (ic *imageChanges) dropDeclared(pod *corev1.Pod, sc *corev1.Container, ch *change, runningID string) {
	switch {
	case ch == nil:
	case ch.oldID != runningID:
		ic.log.Info("kubelet replaced the container itself: change dropped",
			zap.String("pod", pod.Namespace+"/"+pod.Name), zap.String("container", sc.Name), zap.String("image", sc.Image))
		ic.cancel(ch, fmt.Errorf("kubelet replaced container %s itself", ch.oldID))
	default:
		ic.log.Info("pod spec went back to the running image: change dropped, nothing restarted",
			zap.String("pod", pod.Namespace+"/"+pod.Name), zap.String("container", sc.Name), zap.String("image", sc.Image))
		ic.cancel(ch, errReverted)
	}
}

func (ic *imageChanges) newChange(pod *corev1.Pod, sc *corev1.Container, oldID string) *change {
	var secrets []string
	for _, s := range pod.Spec.ImagePullSecrets {
		if s.Name != "" {
			secrets = append(secrets, s.Name)
		}
	}
	return &change{key: containerKey{uid: pod.UID, name: sc.Name}, namespace: pod.Namespace, pod: pod.Name,
		image: sc.Image, hash: ContainerHash(sc.Name, sc.Image), oldID: oldID, pullSecrets: secrets,
		metadataEnv: metadataEnv(pod, sc), detectedAt: ic.now(), ready: make(chan struct{}), gone: make(chan struct{})}
}

// retryPullAfter spaces new pull attempts of an image that failed: each of
// kubelet's retried stops after that tries again.
const retryPullAfter = 5 * time.Second

// forStop returns the pending change of the container kubelet stops, if
// any: the one the watch registered, else one the stop detects itself
// (detect). A change whose pull failed a while ago is prepared again, so
// that kubelet's retry pulls again.
func (ic *imageChanges) forStop(ctx context.Context, containerID string) *change {
	ic.mu.Lock()
	var found *change
	for _, ch := range ic.changes {
		if ch.oldID == containerID && !ch.proceed {
			found = ch
			break
		}
	}
	var detectedAt time.Time
	if found != nil {
		detectedAt = found.detectedAt
	}
	ic.mu.Unlock()
	if found == nil {
		return ic.detect(ctx, containerID)
	}
	if failed := found.pullFailed(); failed && ic.now().Sub(detectedAt) >= retryPullAfter {
		return ic.reprepare(found)
	}
	return found
}

// pullFailed reports whether the change was prepared and its pull failed.
func (ch *change) pullFailed() bool {
	select {
	case <-ch.ready:
	default:
		return false
	}
	p := ch.prep
	if p == nil {
		return false
	}
	select {
	case <-p.Pulled():
		return p.PullErr() != nil
	default:
		return false
	}
}

// detect is the stop's own look at the pod watch's cache, for a stop that
// came before the watch's worker got to the change: kubelet and inplaced
// see the same spec change at about the same time. It reads only local
// state (the informer cache, the store, the backend).
func (ic *imageChanges) detect(ctx context.Context, containerID string) *change {
	pc, annotations, pod, sc := cachedSpec(ctx, ic.cache, ic.containers, containerID)
	if sc == nil || ic.kubeletHash(containerID, annotations) == "" {
		return nil // not a pod on the watch, being deleted, or not kubelet's container
	}
	if ic.declares(containerID, annotations, ContainerHash(sc.Name, sc.Image)) {
		// The cached spec declares what runs: a liveness kill, an
		// eviction... or a spec change kubelet's own watch delivered first
		// (seen ahead by 15 ms). Give the watch watchLag to catch up.
		if !ic.cache.awaitNewer(ctx, pod, watchLag) {
			return nil
		}
		if pod, sc = ic.cache.spec(pc.ns, pc.pod, pc.uid, pc.name); sc == nil ||
			ic.declares(containerID, annotations, ContainerHash(sc.Name, sc.Image)) {
			return nil
		}
	}
	next := ic.newChange(pod, sc, containerID)
	ic.mu.Lock()
	if ch := ic.changes[next.key]; ch != nil {
		ic.mu.Unlock()
		if ch.oldID == containerID && ch.image == next.image && !ch.proceed {
			return ch // the worker was just as quick
		}
		return nil
	}
	ic.changes[next.key] = next
	ic.mu.Unlock()
	go ic.prepare(next)
	return next
}

// reprepare replaces a failed change by a new attempt with the same
// credentials lookup.
func (ic *imageChanges) reprepare(old *change) *change {
	ch := &change{key: old.key, namespace: old.namespace, pod: old.pod, image: old.image, hash: old.hash,
		oldID: old.oldID, pullSecrets: old.pullSecrets, metadataEnv: old.metadataEnv, detectedAt: ic.now(), ready: make(chan struct{}), gone: make(chan struct{})}
	ic.mu.Lock()
	if ic.changes[old.key] != old {
		ic.mu.Unlock()
		return nil
	}
	ic.changes[old.key] = ch
	ic.mu.Unlock()
	old.cancel(errors.New("superseded by a new pull attempt"))
	go ic.prepare(ch)
	return ch
}

// prepare pulls for a change: the credentials kubelet would use (the pod's
// pull secrets, the node's docker config, credential-provider plugins:
// pullAuths), then the engine's Prepare, which pulls in the background.
func (ic *imageChanges) prepare(ch *change) {
	auths, l := ic.pullAuths(ch)
	prep, err := ic.engine.Prepare(ic.ctx(), swap.KubeletChange{ContainerID: ch.oldID, Image: ch.image, Hash: ch.hash,
		MetadataEnv: ch.metadataEnv, Auths: auths, ExplainPull: ic.explainPull(l)})
	ic.mu.Lock()
	ch.prep, ch.prepErr, ch.creds = prep, err, l
	ic.mu.Unlock()
	close(ch.ready)
	if err != nil {
		ic.log.Warn("cannot prepare the in-place swap; kubelet's restart goes the usual way",
			zap.String("pod", ch.namespace+"/"+ch.pod), zap.String("container", ch.key.name), zap.Error(err))
		ic.forget(ch)
		return
	}
	select {
	case <-ch.gone: // cancelled while preparing
		prep.Cancel(ch.goneWhy)
	default:
	}
	ic.log.Info("pod spec image changed: pulling ahead of kubelet's stop",
		zap.String("pod", ch.namespace+"/"+ch.pod), zap.String("container", ch.key.name),
		zap.String("container_id", ch.oldID), zap.String("image", ch.image), zap.String("swap_id", prep.ID()))
}

// pending reports whether a change of container id (pod container key) is
// being prepared, pulling or pulled, short of a failed pull: its swap is
// coming.
func (ic *imageChanges) pending(key containerKey, id string) bool {
	ic.mu.Lock()
	defer ic.mu.Unlock()
	ch := ic.changes[key]
	if ch == nil || ch.oldID != id {
		return false
	}
	select {
	case <-ch.ready:
	default:
		return true // being prepared
	}
	if ch.prepErr != nil || ch.prep == nil {
		return false
	}
	select {
	case <-ch.prep.Pulled():
		return ch.prep.PullErr() == nil
	default:
		return true // pulling
	}
}

func (ic *imageChanges) forget(ch *change) {
	ic.mu.Lock()
	if ic.changes[ch.key] == ch {
		delete(ic.changes, ch.key)
	}
	ic.mu.Unlock()
}

func (ic *imageChanges) cancel(ch *change, why error) {
	ic.forget(ch)
	ch.cancel(why)
}

// cancelPod cancels the changes of a pod gone, but those kubelet's stop is
// carrying out.
func (ic *imageChanges) cancelPod(uid types.UID, why error) {
	ic.mu.Lock()
	var drop []*change
	for k, ch := range ic.changes {
		if k.uid == uid && !ch.proceed {
			drop = append(drop, ch)
			delete(ic.changes, k)
		}
	}
	ic.mu.Unlock()
	for _, ch := range drop {
		ch.cancel(why)
	}
}

func (ic *imageChanges) cancelAll(why error) {
	ic.mu.Lock()
	all := ic.changes
	ic.changes = map[containerKey]*change{}
	ic.mu.Unlock()
	for _, ch := range all {
		ch.cancel(why)
	}
}

// kubeletHash is the container hash kubelet sees for a container: its own
// annotation, unless a spec write after an annotation swap is pending.
func (ic *imageChanges) kubeletHash(id string, annotations map[string]string) string {
	if h, ok := ic.kubelet.PresentedHash(id); ok {
		return h
	}
	return annotations[swap.AnnotationHash]
}

// declares reports whether a spec with hash specHash declares what the
// container runs: the hash kubelet is shown for it, or — while the spec
// write after an annotation swap is being handed over — its own.
func (ic *imageChanges) declares(id string, annotations map[string]string, specHash string) bool {
	return specHash == ic.kubeletHash(id, annotations) || specHash == annotations[swap.AnnotationHash]
}
