// Package fence keeps swaps and kubelet out of each other's way.
//
// A Fence is taken by the swap engine for one container name in one sandbox
// for the whole swap. It serializes swaps on that container, lets the CRI
// interceptors make kubelet's calls for that name wait for the swap to end,
// carries the snapshot of the old container that kubelet is shown while the
// swap has it stopped (the mask), and lets a pod deletion or kubelet's own
// StopContainer abort the swap.
package fence

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// ErrBusy is returned when another swap has already taken the fence.
var ErrBusy = errors.New("a swap is already running on this container")

// Key names a container of a pod: sandbox ID and container name.
type Key struct {
	SandboxID string
	Name      string
}

func (k Key) String() string { return k.SandboxID + "/" + k.Name }

// Outcome is how a swap ended, for callers that waited on it.
type Outcome struct {
	// RunningID is the container that runs under the name now ("" if none).
	RunningID string
	Committed bool
}

// Fence is one swap's claim on a container name: while it stands, kubelet's
// calls for the name wait for the swap (see the package documentation).
type Fence struct {
	Key    Key
	SwapID string

	cancel context.CancelCauseFunc
	done   chan struct{}

	mu        sync.Mutex
	oldID     string
	oldStatus *runtimeapi.ContainerStatus // as it was before the swap stopped it
	oldEntry  *runtimeapi.Container
	hidden    map[string]bool // containers of the swap kubelet must not see yet
	masking   bool
	// replaceOld: kubelet is shown the old container's snapshot instead of
	// the truth (from its stop on); before that only the swap's new
	// containers are hidden.
	replaceOld bool
	outcome    Outcome
	obs        WaitObserver
	linger     bool // LingerOnRelease
}

// WaitObserver sees calls waiting on a fence (metrics, the control API's
// Watch). It must not block.
type WaitObserver interface {
	WaitStarted(f *Fence)
	WaitEnded(f *Fence, waited time.Duration)
}

// Registry keeps the fences of running swaps.
type Registry struct {
	mu     sync.Mutex
	fences map[Key]*Fence
	byID   map[string]*Fence // old and hidden container IDs → fence
	obs    WaitObserver
	// lingers: old container ID → its snapshot, after its swap (linger.go).
	lingers map[string]*lingering
}

// SetWaitObserver installs o for every fence acquired after; call it
// before serving.
func (r *Registry) SetWaitObserver(o WaitObserver) { r.obs = o }

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{fences: map[Key]*Fence{}, byID: map[string]*Fence{}}
}

// Acquire takes the fence for key. The returned context is cancelled when
// the swap is aborted (Abort); its cause says why.
func (r *Registry) Acquire(ctx context.Context, key Key, swapID, oldID string) (*Fence, context.Context, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if f, ok := r.fences[key]; ok {
		return nil, nil, fmt.Errorf("%w: swap %s on %s", ErrBusy, f.SwapID, key)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	f := &Fence{Key: key, SwapID: swapID, cancel: cancel, done: make(chan struct{}), oldID: oldID, hidden: map[string]bool{}, obs: r.obs}
	r.fences[key] = f
	r.byID[oldID] = f
	return f, ctx, nil
}

// Release ends the fence with its outcome and wakes every waiter.
func (r *Registry) Release(f *Fence, out Outcome) {
	r.mu.Lock()
	if r.fences[f.Key] == f {
		delete(r.fences, f.Key)
	}
	for id, g := range r.byID {
		if g == f {
			delete(r.byID, id)
		}
	}
	r.startLinger(f, out, time.Now())
	r.mu.Unlock()
	f.mu.Lock()
	f.outcome = out
	f.masking, f.replaceOld = false, false
	f.mu.Unlock()
	f.cancel(nil)
	close(f.done)
}

// Lookup returns the fence on key, if a swap has taken it.
func (r *Registry) Lookup(key Key) *Fence {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.fences[key]
}

// ByContainer returns the fence whose swap involves container id.
func (r *Registry) ByContainer(id string) *Fence {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.byID[id]
}

// BySandbox returns the fences of swaps in a sandbox.
func (r *Registry) BySandbox(sandboxID string) []*Fence {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*Fence
	for k, f := range r.fences {
		if k.SandboxID == sandboxID {
			out = append(out, f)
		}
	}
	return out
}

// Active reports whether any swap is running or an ended swap's snapshot
// lingers; interceptors use it (with kubeletview's Presenting) to skip all
// work on the hot path otherwise.
func (r *Registry) Active() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.fences) > 0 || (len(r.lingers) > 0 && r.lingersLocked(time.Now()))
}

