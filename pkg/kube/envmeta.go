package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strings"
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

// OpenKruise's in-place update contract (its apis/apps/pub/inplace_update.go).
const (
	// KruiseInPlaceUpdateReady is the readiness gate condition OpenKruise
	// sets False before an in-place update and True when it is complete.
	KruiseInPlaceUpdateReady corev1.PodConditionType = "InPlaceUpdateReady"
	// KruiseInPlaceUpdateState is the annotation with the update's state
	// (JSON); KruiseInPlaceUpdateStateOld is its older name, still read.
	KruiseInPlaceUpdateState    = "apps.kruise.io/inplace-update-state"
	KruiseInPlaceUpdateStateOld = "inplace-update-state"
)

// kruiseEnvUpdate reports whether OpenKruise is updating the pod in place
// with env from metadata: its InPlaceUpdateReady condition is False and its
// update state asks for env from metadata. Then kruise-daemon restarts the
// containers whose env from metadata differs, by a CRI stop.
func kruiseEnvUpdate(pod *corev1.Pod) bool {
	updating := false
	for _, cond := range pod.Status.Conditions {
		if cond.Type == KruiseInPlaceUpdateReady {
			updating = cond.Status == corev1.ConditionFalse
		}
	}
	if !updating {
		return false
	}
	raw, ok := pod.Annotations[KruiseInPlaceUpdateState]
	if !ok {
		raw = pod.Annotations[KruiseInPlaceUpdateStateOld]
	}
	var state struct {
		UpdateEnvFromMetadata bool `json:"updateEnvFromMetadata"`
	}
	return json.Unmarshal([]byte(raw), &state) == nil && state.UpdateEnvFromMetadata
}

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

