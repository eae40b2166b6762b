package swap

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/pkg/store"
	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

// Revert drops a container's sticky override and swaps back to the
// configuration kubelet declared.
func (e *Engine) Revert(ctx context.Context, req *inplacedv1.RevertRequest, caller Caller) (*Subscription, error) {
	if err := e.checkReady(); err != nil {
		return nil, err
	}
	t, err := e.resolve(ctx, req.GetTarget())
	if err != nil {
		return nil, err
	}
	change, err := e.revertChange(t)
	if err != nil {
		return nil, err
	}
	return e.begin(ctx, t, KindRevert, change, &inplacedv1.SwapRequest{Options: req.GetOptions()}, caller, Hooks{})
}

// revertChange is the change back to what kubelet declared for t, kept with
// its override.
func (e *Engine) revertChange(t *target) (*inplacedv1.Change, error) {
	o, err := e.store.Override(t.container.PodSandboxId, t.name)
	if errors.Is(err, store.ErrNotFound) {
		return nil, refusedf("container %q of pod %s/%s has no override: it already runs what kubelet declared",
			t.name, t.container.Labels[LabelPodNamespace], t.container.Labels[LabelPodName])
	}
	if err != nil {
		return nil, err
	}
	declared := &runtimeapi.CreateContainerRequest{}
	if err := proto.Unmarshal(o.Declared, declared); err != nil || declared.Config == nil {
		return nil, refusedf("override of %q has no declared config to go back to: recreate the pod", t.name)
	}
	c := declaredChange(declared.Config)
	replaceEnv(t.request.Config, c)
	return c, nil
}

// declaredChange is the change that turns any swapped config back into cfg.
func declaredChange(cfg *runtimeapi.ContainerConfig) *inplacedv1.Change {
	img := cfg.GetImage().GetUserSpecifiedImage()
	if img == "" {
		img = cfg.GetImage().GetImage()
	}
	c := &inplacedv1.Change{Image: &img, SetCommand: true, Command: cfg.Command, SetArgs: true, Args: cfg.Args,
		SetEnv: map[string]string{}}
	for _, kv := range cfg.Envs {
		c.SetEnv[kv.Key] = string(kv.Value)
	}
	return c
}

// replaceEnv marks a change as replacing the whole environment: used by
// revert, where variables the swap added must go.
func replaceEnv(cfg *runtimeapi.ContainerConfig, c *inplacedv1.Change) {
	if c.SetEnv == nil {
		return
	}
	for _, kv := range cfg.Envs {
		if _, ok := c.SetEnv[kv.Key]; !ok {
			c.UnsetEnv = append(c.UnsetEnv, kv.Key)
		}
	}
}

// List returns swap history, optionally only for one target.
func (e *Engine) List(ctx context.Context, t *inplacedv1.Target) ([]*inplacedv1.SwapRecord, error) {
	all, err := e.store.Swaps()
	if err != nil {
		return nil, fmt.Errorf("read swap history: %w", err)
	}
	all = append(all, e.running(all)...)
	if t == nil || (t.Pod == "" && t.ContainerId == "" && t.Container == "") {
		return all, nil
	}
	var out []*inplacedv1.SwapRecord
	for _, r := range all {
		if matches(r, t) {
			out = append(out, r)
		}
	}
	return out, nil
}

func matches(r *inplacedv1.SwapRecord, t *inplacedv1.Target) bool {
	if t.ContainerId != "" {
		for _, id := range []string{r.OldContainerId, r.NewContainerId, r.RunningContainerId} {
			if id != "" && len(id) >= len(t.ContainerId) && id[:len(t.ContainerId)] == t.ContainerId {
				return true
			}
		}
		return false
	}
	return (t.Namespace == "" || t.Namespace == r.Namespace) && (t.Pod == "" || t.Pod == r.Pod) && (t.Container == "" || t.Container == r.Container)
}

// running returns the records of swaps still under way that the history
// does not have yet (a kubelet-driven swap's pull, say), oldest first.
func (e *Engine) running(history []*inplacedv1.SwapRecord) []*inplacedv1.SwapRecord {
	have := make(map[string]bool, len(history))
	for _, r := range history {
		have[r.Id] = true
	}
	e.mu.Lock()
	var out []*inplacedv1.SwapRecord
	for id, r := range e.runs {
		if rec := r.record(); !have[id] && rec != nil {
			out = append(out, rec)
		}
	}
	e.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Id < out[j].Id })
	return out
}
