package kube

import (
	"fmt"
	"regexp"
	"sort"
	"strings"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/pkg/swap"
	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

// CallerEnvFromMetadata describes who asked for an env-from-metadata swap.
const CallerEnvFromMetadata = "pod metadata (" + AnnotationEnvFromMetadata + ")"

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

// syncEnvFromMetadata swaps a container in place when a label or annotation
// its env takes through fieldRef changed: kubelet alone never updates them.
// The change is applied over the running config, so any override already
// in force (an earlier env swap) stays.
func (c *Controller) syncEnvFromMetadata(pod *corev1.Pod, running map[string]*runtimeapi.Container) {
	if pod.Annotations[AnnotationEnvFromMetadata] != "true" {
		return
	}
	for i := range pod.Spec.Containers {
		sc := &pod.Spec.Containers[i]
		want := metadataEnv(pod, sc)
		rc := running[sc.Name]
		if len(want) == 0 || rc == nil {
			continue
		}
		req, err := c.store.Container(rc.Id)
		if err != nil || req.GetConfig() == nil {
			continue // not created through inplaced: its env is unknown here
		}
		have := map[string]string{}
		for _, kv := range req.Config.Envs {
			have[kv.Key] = string(kv.Value)
		}
		set := map[string]string{}
		for k, v := range want {
			if have[k] != v {
				set[k] = v
			}
		}
		if len(set) == 0 {
			continue
		}
		key := fmt.Sprintf("%s/%s/%s", pod.UID, sc.Name, envDigest(set))
		c.mu.Lock()
		seen := c.envSeen[key]
		c.envSeen[key] = true
		c.mu.Unlock()
		if seen {
			continue // tried these values on this container already
		}
		log := c.log.With(zap.String("pod", pod.Namespace+"/"+pod.Name), zap.String("container", sc.Name))
		sub, err := c.engine.StartWithHooks(c.ctx, &inplacedv1.SwapRequest{
			Target: &inplacedv1.Target{ContainerId: rc.Id},
			Change: &inplacedv1.Change{SetEnv: set},
		}, swap.Caller{Description: CallerEnvFromMetadata}, swap.Hooks{})
		if err != nil {
			c.mu.Lock()
			delete(c.envSeen, key) // the next sync tries again (a swap may have held the container)
			c.mu.Unlock()
			log.Warn("env from metadata: swap not started", zap.Error(err))
			c.event(pod, corev1.EventTypeWarning, EventSwapFailed, "env from metadata for container %s not applied: %v", sc.Name, err)
			continue
		}
		keys := make([]string, 0, len(set))
		for k := range set {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		log.Info("pod metadata behind the env changed: swapping in place", zap.Strings("env", keys))
		go drain(sub) // Report writes its events and status
	}
}

// drain reads a subscription to its end.
func drain(sub *swap.Subscription) {
	for range sub.C {
	}
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
	return Digest(b.String())
}
