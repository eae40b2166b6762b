package fence

import (
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// LingerFor bounds how long the old container's snapshot outlives its
// swap when no list comes: kubelet's PLEG relists every second.
const LingerFor = 2 * time.Second

// A lingering mask keeps showing kubelet the old container's snapshot in
// ContainerStatus after its swap ended, until kubelet has listed again.
//
// kubelet reads a pod in two steps: ListContainers, then ContainerStatus
// for each container in that list. A list taken under the mask names only
// the old container (as it was, running). If the swap ends between the two
// steps, the truth for that old ID is "exited", and kubelet would conclude
// "old exited, nothing else" and create the swap's attempt itself, which
// the runtime refuses ("failed to reserve container name"). Until a list
// served after the swap shows the new container, the status stays the one
// that list's predecessor implied.
type lingering struct {
	status *runtimeapi.ContainerStatus
	entry  *runtimeapi.Container
	since  time.Time // the swap's release
	until  time.Time
}

// LingerOnRelease makes the old container's snapshot outlive the swap (see
// lingering) when the fence is released with another container running.
// Swaps kubelet did not drive call it: a swap that answers kubelet's own
// stop and create has told kubelet the truth all along.
func (f *Fence) LingerOnRelease() {
	f.mu.Lock()
	f.linger = true
	f.mu.Unlock()
}

// startLinger is called by Release with r.mu locked.
func (r *Registry) startLinger(f *Fence, out Outcome, now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.linger || !f.replaceOld || f.oldStatus == nil || out.RunningID == "" || out.RunningID == f.oldID {
		return
	}
	if r.lingers == nil {
		r.lingers = map[string]*lingering{}
	}
	r.lingers[f.oldID] = &lingering{status: f.oldStatus, entry: f.oldEntry, since: now, until: now.Add(LingerFor)}
}

// Lingering returns the snapshot kubelet is still shown for a container
// whose swap has ended, if any.
func (r *Registry) Lingering(id string) (*runtimeapi.ContainerStatus, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	l := r.lingers[id]
	if l == nil {
		return nil, false
	}
	if time.Now().After(l.until) {
		delete(r.lingers, id)
		return nil, false
	}
	return l.status, true
}

// EndLinger ends the lingering of a container that was removed.
func (r *Registry) EndLinger(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.lingers, id)
}

// Listed ends the lingering of every old container a ListContainers with
// filter would have named, if its swap was released before viewedAt (when
// the list's answer was checked against the masks): that answer showed
// kubelet the new container beside it. A filter on state proves nothing
// (the old container is not in a RUNNING list, nor the new one in an
// EXITED one).
func (r *Registry) Listed(filter *runtimeapi.ContainerFilter, viewedAt time.Time) {
	if filter.GetState() != nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for id, l := range r.lingers {
		if l.since.Before(viewedAt) && (l.entry == nil || coveredBy(l.entry, filter)) {
			delete(r.lingers, id)
		}
	}
}

// coveredBy reports whether a list with filter (no state) names c.
func coveredBy(c *runtimeapi.Container, f *runtimeapi.ContainerFilter) bool {
	if f == nil {
		return true
	}
	if (f.Id != "" && f.Id != c.Id) || (f.PodSandboxId != "" && f.PodSandboxId != c.PodSandboxId) {
		return false
	}
	for k, v := range f.LabelSelector {
		if c.Labels[k] != v {
			return false
		}
	}
	return true
}

// lingersLocked reports whether a snapshot still lingers; r.mu locked.
func (r *Registry) lingersLocked(now time.Time) bool {
	for id, l := range r.lingers {
		if now.After(l.until) {
			delete(r.lingers, id)
		}
	}
	return len(r.lingers) > 0
}
