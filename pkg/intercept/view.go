package intercept

import (
	"context"
	"time"

	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/pkg/fence"
	"github.com/inplaced/inplaced/pkg/swap"
)

// mask is the view of one swap whose mask is on, with the container name
// and sandbox it covers.
type mask struct {
	key fence.Key
	fence.View
}

// masked returns the masks of running swaps whose mask is on.
func (i *Interceptors) masked(sandboxID string) []mask {
	var out []mask
	for _, f := range i.fences.BySandbox(sandboxID) {
		if v := f.View(); v.Masking {
			out = append(out, mask{key: f.Key, View: v})
		}
	}
	return out
}

// hides reports whether m keeps a container from kubelet: one the swap has
// registered (Hide), or any other container of the masked name in the
// sandbox created after the old one. The swap can register its new
// container only once the runtime has answered its CreateContainer, but
// the runtime lists the container from the moment it exists; a kubelet
// relist in between would see a newest container of the name in state
// CREATED, and kubelet starts such a container at once (a second
// CreateContainer racing the swap). kubelet itself cannot have made such a
// container: its CreateContainer for the name waits on the fence.
func (m mask) hides(id, sandboxID, name string, createdAt int64) bool {
	if m.Hidden[id] {
		return true
	}
	if id == m.OldID || sandboxID != m.key.SandboxID || name != m.key.Name {
		return false
	}
	var oldCreated int64
	switch {
	case m.OldEntry != nil:
		oldCreated = m.OldEntry.CreatedAt
	case m.OldStatus != nil:
		oldCreated = m.OldStatus.CreatedAt
	default:
		return false
	}
	return createdAt > oldCreated
}

// containerName is the name kubelet knows a container by: its
// io.kubernetes.container.name label, else its metadata name.
func containerName(labels map[string]string, md *runtimeapi.ContainerMetadata) string {
	if n := labels[labelContainerName]; n != "" {
		return n
	}
	return md.GetName()
}

const labelContainerName = "io.kubernetes.container.name"

func (i *Interceptors) listContainers(ctx context.Context, req *runtimeapi.ListContainersRequest,
	next func(context.Context, *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error),
) (*runtimeapi.ListContainersResponse, error) {
	resp, err := next(ctx, req)
	if err != nil {
		return nil, err
	}
	for _, c := range resp.Containers {
		c.Annotations = i.presentHash(c.Id, c.Annotations)
	}
	if f := req.GetFilter(); f == nil || proto.Equal(f, &runtimeapi.ContainerFilter{}) {
		i.kubelet.Relisted()
	}
	// Views are read after this instant; lingers of swaps released before it
	// are over once this answer is served (fence.Listed).
	viewedAt := time.Now()
	defer i.fences.Listed(req.GetFilter(), viewedAt)
	views := i.masksFor(resp.Containers, req.GetFilter())
	if len(views) == 0 {
		return resp, nil
	}
	return &runtimeapi.ListContainersResponse{Containers: shownToKubelet(resp.Containers, views, req.GetFilter())}, nil
}

// masksFor returns the masks on the sandboxes of a list's containers, and
// on those the filter names or, unfiltered by sandbox, of every fence.
func (i *Interceptors) masksFor(containers []*runtimeapi.Container, filter *runtimeapi.ContainerFilter) []mask {
	seenSandbox := map[string]bool{}
	var views []mask
	add := func(sandboxID string) {
		if !seenSandbox[sandboxID] {
			seenSandbox[sandboxID] = true
			views = append(views, i.masked(sandboxID)...)
		}
	}
	for _, c := range containers {
		add(c.PodSandboxId)
	}
	// The old container may be missing from a response filtered on state
	// RUNNING: its sandbox is known from the fence.
	if sb := filter.GetPodSandboxId(); sb != "" {
		add(sb)
	} else {
		for _, f := range i.fences.All() {
			add(f.Key.SandboxID)
		}
	}
	return views
}

// shownToKubelet is the list kubelet is shown: the containers the masks hide left
// out, and each old container a mask replaces shown as it was before the
// swap (when the filter matches it).
func shownToKubelet(containers []*runtimeapi.Container, views []mask, filter *runtimeapi.ContainerFilter) []*runtimeapi.Container {
	out := make([]*runtimeapi.Container, 0, len(containers))
	for _, c := range containers {
		if hiddenIn(views, c.Id, c.PodSandboxId, containerName(c.Labels, c.Metadata), c.CreatedAt) {
			continue
		}
		if v, ok := oldIn(views, c.Id); ok && v.ReplaceOld && v.OldEntry != nil {
			continue // re-added below as it was
		}
		out = append(out, c)
	}
	for _, v := range views {
		if v.ReplaceOld && v.OldEntry != nil && matchesFilter(v.OldEntry, filter) {
			out = append(out, proto.Clone(v.OldEntry).(*runtimeapi.Container))
		}
	}
	return out
}

func hiddenIn(views []mask, id, sandboxID, name string, createdAt int64) bool {
	for _, v := range views {
		if v.hides(id, sandboxID, name, createdAt) {
			return true
		}
	}
	return false
}