// Abort cancels the swap with cause.
func (f *Fence) Abort(cause error) { f.cancel(cause) }

// Done is closed when the swap has ended.
func (f *Fence) Done() <-chan struct{} { return f.done }

// Outcome is valid once Done is closed.
func (f *Fence) Outcome() Outcome {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.outcome
}

// Wait blocks until the swap ends or ctx ends.
func (f *Fence) Wait(ctx context.Context) (Outcome, error) {
	if f.obs != nil {
		start := time.Now()
		f.obs.WaitStarted(f)
		defer func() { f.obs.WaitEnded(f, time.Since(start)) }()
	}
	select {
	case <-f.done:
		return f.Outcome(), nil
	case <-ctx.Done():
		return Outcome{}, ctx.Err()
	}
}

// Mask starts showing kubelet the old container as it was (status and list
// entry taken before it was stopped).
func (f *Fence) Mask(r *Registry, status *runtimeapi.ContainerStatus, entry *runtimeapi.Container) {
	f.mu.Lock()
	f.oldStatus, f.oldEntry, f.masking, f.replaceOld = status, entry, true, true
	f.mu.Unlock()
}

// MaskNew starts hiding the containers the swap creates (any container of
// the name created after the old one) while the old container is still
// shown as it really is: used while it still runs (pre-created new
// container, preStop). Mask later adds the old container's snapshot.
func (f *Fence) MaskNew(r *Registry, status *runtimeapi.ContainerStatus, entry *runtimeapi.Container) {
	f.mu.Lock()
	f.oldStatus, f.oldEntry, f.masking = status, entry, true
	f.mu.Unlock()
}

// Hide keeps a container created by the swap out of kubelet's view while
// the mask is on.
func (f *Fence) Hide(r *Registry, id string) {
	f.mu.Lock()
	f.hidden[id] = true
	f.mu.Unlock()
	r.mu.Lock()
	if r.fences[f.Key] == f {
		r.byID[id] = f
	}
	r.mu.Unlock()
}

// Unmask lets kubelet see the truth again.
func (f *Fence) Unmask() {
	f.mu.Lock()
	f.masking, f.replaceOld = false, false
	f.mu.Unlock()
}

// View is what the interceptors need to rewrite kubelet's view.
type View struct {
	Masking bool
	// ReplaceOld: show OldStatus/OldEntry instead of the old container's truth.
	ReplaceOld bool
	OldID      string
	OldStatus  *runtimeapi.ContainerStatus
	OldEntry   *runtimeapi.Container
	Hidden     map[string]bool
}

// View returns a snapshot of the mask.
func (f *Fence) View() View {
	f.mu.Lock()
	defer f.mu.Unlock()
	h := make(map[string]bool, len(f.hidden))
	for k, v := range f.hidden {
		h[k] = v
	}
	return View{Masking: f.masking, ReplaceOld: f.replaceOld, OldID: f.oldID, OldStatus: f.oldStatus, OldEntry: f.oldEntry, Hidden: h}
}

// All returns the fences of every running swap.
func (r *Registry) All() []*Fence {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*Fence, 0, len(r.fences))
	for _, f := range r.fences {
		out = append(out, f)
	}
	return out
}
