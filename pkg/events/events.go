// Package events fans out what inplaced does — swaps and their steps,
// resizes, overrides set and dropped, calls waiting on a swap's fence — to
// the control API's Watch streams. Publishing never blocks: a subscriber
// that does not keep up loses events (and is told so), never a swap.
package events

import (
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/inplaced/inplaced/pkg/fence"
	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

// Event kinds.
const (
	KindSwapStarted     = "swap-started"
	KindStepStarted     = "step-started"
	KindStepDone        = "step-done"
	KindStepFailed      = "step-failed"
	KindSwapEnded       = "swap-ended"
	KindResize          = "resize"
	KindOverrideSet     = "override-set"
	KindOverrideDropped = "override-dropped"
	KindFenceWait       = "fence-wait"
	KindFenceWaitDone   = "fence-wait-done"
	KindRecovered       = "recovered"
	KindLost            = "events-lost"
)

// subBuffer is how many events a slow subscriber may fall behind.
const subBuffer = 1024

// Filter selects events by pod; empty fields match everything.
type Filter struct{ Namespace, Pod string }

func (f Filter) match(ev *inplacedv1.Event) bool {
	return (f.Namespace == "" || f.Namespace == ev.Namespace) && (f.Pod == "" || f.Pod == ev.Pod)
}

type sub struct {
	f    Filter
	c    chan *inplacedv1.Event
	lost bool
}

type where struct{ namespace, pod, container string }

// Hub is the fan-out. The zero value is not usable: call New.
type Hub struct {
	now func() time.Time

	mu    sync.Mutex
	subs  map[*sub]struct{}
	swaps map[string]where // running swaps, to name the pod of a fence wait
}

// New returns a hub.
func New() *Hub {
	return &Hub{now: time.Now, subs: map[*sub]struct{}{}, swaps: map[string]where{}}
}

// Subscribe returns a channel of the events that match f from now on, and
// a function that ends the subscription (and closes the channel).
func (h *Hub) Subscribe(f Filter) (<-chan *inplacedv1.Event, func()) {
	s := &sub{f: f, c: make(chan *inplacedv1.Event, subBuffer)}
	h.mu.Lock()
	h.subs[s] = struct{}{}
	h.mu.Unlock()
	var once sync.Once
	return s.c, func() {
		once.Do(func() {
			h.mu.Lock()
			delete(h.subs, s)
			h.mu.Unlock()
			close(s.c)
		})
	}
}

func (h *Hub) publish(ev *inplacedv1.Event) {
	ev.TimeUnixNano = h.now().UnixNano()
	h.mu.Lock()
	defer h.mu.Unlock()
	for s := range h.subs {
		if !s.f.match(ev) {
			continue
		}
		if s.lost {
			select {
			case s.c <- &inplacedv1.Event{Kind: KindLost, TimeUnixNano: ev.TimeUnixNano, Message: "this watcher fell behind: events were dropped"}:
				s.lost = false
			default:
				continue
			}
		}
		select {
		case s.c <- ev:
		default:
			s.lost = true
		}
	}
}

func swapEvent(kind string, rec *inplacedv1.SwapRecord) *inplacedv1.Event {
	return &inplacedv1.Event{Kind: kind, Namespace: rec.Namespace, Pod: rec.Pod, Container: rec.Container,
		SwapId: rec.Id, ContainerId: rec.OldContainerId}
}

// SwapStarted implements swap.Observer.
func (h *Hub) SwapStarted(rec *inplacedv1.SwapRecord) {
	h.mu.Lock()
	h.swaps[rec.Id] = where{rec.Namespace, rec.Pod, rec.Container}
	h.mu.Unlock()
	ev := swapEvent(KindSwapStarted, rec)
	ev.Message = fmt.Sprintf("%s by %s", rec.Kind, rec.Caller.Summary())
	h.publish(ev)
}

// StepStarted implements swap.Observer.
func (h *Hub) StepStarted(rec *inplacedv1.SwapRecord, step string) {
	ev := swapEvent(KindStepStarted, rec)
	ev.Step = step
	h.publish(ev)
}

// StepEnded implements swap.Observer.
func (h *Hub) StepEnded(rec *inplacedv1.SwapRecord, st *inplacedv1.Step) {
	ev := swapEvent(KindStepDone, rec)
	ev.Step = st.Name
	ev.Message = "done in " + time.Duration(st.DurationNs).Round(time.Millisecond).String()
	if st.Error != "" {
		ev.Kind, ev.Message = KindStepFailed, st.Error
	}
	h.publish(ev)
}

// SwapEnded implements swap.Observer.
func (h *Hub) SwapEnded(rec *inplacedv1.SwapRecord) {
	h.mu.Lock()
	delete(h.swaps, rec.Id)
	h.mu.Unlock()
	ev := swapEvent(KindSwapEnded, rec)
	ev.State = strings.TrimPrefix(rec.State.String(), "SWAP_STATE_")
	ev.ContainerId = rec.RunningContainerId
	ev.Message = fmt.Sprintf("%s → %s, downtime %s", rec.From.GetImage(), rec.To.GetImage(), time.Duration(rec.DowntimeNs).Round(time.Millisecond))
	if rec.Error != "" {
		ev.Message += ": " + rec.Error
	}
	h.publish(ev)
}

// OverrideChanged implements swap.Observer.
func (h *Hub) OverrideChanged(rec *inplacedv1.SwapRecord, set bool) {
	ev := swapEvent(KindOverrideDropped, rec)
	ev.Message = "the container runs what the pod spec declares again"
	if set {
		ev.Kind, ev.Message = KindOverrideSet, "kubelet's next create of this container gets the swapped config"
	}
	h.publish(ev)
}

// Recovered implements swap.Observer.
func (h *Hub) Recovered(swapID string, err error) {
	ev := &inplacedv1.Event{Kind: KindRecovered, SwapId: swapID, Message: "journaled swap settled after a restart"}
	if err != nil {
		ev.Message = "recovery failed: " + err.Error()
	}
	h.publish(ev)
}

// Resized reports a resize record (control API or kubelet's
// UpdateContainerResources).
func (h *Hub) Resized(rec *inplacedv1.ResizeRecord) {
	to := rec.To
	if to == nil {
		to = rec.Requested // kubelet's resize of a sandbox: kubelet sets the pod cgroup itself
	}
	msg := fmt.Sprintf("cpu quota %d/%d, memory %d via %s in %s", to.GetCpuQuota(), to.GetCpuPeriod(),
		to.GetMemoryLimitBytes(), rec.Method, time.Duration(rec.DurationNs).Round(time.Millisecond))
	if rec.Enforced != "" {
		msg += fmt.Sprintf("; enforced %s, by %s; verified: %s", rec.Enforced, rec.EnforcedBy, rec.Verified)
	}
	if rec.Error != "" {
		msg += ": " + rec.Error
	}
	h.publish(&inplacedv1.Event{Kind: KindResize, Namespace: rec.Namespace, Pod: rec.Pod, Container: rec.Container,
		ContainerId: rec.ContainerId, ResizeId: rec.Id, State: rec.Result, Message: msg})
}

func (h *Hub) fenceEvent(kind string, f *fence.Fence) *inplacedv1.Event {
	h.mu.Lock()
	w := h.swaps[f.SwapID]
	h.mu.Unlock()
	return &inplacedv1.Event{Kind: kind, Namespace: w.namespace, Pod: w.pod, Container: f.Key.Name, SwapId: f.SwapID}
}

// WaitStarted implements fence.WaitObserver.
func (h *Hub) WaitStarted(f *fence.Fence) {
	ev := h.fenceEvent(KindFenceWait, f)
	ev.Message = "a kubelet call waits for the swap to end"
	h.publish(ev)
}

// WaitEnded implements fence.WaitObserver.
func (h *Hub) WaitEnded(f *fence.Fence, waited time.Duration) {
	ev := h.fenceEvent(KindFenceWaitDone, f)
	ev.Message = "waited " + waited.Round(time.Millisecond).String()
	h.publish(ev)
}
