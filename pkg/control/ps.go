package control

import (
	"context"
	"sort"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/pkg/swap"
	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

// ListContainers implements inplacedv1.ControlServer: kubelet's view (the
// proxy's own ListContainers) with what inplaced knows about each
// container.
func (s *Server) ListContainers(ctx context.Context, req *inplacedv1.ListContainersRequest) (*inplacedv1.ListContainersResponse, error) {
	if s.view == nil {
		return nil, status.Error(codes.Unimplemented, "ps is not enabled in this daemon")
	}
	f := &runtimeapi.ContainerFilter{LabelSelector: map[string]string{}}
	if req.Namespace != "" {
		f.LabelSelector[swap.LabelPodNamespace] = req.Namespace
	}
	if req.Pod != "" {
		f.LabelSelector[swap.LabelPodName] = req.Pod
	}
	list, err := s.view.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: f})
	if err != nil {
		return nil, err
	}
	overrides, err := s.store.Overrides()
	if err != nil {
		return nil, status.Errorf(codes.Internal, "read overrides: %v", err)
	}
	type key struct{ sandbox, name string }
	byName := map[key]int{}
	for i, o := range overrides {
		byName[key{o.SandboxID, o.Container}] = i
	}
	running := map[key]*inplacedv1.SwapRecord{}
	for _, r := range s.engine.Running() {
		running[key{r.SandboxId, r.Container}] = r
	}
	lastResize := map[string]*inplacedv1.ResizeRecord{}
	if rs, err := s.store.Resizes(); err == nil {
		for _, r := range rs {
			if p := lastResize[r.ContainerId]; p == nil || r.StartedUnixNano > p.StartedUnixNano {
				lastResize[r.ContainerId] = r
			}
		}
	}
	resp := &inplacedv1.ListContainersResponse{}
	for _, c := range list.Containers {
		name := c.GetMetadata().GetName()
		ci := &inplacedv1.ContainerInfo{
			Id: c.Id, Namespace: c.Labels[swap.LabelPodNamespace], Pod: c.Labels[swap.LabelPodName], Container: name,
			SandboxId: c.PodSandboxId, Image: c.GetImage().GetUserSpecifiedImage(), State: c.State.String(),
			Attempt: c.GetMetadata().GetAttempt(), CreatedUnixNano: c.CreatedAt, KubeletHash: c.Annotations[swap.AnnotationHash],
		}
		if ci.Image == "" {
			ci.Image = c.GetImage().GetImage()
		}
		k := key{c.PodSandboxId, name}
		if i, ok := byName[k]; ok {
			ci.OverrideSwapId, ci.OverrideImage = overrides[i].SwapID, overrides[i].Image
		}
		if r := running[k]; r != nil {
			ci.RunningSwapId = r.Id
			if n := len(r.Steps); n > 0 {
				ci.RunningStep = r.Steps[n-1].Name
			}
		}
		if r := lastResize[c.Id]; r != nil {
			ci.LastResizeId, ci.LastResizeResult, ci.LastResizeUnixNano = r.Id, r.Result, r.StartedUnixNano
			ci.LastResizeEnforced = r.Enforced
		}
		resp.Containers = append(resp.Containers, ci)
	}
	sort.Slice(resp.Containers, func(i, j int) bool {
		a, b := resp.Containers[i], resp.Containers[j]
		if a.Namespace+"/"+a.Pod+"/"+a.Container != b.Namespace+"/"+b.Pod+"/"+b.Container {
			return a.Namespace+"/"+a.Pod+"/"+a.Container < b.Namespace+"/"+b.Pod+"/"+b.Container
		}
		return a.CreatedUnixNano > b.CreatedUnixNano
	})
	return resp, nil
}
