package intercept

import (
	"context"
	"fmt"
	"strings"
	"time"

	"go.uber.org/zap"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/pkg/fence"
	"github.com/inplaced/inplaced/pkg/swap"
)

// StopHolder may answer kubelet's StopContainer before it is forwarded:
// package kube does, for a container an in-place swap replaces (a pod spec
// image change, new env from metadata), with that swap instead of the stop.
type StopHolder interface {
	// SwapInsteadOfStop carries out or waits for the in-place swap that
	// replaces the container, if any, and says whether the stop is
	// answered.
	SwapInsteadOfStop(ctx context.Context, req *runtimeapi.StopContainerRequest) (StopDecision, error)
}

// StopDecision is what a StopHolder made of kubelet's StopContainer.
type StopDecision struct {
	// Answered: the holder answered the call (with the error it returned,
	// or success); it is not forwarded.
	Answered bool
	// Adopt, when set, is the container kubelet's coming CreateContainer
	// for the name is answered with.
	Adopt *Adoption
}

// Adoption is a container a kubelet-driven swap made for kubelet.
type Adoption struct {
	SwapID      string
	ContainerID string
	Request     *runtimeapi.CreateContainerRequest
	// Discard stops and removes the container when kubelet's config turns
	// out to differ and inplaced steps aside.
	Discard func(ctx context.Context) error
	// Handoff records what became of kubelet's calls in the swap record.
	Handoff func(text string, adopted bool)
	at      time.Time
}

// adoptionTTL bounds how long a prepared container waits for kubelet's
// CreateContainer: kubelet creates it right after its StopContainer
// returns, in the same sync. Past that, kubelet's relist finds the running
// container with the spec's hash and keeps it anyway.
const adoptionTTL = 2 * time.Minute

func (i *Interceptors) offerAdoption(a *Adoption) {
	key := fence.Key{SandboxID: a.Request.PodSandboxId, Name: a.Request.GetConfig().GetMetadata().GetName()}
	a.at = i.now()
	i.mu.Lock()
	i.adoptions[key] = a
	i.mu.Unlock()
}

func (i *Interceptors) takeAdoption(key fence.Key) *Adoption {
	i.mu.Lock()
	defer i.mu.Unlock()
	a := i.adoptions[key]
	if a == nil {
		return nil
	}
	delete(i.adoptions, key)
	if i.now().Sub(a.at) > adoptionTTL {
		return nil
	}
	return a
}

// adopt answers kubelet's CreateContainer with the prepared container when
// kubelet asks for what was prepared; otherwise it discards the prepared one
// and lets kubelet's own create through (ok false).
func (i *Interceptors) adopt(ctx context.Context, a *Adoption, req *runtimeapi.CreateContainerRequest) (id string, ok bool) {
	log := i.log.With(zap.String("swap_id", a.SwapID), zap.String("container_id", a.ContainerID))
	diff := swap.ConfigDiff(req.GetConfig(), a.Request.GetConfig())
	if len(diff) == 0 {
		i.mu.Lock()
		i.handed[a.ContainerID] = true
		i.mu.Unlock()
		log.Info("answered kubelet's CreateContainer with the kubelet-driven swap's container")
		a.Handoff("adopted: kubelet's PullImage/CreateContainer/StartContainer were answered with the new container", true)
		return a.ContainerID, true
	}
	log.Warn("kubelet's config differs from the prepared container: stepping aside", zap.Strings("fields", diff))
	if err := a.Discard(ctx); err != nil {
		log.Error("discard the prepared container", zap.Error(err))
		a.Handoff(fmt.Sprintf("stepped aside: kubelet's config differs in %s; discarding the prepared container failed: %v", strings.Join(diff, ", "), err), false)
		return "", false
	}
	a.Handoff(fmt.Sprintf("stepped aside: kubelet's config differs in %s; the prepared container was removed and kubelet's own create went through", strings.Join(diff, ", ")), false)
	return "", false
}