// syncEnvFromMetadata swaps a container in place when a label or annotation
// its env takes through fieldRef changed: kubelet alone never updates them.
// The change is applied over the running config, so any override already
// in force (an earlier env swap) stays. Pods opt in with
// podapi.AnnotationEnvFromMetadata, or are being updated in place by OpenKruise
// with env from metadata (kruiseEnvUpdate), whose own restart of the
// container this swap replaces.
func (c *Controller) syncEnvFromMetadata(pod *corev1.Pod, running map[string]*runtimeapi.Container) {
	caller, ok := envMetaCaller(pod)
	if !ok {
		return
	}
	for i := range pod.Spec.Containers {
		sc := &pod.Spec.Containers[i]
		if rc := running[sc.Name]; rc != nil {
			c.startEnvSwap(pod, sc, rc.Id, caller)
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

// envSwap is one env-from-metadata swap of a container, for the stops of
// that container that arrive while it runs or after it is done.
type envSwap struct {
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
)

// decideEnv is what to do about a container whose env from metadata is
// want and whose recorded env is have, given the back-off of its swaps
// that did not commit (nil: none): set holds the values that differ, and
// digest names them for the back-off.
func decideEnv(want, have map[string]string, b *envBackoff, now time.Time) (act envAction, set map[string]string, digest string) {
	for k, v := range want {
		if have[k] != v {
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
	if b != nil && b.digest == digest && now.Before(b.until) {
		return envBackingOff, set, digest
	}
	return envSwapNow, set, digest
}

// startEnvSwap starts the swap of container id to the env pod's metadata
// gives sc, unless that env already runs, a swap of the pod's container
// runs, or these values are backing off; it returns the swap of that
// container (just started, running, or done), or nil.
func (c *Controller) startEnvSwap(pod *corev1.Pod, sc *corev1.Container, id, caller string) *envSwap {
	c.mu.Lock()
	prev := c.envSwaps[id]
	c.mu.Unlock()
	if prev != nil && (!prev.ended() || prev.committed) {
		return prev // running, or it already replaced this container
	}
	want := metadataEnv(pod, sc)
	if len(want) == 0 {
		return prev
	}
	req, err := c.store.Container(id)
	if err != nil || req.GetConfig() == nil {
		return prev // not created through inplaced: its env is unknown here
	}
	have := map[string]string{}
	for _, kv := range req.Config.Envs {
		have[kv.Key] = string(kv.Value)
	}
	key := containerKey{uid: pod.UID, name: sc.Name}
	now := c.now()
	c.mu.Lock()
	if cur := c.envSwaps[id]; cur != prev {
		c.mu.Unlock()
		return cur // a concurrent sync or stop got there first
	}
	if c.envRunning(key) {
		// On an earlier container of the name (overtaken by kubelet's
		// restart or an image swap): its end syncs the pod again.
		c.mu.Unlock()
		return prev
	}
	if c.imageChangePending(key, id) {
		// Its swap carries the env from metadata, as kubelet's own create
		// would: a swap now would be a second restart, and would answer
		// kubelet's stop for the image. Looked at again in a while, in
		// case the image change ends without a swap.
		requeue := c.requeue
		c.mu.Unlock()
		if requeue != nil {
			requeue(pod.Namespace+"/"+pod.Name, envRetryInitial)
		}
		return prev
	}
	act, set, digest := decideEnv(want, have, c.envRetry[key], now)
	if act != envSwapNow {
		if act == envInPlace {
			delete(c.envRetry, key)
		}
		c.mu.Unlock()
		return prev
	}
	s := &envSwap{key: key, podKey: pod.Namespace + "/" + pod.Name, digest: digest, at: now, done: make(chan struct{})}
	if c.envSwaps == nil {
		c.envSwaps = map[string]*envSwap{}
	}
	for k, old := range c.envSwaps {
		if now.Sub(old.at) > envSwapKeep && old.ended() {
			delete(c.envSwaps, k)
		}
	}
	c.envSwaps[id] = s
	c.mu.Unlock()

	log := c.log.With(zap.String("pod", pod.Namespace+"/"+pod.Name), zap.String("container", sc.Name), zap.String("container_id", id))
	sub, err := c.engine.Start(c.ctx, &inplacedv1.SwapRequest{
		Target: &inplacedv1.Target{ContainerId: id},
		Change: &inplacedv1.Change{SetEnv: set},
	}, swap.Caller{Description: caller}, swap.Hooks{})
	if err != nil {
		delay := c.envSwapEnded(s, false) // a swap may hold the container: tried again after the back-off
		log.Warn("env from metadata: swap not started", zap.Duration("retry_in", delay), zap.Error(err))
		c.event(pod, corev1.EventTypeWarning, podapi.EventSwapFailed, "env from metadata for container %s not applied (tried again in %s): %v", sc.Name, delay, err)
		return prev
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
		if delay := c.envSwapEnded(s, committed); !committed {
			log.Info("env-from-metadata swap did not commit: tried again after the back-off", zap.Strings("env", keys), zap.Duration("retry_in", delay))
		}
	}()
	return s
}

// envRunning reports whether an env swap of the pod container key runs.
// c.mu is held.
func (c *Controller) envRunning(key containerKey) bool {
	for _, s := range c.envSwaps {
		if s.key == key && !s.ended() {
			return true
		}
	}
	return false
}

// imageChangePending reports whether a kubelet-driven image change of
// container id (pod container key) is pending or running, short of a
// failed pull. c.mu is held.
func (c *Controller) imageChangePending(key containerKey, id string) bool {
	ch := c.changes[key]
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

// envSwapEnded records how env swap s ended and has its pod synced again:
// at once after a commit (the metadata may have changed meanwhile), after
// the back-off it returns otherwise. A retry needs that sync of its own:
// nothing else about the pod need change before the informer's resync.
func (c *Controller) envSwapEnded(s *envSwap, committed bool) time.Duration {
	now := c.now()
	var delay time.Duration
	c.mu.Lock()
	s.committed = committed
	if committed {
		delete(c.envRetry, s.key)
	} else {
		if c.envRetry == nil {
			c.envRetry = map[containerKey]*envBackoff{}
		}
		for k, b := range c.envRetry {
			if now.Sub(b.until) > envRetryMax {
				delete(c.envRetry, k) // left behind by a pod removed while its swap ran
			}
		}
		b := c.envRetry[s.key]
		if b == nil || b.digest != s.digest {
			b = &envBackoff{digest: s.digest}
			c.envRetry[s.key] = b
		}
		b.failures++
		delay = envRetryDelay(b.failures)
		b.until = now.Add(delay)
	}
	requeue := c.requeue
	c.mu.Unlock()
	close(s.done)
	if requeue != nil {
		requeue(s.podKey, delay)
	}
	return delay
}

// forgetEnv drops what is remembered of a removed pod's env swaps: their
// back-offs, and the finished swaps (running ones end with the pod).
func (c *Controller) forgetEnv(uid types.UID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k := range c.envRetry {
		if k.uid == uid {
			delete(c.envRetry, k)
		}
	}
	for id, s := range c.envSwaps {
		if s.key.uid == uid && s.ended() {
			delete(c.envSwaps, id)
		}
	}
}

// envSwapFor returns the env-from-metadata swap that replaces container
// id, for a stop of it: the one running or done, or — when OpenKruise is
// updating the pod's env from metadata and the cached pod asks for env the
// container lacks — one started now. kruise-daemon's stop of the container
// is how OpenKruise restarts it for the new env; it may come before the
// watch delivered kruise's change to inplaced. Only local state is read.
func (c *Controller) envSwapFor(ctx context.Context, id string) *envSwap {
	c.mu.Lock()
	s, lister := c.envSwaps[id], c.lister
	c.mu.Unlock()
	if s != nil || lister == nil {
		return s
	}
	pc, _, ok := c.podContainerOf(ctx, id)
	if !ok {
		return nil
	}
	pod, sc := c.cachedSpec(lister, pc.ns, pc.pod, pc.uid, pc.name)
	if sc == nil || !kruiseEnvUpdate(pod) {
		return nil
	}
	return c.startEnvSwap(pod, sc, id, CallerKruiseEnvFromMetadata)
}

// holdForEnvSwap waits for the env swap that replaces the container a stop
// is for. A committed swap already stopped that container: the stop is
// answered, and the new container (with the new env) keeps running. A swap
// that failed lets the stop through: the restart goes the usual way.
func (c *Controller) holdForEnvSwap(ctx context.Context, id string, s *envSwap) (intercept.StopDecision, error) {
	log := c.log.With(zap.String("container_id", id))
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