func oldIn(views []mask, id string) (mask, bool) {
	for _, v := range views {
		if v.OldID == id {
			return v, true
		}
	}
	return mask{}, false
}

// matchesFilter applies a CRI ContainerFilter like the runtime does.
func matchesFilter(c *runtimeapi.Container, f *runtimeapi.ContainerFilter) bool {
	if f == nil {
		return true
	}
	if f.Id != "" && f.Id != c.Id {
		return false
	}
	if f.PodSandboxId != "" && f.PodSandboxId != c.PodSandboxId {
		return false
	}
	if f.State != nil && f.State.State != c.State {
		return false
	}
	for k, v := range f.LabelSelector {
		if c.Labels[k] != v {
			return false
		}
	}
	return true
}

func (i *Interceptors) containerStatus(ctx context.Context, req *runtimeapi.ContainerStatusRequest,
	next func(context.Context, *runtimeapi.ContainerStatusRequest) (*runtimeapi.ContainerStatusResponse, error),
) (*runtimeapi.ContainerStatusResponse, error) {
	resp, err := next(ctx, req)
	if err != nil {
		return nil, err
	}
	if st := resp.GetStatus(); st != nil {
		if ann := i.presentHash(req.ContainerId, st.Annotations); !sameHash(ann, st.Annotations) {
			st.Annotations = ann
			i.kubelet.Inspected(req.ContainerId)
		}
	}
	if st, ok := i.fences.Lingering(req.ContainerId); ok {
		resp.Status = proto.Clone(st).(*runtimeapi.ContainerStatus)
		return resp, nil
	}
	f := i.fences.ByContainer(req.ContainerId)
	if f == nil {
		return resp, nil
	}
	if v := f.View(); v.Masking && v.ReplaceOld && v.OldID == req.ContainerId && v.OldStatus != nil {
		resp.Status = proto.Clone(v.OldStatus).(*runtimeapi.ContainerStatus)
	}
	return resp, nil
}

// presentHash returns ann with the hash kubelet is to be shown for
// container id (View.PresentHash), or ann itself when none is presented.
func (i *Interceptors) presentHash(id string, ann map[string]string) map[string]string {
	h, ok := i.kubelet.PresentedHash(id)
	if !ok || ann[swap.AnnotationHash] == h {
		return ann
	}
	out := make(map[string]string, len(ann))
	for k, v := range ann {
		out[k] = v
	}
	out[swap.AnnotationHash] = h
	return out
}

func sameHash(a, b map[string]string) bool { return a[swap.AnnotationHash] == b[swap.AnnotationHash] }

func (i *Interceptors) podSandboxStatus(ctx context.Context, req *runtimeapi.PodSandboxStatusRequest,
	next func(context.Context, *runtimeapi.PodSandboxStatusRequest) (*runtimeapi.PodSandboxStatusResponse, error),
) (*runtimeapi.PodSandboxStatusResponse, error) {
	resp, err := next(ctx, req)
	if err != nil || len(resp.ContainersStatuses) == 0 {
		return resp, err
	}
	for _, s := range resp.ContainersStatuses {
		s.Annotations = i.presentHash(s.Id, s.Annotations)
	}
	views := i.masked(req.PodSandboxId)
	if len(views) == 0 {
		return resp, nil
	}
	out := resp.ContainersStatuses[:0]
	for _, s := range resp.ContainersStatuses {
		if hiddenIn(views, s.Id, req.PodSandboxId, containerName(s.Labels, s.Metadata), s.CreatedAt) {
			continue
		}
		if v, ok := oldIn(views, s.Id); ok && v.ReplaceOld && v.OldStatus != nil {
			s = proto.Clone(v.OldStatus).(*runtimeapi.ContainerStatus)
		}
		out = append(out, s)
	}
	resp.ContainersStatuses = out
	return resp, nil
}

// containerEvent drops the events a masked swap causes (the old container
// stopping, the new one being created and started): kubelet's evented PLEG
// learns the outcome from its next relist, after the mask is off.
func (i *Interceptors) containerEvent(_ context.Context, msg []byte) bool {
	if !i.active() {
		return true
	}
	ev := &runtimeapi.ContainerEventResponse{}
	if err := proto.Unmarshal(msg, ev); err != nil {
		return true
	}
	f := i.fences.ByContainer(ev.ContainerId)
	if f == nil {
		// A container the swap created but has not registered yet.
		sb := ev.GetPodSandboxStatus().GetId()
		if sb == "" {
			return true
		}
		views := i.masked(sb)
		for _, s := range ev.ContainersStatuses {
			if s.GetId() == ev.ContainerId && hiddenIn(views, s.Id, sb, containerName(s.Labels, s.Metadata), s.CreatedAt) {
				return false
			}
		}
		return true
	}
	v := f.View()
	return !(v.Masking && ((v.ReplaceOld && v.OldID == ev.ContainerId) || v.Hidden[ev.ContainerId]))
}
