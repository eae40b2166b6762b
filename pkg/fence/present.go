package fence

import (
	"sync"
	"time"
)

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
func (r *Registry) PresentHash(id, hash string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.presented == nil {
		r.presented = map[string]*presentation{}
	}
	r.presented[id] = &presentation{hash: hash, inspected: make(chan struct{})}
}

// PresentedHash returns the hash kubelet is shown for id, if one is
// presented.
func (r *Registry) PresentedHash(id string) (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.presented[id]
	if p == nil {
		return "", false
	}
	return p.hash, true
}

// Inspected marks that a ContainerStatus for id was answered with the
// presented hash.
func (r *Registry) Inspected(id string) {
	r.mu.Lock()
	p := r.presented[id]
	r.mu.Unlock()
	if p != nil {
		p.once.Do(func() { close(p.inspected) })
	}
}

// WhenInspected is closed once a ContainerStatus for id was answered with
// the presented hash (nil when nothing is presented for id).
func (r *Registry) WhenInspected(id string) <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	if p := r.presented[id]; p != nil {
		return p.inspected
	}
	return nil
}

// EndPresent shows kubelet id's own hash again.
func (r *Registry) EndPresent(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.presented, id)
}

// Relisted records a ListContainers without a filter: how kubelet's PLEG
// relists, every second (and, less often, its housekeeping and garbage
// collection).
func (r *Registry) Relisted() {
	now := time.Now()
	r.mu.Lock()
	waiters := r.relistWaiters
	r.relistWaiters = nil
	r.relists = append(r.relists, now)
	if len(r.relists) > 16 {
		r.relists = r.relists[len(r.relists)-16:]
	}
	r.mu.Unlock()
	for _, c := range waiters {
		close(c)
	}
}

// NextRelist is closed at the next ListContainers without a filter (read
// interceptors run only while a swap runs or a hash is presented).
func (r *Registry) NextRelist() <-chan struct{} {
	c := make(chan struct{})
	r.mu.Lock()
	r.relistWaiters = append(r.relistWaiters, c)
	r.mu.Unlock()
	return c
}

// FirstRelistAfter returns the time of the first recorded ListContainers
// without a filter at or after t.
func (r *Registry) FirstRelistAfter(t time.Time) (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, at := range r.relists {
		if !at.Before(t) {
			return at, true
		}
	}
	return time.Time{}, false
}
