// Package kubeletview keeps what inplaced observes of kubelet through the
// CRI calls it relays, for the code that must time its work against
// kubelet's: its relists (ListContainers without a filter: PLEG's, every
// second), and for a container whose hash is presented, the hash kubelet
// is shown and whether kubelet has inspected it since (a ContainerStatus
// answered with it).
//
// package intercept reports what kubelet does (Relisted, Inspected) and
// rewrites the answers (PresentedHash); package swap presents a hash for a
// new container (PresentHash, EndPresent); package kube waits on kubelet
// (WhenInspected, NextRelist, FirstRelistAfter) to hand an image over to the
// pod spec without a kubelet restart (its specpatch.go says why).
package kubeletview

import (
	"sync"
	"time"
)

// View is what inplaced has seen of kubelet. The zero value is not usable:
// use New.
type View struct {
	mu sync.Mutex
	// presented: container ID → the hash kubelet is shown.
	presented     map[string]*presentation
	relistWaiters []chan struct{}
	relists       []time.Time // the last unfiltered ListContainers
}

// New returns an empty view.
func New() *View { return &View{presented: map[string]*presentation{}} }

// Presenting reports whether a hash is presented for any container: the
// read interceptors must then run.
func (v *View) Presenting() bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return len(v.presented) > 0
}

// A presentation shows kubelet another io.kubernetes.container.hash for one
// container than the one it carries. An image swap requested on the pod
// creates its new container with kubelet's hash for the spec that names
// the new image, and then writes that spec; until kubelet has the new spec,
// it is shown the hash of the spec it has, so that neither the swap's end
// nor the spec change looks like a spec change to it (package kube times
// the handover: see its specpatch.go).
type presentation struct {
	hash      string
	inspected chan struct{} // closed at kubelet's first ContainerStatus for it
	once      sync.Once
}

// PresentHash shows kubelet hash for container id until EndPresent.
func (v *View) PresentHash(id, hash string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.presented[id] = &presentation{hash: hash, inspected: make(chan struct{})}
}

// PresentedHash returns the hash kubelet is shown for id, if one is
// presented.
func (v *View) PresentedHash(id string) (string, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	p := v.presented[id]
	if p == nil {
		return "", false
	}
	return p.hash, true
}

// Inspected marks that a ContainerStatus for id was answered with the
// presented hash.
func (v *View) Inspected(id string) {
	v.mu.Lock()
	p := v.presented[id]
	v.mu.Unlock()
	if p != nil {
		p.once.Do(func() { close(p.inspected) })
	}
}

// WhenInspected is closed once a ContainerStatus for id was answered with
// the presented hash (nil when nothing is presented for id).
func (v *View) WhenInspected(id string) <-chan struct{} {
	v.mu.Lock()
	defer v.mu.Unlock()
	if p := v.presented[id]; p != nil {
		return p.inspected
	}
	return nil
}

// EndPresent shows kubelet id's own hash again.
func (v *View) EndPresent(id string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	delete(v.presented, id)
}

// Relisted records a ListContainers without a filter: how kubelet's PLEG
// relists, every second (and, less often, its housekeeping and garbage
// collection).
func (v *View) Relisted() {
	now := time.Now()
	v.mu.Lock()
	waiters := v.relistWaiters
	v.relistWaiters = nil
	v.relists = append(v.relists, now)
	if len(v.relists) > 16 {
		v.relists = v.relists[len(v.relists)-16:]
	}
	v.mu.Unlock()
	for _, c := range waiters {
		close(c)
	}
}

// NextRelist is closed at the next ListContainers without a filter (the
// read interceptors that report relists run only while a swap runs or a
// hash is presented: Presenting).
func (v *View) NextRelist() <-chan struct{} {
	c := make(chan struct{})
	v.mu.Lock()
	v.relistWaiters = append(v.relistWaiters, c)
	v.mu.Unlock()
	return c
}

// FirstRelistAfter returns the time of the first recorded ListContainers
// without a filter at or after t.
func (v *View) FirstRelistAfter(t time.Time) (time.Time, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, at := range v.relists {
		if !at.Before(t) {
			return at, true
		}
	}
	return time.Time{}, false
}
