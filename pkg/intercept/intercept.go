// Package intercept implements inplaced's CRI interceptors: what the proxy does to
// kubelet's calls beyond forwarding them.
//
//   - Record: every RunPodSandbox and CreateContainer config is stored, and
//     dropped when its sandbox or container is removed, so that a swap can
//     rebuild a container from what kubelet asked for.
//   - Fence: kubelet's Create/Start/Stop/RemoveContainer for a container
//     name under a swap wait for the swap and are answered from its outcome;
//     StopContainer and Stop/RemovePodSandbox abort the swap and win.
//   - Mask: while a swap has the old container stopped and the new one not
//     yet proven, List/ContainerStatus/PodSandboxStatus and the event stream
//     show kubelet the old container as it was.
//   - Sticky: kubelet's later CreateContainer for a swapped name gets the
//     swap's image, env, command and args, unless the pod spec changed.
//
// Every interceptor checks whether a swap is running before it decodes
// anything, so the common path costs one mutex and a map lookup.
package intercept

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.uber.org/zap"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/pkg/fence"
	"github.com/inplaced/inplaced/pkg/kubeletview"
	"github.com/inplaced/inplaced/pkg/relay"
	"github.com/inplaced/inplaced/pkg/store"
	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

// Resizer applies UpdateContainerResources with ordering and verification
// (package resize). Optional.
type Resizer interface {
	UpdateContainerResources(ctx context.Context, req *runtimeapi.UpdateContainerResourcesRequest,
		next func(context.Context, *runtimeapi.UpdateContainerResourcesRequest) (*runtimeapi.UpdateContainerResourcesResponse, error),
	) (*runtimeapi.UpdateContainerResourcesResponse, error)
}

// Interceptors is the set of CRI interceptors.
type Interceptors struct {
	store        *store.Store
	fences       *fence.Registry
	kubelet      *kubeletview.View
	log          *zap.Logger
	fenceTimeout time.Duration
	resizer      Resizer
	holder       StopHolder
	now          func() time.Time

	mu        sync.Mutex
	handed    map[string]bool // containers a fenced CreateContainer answered with
	adoptions map[fence.Key]*Adoption
	// Counts of kubelet's calls per container name, for tests and metrics.
	counts map[string]int
}

// Options configures Interceptors.
type Options struct {
	Store  *store.Store
	Fences *fence.Registry
	// Kubelet is told kubelet's relists and inspections, and says which
	// hash kubelet is shown for a container.
	Kubelet      *kubeletview.View
	Logger       *zap.Logger
	FenceTimeout time.Duration
	Resizer      Resizer
	// StopHolder (optional, Kubernetes mode) may hold kubelet's
	// StopContainer for a pod spec image change.
	StopHolder StopHolder
}

// New returns the interceptors.
func New(o Options) (*Interceptors, error) {
	if o.Store == nil || o.Fences == nil || o.Kubelet == nil {
		return nil, errors.New("intercept.New: store, fences and the kubelet view are required")
	}
	log := o.Logger
	if log == nil {
		log = zap.NewNop()
	}
	if o.FenceTimeout <= 0 {
		o.FenceTimeout = 2 * time.Minute
	}
	return &Interceptors{store: o.Store, fences: o.Fences, kubelet: o.Kubelet, log: log, fenceTimeout: o.FenceTimeout,
		resizer: o.Resizer, holder: o.StopHolder, now: time.Now, handed: map[string]bool{},
		adoptions: map[fence.Key]*Adoption{}, counts: map[string]int{}}, nil
}

