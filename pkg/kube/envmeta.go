package kube

import (
	"context"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/pkg/errkind"
	"github.com/inplaced/inplaced/pkg/intercept"
	"github.com/inplaced/inplaced/pkg/kube/podapi"
	"github.com/inplaced/inplaced/pkg/swap"
	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

// Who asked for an env-from-metadata swap: the pod's opt-in annotation, or
// an OpenKruise in-place update.
const (
	CallerEnvFromMetadata       = "pod metadata (" + podapi.AnnotationEnvFromMetadata + ")"
	CallerKruiseEnvFromMetadata = "OpenKruise in-place update (env from metadata)"
)

// metadataFieldRef matches the downward API paths kubelet resolves from
// one label or annotation (what OpenKruise's InPlaceUpdateEnvFromMetadata
// covers).
var metadataFieldRef = regexp.MustCompile(`^metadata\.(labels|annotations)\['(.+)'\]$`)

// metadataEnv is the env a container takes from the pod's labels and
// annotations, resolved against the pod's current metadata.
func metadataEnv(pod *corev1.Pod, c *corev1.Container) map[string]string {
	out := map[string]string{}
	for _, e := range c.Env {
		if e.ValueFrom == nil || e.ValueFrom.FieldRef == nil {
			continue
		}
		m := metadataFieldRef.FindStringSubmatch(e.ValueFrom.FieldRef.FieldPath)
		if m == nil {
			continue
		}
		src := pod.Labels
		if m[1] == "annotations" {
			src = pod.Annotations
		}
		out[e.Name] = src[m[2]]
	}
	return out
}

// envFromMetadata swaps a container in place when a label or annotation
// its env takes through fieldRef changed: kubelet alone never updates
// them. The change is applied over the running config, so any override
// already in force (an earlier env swap) stays. Pods opt in with
// podapi.AnnotationEnvFromMetadata, or are being updated in place by
// OpenKruise with env from metadata (kruiseEnvUpdate), whose own restart of
// the container this swap replaces (kruise.go).
type envFromMetadata struct {
	engine     Engine
	containers nodeContainers
	cache      *podCache
	writer     *podWriter
	// images says whether an image change of the container is coming: its
	// swap carries the env from metadata.
	images *imageChanges
	// requeue syncs a pod (by its watch key) again after a delay.
	requeue func(podKey string, after time.Duration)
	log     *zap.Logger
	now     func() time.Time
	ctx     func() context.Context

	mu sync.Mutex
	// swaps: the env swaps by the container they replace, for the stops of
	// that container that arrive while one runs or after it is done.
	swaps map[string]*envSwap
	// retry: the back-off of those that did not commit, by pod container.
	retry map[containerKey]*envBackoff
}

// envSwap is one env-from-metadata swap of a container.
type envSwap struct {
	id     string // the container it replaces
	key    containerKey
	podKey string // namespace/name, the pod watch's key
	digest string // envDigest of the values it sets
	at     time.Time
	done   chan struct{} // closed when the swap ended; committed is set then
	// committed: the container was replaced with the new env.
	committed bool
}

// ended reports whether the swap is over (committed is then valid).
func (s *envSwap) ended() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// envSwapKeep bounds how long a finished env swap answers later stops of
// the container it replaced (kruise-daemon acts on its own watch and may
// come after the swap).
const envSwapKeep = 10 * time.Minute

// Back-off of env-from-metadata swaps that did not commit (rolled back,
// aborted, refused), as kubelet's crash back-off: the same values are tried
// again after envRetryInitial, then twice as long each time, at most every
// envRetryMax, so that a value that makes the app crash is not swapped in
// a tight loop. Other values are tried at once. A commit, or the container
// found running with the env, ends the back-off; so does the pod's removal.
const (
	envRetryInitial = 10 * time.Second
	envRetryMax     = 5 * time.Minute
)

// envRetryDelay is the back-off after n swaps in a row of the same values
// that did not commit (n ≥ 1).
func envRetryDelay(n int) time.Duration {
	d := envRetryInitial
	for i := 1; i < n && d < envRetryMax; i++ {
		d *= 2
	}
	return min(d, envRetryMax)
}

// envBackoff is what is remembered of one pod container's env-from-metadata
// swaps that did not commit.
type envBackoff struct {
	digest   string    // envDigest of the values they set
	failures int       // swaps of those values in a row that did not commit
	until    time.Time // no new swap of those values before
}

// envAction is what a sync does about a container's env from metadata.
type envAction int

const (
	// envInPlace: the container runs with the env; no back-off is kept.
	envInPlace envAction = iota
	// envBackingOff: these values did not commit lately; the pod is synced
	// again when the back-off ends.
	envBackingOff
	// envSwapNow: swap the container with set.
	envSwapNow
	// envAwaitSwap: an env swap of the pod container runs, on an earlier
	// container of the name (overtaken by kubelet's restart or an image
	// swap); its end syncs the pod again.
	envAwaitSwap
	// envAwaitImage: a kubelet-driven image change of the container is
	// coming, and its swap carries the env from metadata as kubelet's own
	// create would: a swap now would be a second restart, and would answer
	// kubelet's stop for the image. The pod is looked at again in
	// envRetryInitial, in case the image change ends without a swap.
	envAwaitImage
	// envRaced: a concurrent sync or stop registered a swap of the
	// container meanwhile (claim, never decideEnv).
	envRaced
)

// envState is what decideEnv weighs for one container.
type envState struct {
	// want is the env the pod's metadata gives the container, have the env
	// it was created with.
	want, have map[string]string
	// backoff is that of the pod container's swaps that did not commit
	// (nil: none).
	backoff *envBackoff
	// swapRunning: an env swap of the pod container runs; imageComing: an
	// image change of the container will swap it.
	swapRunning, imageComing bool
	now                      time.Time
}

// decideEnv is what to do about a container's env from metadata: set holds
// the values that differ, and digest names them for the back-off.
func decideEnv(in envState) (act envAction, set map[string]string, digest string) {
	switch {
	case in.swapRunning:
		return envAwaitSwap, nil, ""
	case in.imageComing:
		return envAwaitImage, nil, ""
	}
	for k, v := range in.want {
		if in.have[k] != v {
			if set == nil {
				set = map[string]string{}
			}
			set[k] = v
		}
	}
	if len(set) == 0 {
		return envInPlace, nil, ""
	}
	digest = envDigest(set)
	if b := in.backoff; b != nil && b.digest == digest && in.now.Before(b.until) {
		return envBackingOff, set, digest
	}
	return envSwapNow, set, digest
}

// sync swaps the pod's running containers whose env from metadata changed,
// when the pod asks for that (envMetaCaller).
func (e *envFromMetadata) sync(pod *corev1.Pod, running map[string]*runtimeapi.Container) {
	caller, ok := envMetaCaller(pod)
	if !ok {
		return
	}
	for i := range pod.Spec.Containers {
		sc := &pod.Spec.Containers[i]
		if rc := running[sc.Name]; rc != nil {
			e.start(pod, sc, rc.Id, caller)
		}
	}
}

// envMetaCaller says whether a pod's env from metadata is swapped in
// place, and on whose behalf.
func envMetaCaller(pod *corev1.Pod) (string, bool) {
	switch {
	case pod.Annotations[podapi.AnnotationEnvFromMetadata] == "true":
		return CallerEnvFromMetadata, true
	case kruiseEnvUpdate(pod):
		return CallerKruiseEnvFromMetadata, true
	}
	return "", false
}

// start starts the swap of container id to the env pod's metadata gives
// sc when decideEnv says so; it returns the swap of that container (just
// started, running, or done), or nil.
func (e *envFromMetadata) start(pod *corev1.Pod, sc *corev1.Container, id, caller string) *envSwap {
	prev := e.swapOf(id)
	if prev != nil && (!prev.ended() || prev.committed) {
		return prev // running, or it already replaced this container
	}
	want := metadataEnv(pod, sc)
	if len(want) == 0 {
		return prev
	}
	have, known := e.containers.recordedEnv(id)
	if !known {
		return prev // not created through inplaced: its env is unknown here
	}
	key := containerKey{uid: pod.UID, name: sc.Name}
	podKey := pod.Namespace + "/" + pod.Name
	s, act, set := e.claim(id, prev, podKey, key, envState{want: want, have: have, imageComing: e.images.pending(key, id)})
	switch act {
	case envAwaitImage:
		e.requeue(podKey, envRetryInitial)
	case envSwapNow:
		if !e.launch(pod, sc, s, set, caller) {
			return prev
		}
	}
	return s
}

// claim decides under the lock what to do about container id (decideEnv,
// with the back-off and the swaps running), and registers the swap when
// it is to start now. It returns the swap a stop of the container waits
// for: the one registered now or concurrently, else prev.
func (e *envFromMetadata) claim(id string, prev *envSwap, podKey string, key containerKey, in envState) (*envSwap, envAction, map[string]string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if cur := e.swaps[id]; cur != prev {
		return cur, envRaced, nil
	}
	in.now, in.backoff, in.swapRunning = e.now(), e.retry[key], e.runningLocked(key)
	act, set, digest := decideEnv(in)
	switch act {
	case envInPlace:
		delete(e.retry, key)
	case envSwapNow:
		for k, old := range e.swaps {
			if in.now.Sub(old.at) > envSwapKeep && old.ended() {
				delete(e.swaps, k)
			}
		}
		s := &envSwap{id: id, key: key, podKey: podKey, digest: digest, at: in.now, done: make(chan struct{})}
		e.swaps[id] = s
		return s, act, set
	}
	return prev, act, set
}

// runningLocked reports whether an env swap of the pod container key runs
// (e.mu held).
func (e *envFromMetadata) runningLocked(key containerKey) bool {
	for _, s := range e.swaps {
		if s.key == key && !s.ended() {
			return true
		}
	}
	return false
}

// launch starts swap s with the engine and follows it to its end; false
// when the engine would not start it (then it ended, not committed).
func (e *envFromMetadata) launch(pod *corev1.Pod, sc *corev1.Container, s *envSwap, set map[string]string, caller string) bool {
	log := e.log.With(zap.String("pod", s.podKey), zap.String("container", sc.Name), zap.String("container_id", s.id))
	sub, err := e.engine.Start(e.ctx(), &inplacedv1.SwapRequest{
		Target: &inplacedv1.Target{ContainerId: s.id},
		Change: &inplacedv1.Change{SetEnv: set},
	}, swap.Caller{Description: caller}, swap.Hooks{})
	if err != nil {
		delay := e.ended(s, false) // a swap may hold the container: tried again after the back-off
		log.Warn("env from metadata: swap not started", zap.Duration("retry_in", delay), zap.Error(err))
		e.writer.event(pod, corev1.EventTypeWarning, podapi.EventSwapFailed, "env from metadata for container %s not applied (tried again in %s): %v", sc.Name, delay, err)
		return false
	}
	keys := make([]string, 0, len(set))
	for k := range set {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	log.Info("pod metadata behind the env changed: swapping in place", zap.Strings("env", keys), zap.String("for", caller))
	go func() {
		committed := false
		for ev := range sub.C { // Report writes its events and status
			if rec := ev.GetRecord(); rec != nil {
				committed = rec.GetState() == inplacedv1.SwapState_SWAP_STATE_COMMITTED
			}
		}
		if delay := e.ended(s, committed); !committed {
			log.Info("env-from-metadata swap did not commit: tried again after the back-off", zap.Strings("env", keys), zap.Duration("retry_in", delay))
		}
	}()
	return true
}

// ended records how env swap s ended and has its pod synced again: at once
// after a commit (the metadata may have changed meanwhile), after the
// back-off it returns otherwise. A retry needs that sync of its own:
// nothing else about the pod need change before the informer's resync.
func (e *envFromMetadata) ended(s *envSwap, committed bool) time.Duration {
	now := e.now()
	var delay time.Duration
	e.mu.Lock()
	s.committed = committed
	if committed {
		delete(e.retry, s.key)
	} else {
		for k, b := range e.retry {
			if now.Sub(b.until) > envRetryMax {
				delete(e.retry, k) // left behind by a pod removed while its swap ran
			}
		}
		b := e.retry[s.key]
		if b == nil || b.digest != s.digest {
			b = &envBackoff{digest: s.digest}
			e.retry[s.key] = b
		}
		b.failures++
		delay = envRetryDelay(b.failures)
		b.until = now.Add(delay)
	}
	e.mu.Unlock()
	close(s.done)
	e.requeue(s.podKey, delay)
	return delay
}

// forget drops what is remembered of a removed pod's env swaps: their
// back-offs, and the finished swaps (running ones end with the pod).
func (e *envFromMetadata) forget(uid types.UID) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for k := range e.retry {
		if k.uid == uid {
			delete(e.retry, k)
		}
	}
	for id, s := range e.swaps {
		if s.key.uid == uid && s.ended() {
			delete(e.swaps, id)
		}
	}
}

// swapOf is the env swap that replaces container id, running or done
// (nil: none). It only looks.
func (e *envFromMetadata) swapOf(id string) *envSwap {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.swaps[id]
}

// answerStop waits for the env swap that replaces the container a stop is
// for. A committed swap already stopped that container: the stop is
// answered, and the new container (with the new env) keeps running. A swap
// that failed lets the stop through: the restart goes the usual way.
func (e *envFromMetadata) answerStop(ctx context.Context, id string, s *envSwap) (intercept.StopDecision, error) {
	log := e.log.With(zap.String("container_id", id))
	select {
	case <-s.done:
	case <-ctx.Done():
		return intercept.StopDecision{Answered: true}, errkind.Errorf(errkind.Timeout,
			"inplaced: the in-place env swap replacing container %s is still running: %v", id, ctx.Err())
	}
	if !s.committed {
		log.Info("env-from-metadata swap did not commit: the stop goes through")
		return intercept.StopDecision{}, nil
	}
	log.Info("stop of a container an env-from-metadata swap replaced: answered, the new container runs")
	return intercept.StopDecision{Answered: true}, nil
}

func envDigest(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s=%s\x00", k, m[k])
	}
	return podapi.Digest(b.String())
}