// Table returns the interceptor table for the relay.
func (i *Interceptors) Table() relay.Table {
	t := relay.Table{}
	t.Add(runtimeapi.RuntimeService_RunPodSandbox_FullMethodName, relay.Unary(i.runPodSandbox))
	t.Add(runtimeapi.RuntimeService_StopPodSandbox_FullMethodName, relay.Unary(i.stopPodSandbox))
	t.Add(runtimeapi.RuntimeService_RemovePodSandbox_FullMethodName, relay.Unary(i.removePodSandbox))
	t.Add(runtimeapi.RuntimeService_CreateContainer_FullMethodName, relay.Unary(i.createContainer))
	t.Add(runtimeapi.RuntimeService_StartContainer_FullMethodName, relay.Unary(i.startContainer))
	t.Add(runtimeapi.RuntimeService_StopContainer_FullMethodName, relay.Unary(i.stopContainer))
	t.Add(runtimeapi.RuntimeService_RemoveContainer_FullMethodName, relay.Unary(i.removeContainer))
	t.Add(runtimeapi.RuntimeService_ListContainers_FullMethodName, i.whenSwapping(relay.Unary(i.listContainers)))
	t.Add(runtimeapi.RuntimeService_ContainerStatus_FullMethodName, i.whenSwapping(relay.Unary(i.containerStatus)))
	t.Add(runtimeapi.RuntimeService_PodSandboxStatus_FullMethodName, i.whenSwapping(relay.Unary(i.podSandboxStatus)))
	if i.resizer != nil {
		t.Add(runtimeapi.RuntimeService_UpdateContainerResources_FullMethodName, relay.Unary(i.resizer.UpdateContainerResources))
	}
	return t
}

// Gates returns, per read method, when its interceptor must run: only while
// a swap has a fence up. The rest of the time the relay forwards kubelet's
// relists without decoding or copying them.
func (i *Interceptors) Gates() map[string]func() bool {
	return map[string]func() bool{
		runtimeapi.RuntimeService_ListContainers_FullMethodName:   i.active,
		runtimeapi.RuntimeService_ContainerStatus_FullMethodName:  i.active,
		runtimeapi.RuntimeService_PodSandboxStatus_FullMethodName: i.active,
	}
}

// StreamFilters returns the stream filters for the relay.
func (i *Interceptors) StreamFilters() map[string]relay.StreamFilter {
	return map[string]relay.StreamFilter{
		runtimeapi.RuntimeService_GetContainerEvents_FullMethodName: i.containerEvent,
	}
}

// whenSwapping skips decoding entirely unless a swap is running: the read
// path (kubelet relists every second) stays a byte copy.
func (i *Interceptors) whenSwapping(ic relay.Interceptor) relay.Interceptor {
	return func(ctx context.Context, req []byte, next relay.Invoker) ([]byte, error) {
		if !i.active() {
			return next(ctx, req)
		}
		return ic(ctx, req, next)
	}
}

// active reports whether the read path must be decoded: a swap runs, an
// ended swap's snapshot lingers, or a hash is presented.
func (i *Interceptors) active() bool { return i.fences.Active() || i.kubelet.Presenting() }

// Counts returns how many Create/Start/Stop/RemoveContainer calls kubelet
// made per "sandbox/name/method".
func (i *Interceptors) Counts() map[string]int {
	i.mu.Lock()
	defer i.mu.Unlock()
	out := make(map[string]int, len(i.counts))
	for k, v := range i.counts {
		out[k] = v
	}
	return out
}

func (i *Interceptors) count(key string) {
	i.mu.Lock()
	i.counts[key]++
	i.mu.Unlock()
}

// recordEvent writes an entry into the swap history (e.g. a dropped override).
func (i *Interceptors) recordEvent(rec *inplacedv1.SwapRecord) {
	if err := i.store.PutSwap(rec); err != nil {
		i.storeFailed("record event", err)
	}
}

// storeFailed logs a bookkeeping write or read that failed; kubelet's call
// goes on regardless. A store that is out of service as a whole was
// reported once by the daemon (inplacectl status): per call it is debug.
func (i *Interceptors) storeFailed(what string, err error, fields ...zap.Field) {
	fields = append(fields, zap.Error(err))
	if errors.Is(err, store.ErrUnavailable) {
		i.log.Debug(what, fields...)
		return
	}
	i.log.Error(what, fields...)
}
