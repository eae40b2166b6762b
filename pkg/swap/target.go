package swap

import (
	"context"
	"errors"
	"fmt"
	"google.golang.org/protobuf/proto"
	"sort"
	"strings"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/pkg/criinfo"
	"github.com/inplaced/inplaced/pkg/store"
	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

// target is a resolved swap target: the running container and what it was
// created from.
type target struct {
	container *runtimeapi.Container
	status    *runtimeapi.ContainerStatus
	sandbox   *runtimeapi.PodSandboxStatus
	identity  sandboxIdentity                    // what the swap must leave as it is
	request   *runtimeapi.CreateContainerRequest // recorded or adopted, with limits
	// limits are the CPU and memory limits the runtime has for the
	// container (runningLimits); nil when it does not say.
	limits *runtimeapi.LinuxContainerResources
	name   string
	pid    int    // the container's init, for the connection hold
	netns  string // the sandbox's network namespace
}

// Resolve finds the running container a Target names. Exported for the
// resize path, which targets containers the same way.
func Resolve(ctx context.Context, rt runtimeapi.RuntimeServiceClient, t *inplacedv1.Target) (*runtimeapi.Container, error) {
	switch {
	case t.GetContainerId() != "" && (t.GetPod() != "" || t.GetContainer() != ""):
		return nil, invalidf("give either --id or POD -n NAMESPACE -c CONTAINER, not both")
	case t.GetContainerId() != "":
		resp, err := rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
		if err != nil {
			return nil, err
		}
		var match []*runtimeapi.Container
		for _, c := range resp.Containers {
			if c.Id == t.ContainerId {
				match = []*runtimeapi.Container{c}
				break
			}
			if strings.HasPrefix(c.Id, t.ContainerId) {
				match = append(match, c)
			}
		}
		switch len(match) {
		case 0:
			return nil, notFoundf("no container with ID or prefix %q", t.ContainerId)
		case 1:
			return match[0], nil
		default:
			return nil, invalidf("container ID prefix %q matches %d containers: give more of the ID", t.ContainerId, len(match))
		}
	case t.GetPod() != "" && t.GetContainer() != "":
		ns := t.GetNamespace()
		if ns == "" {
			ns = "default"
		}
		resp, err := rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{
			LabelSelector: map[string]string{LabelPodNamespace: ns, LabelPodName: t.Pod, LabelContainerName: t.Container},
		}})
		if err != nil {
			return nil, err
		}
		cs := resp.Containers
		if len(cs) == 0 {
			return nil, notFoundf("no container %q in pod %s/%s (kubelet labels io.kubernetes.pod.name/namespace, io.kubernetes.container.name)", t.Container, ns, t.Pod)
		}
		// kubelet follows the newest container of a name; so do we.
		sort.Slice(cs, func(i, j int) bool { return cs[i].CreatedAt > cs[j].CreatedAt })
		return cs[0], nil
	default:
		return nil, invalidf("no target: give POD -n NAMESPACE -c CONTAINER or --id CONTAINER_ID")
	}
}

// resolve finds the container and its recorded configuration, and checks that
// a swap may start: the container runs and its sandbox is ready.
func (e *Engine) resolve(ctx context.Context, t *inplacedv1.Target) (*target, error) {
	c, err := Resolve(ctx, e.rt, t)
	if err != nil {
		return nil, err
	}
	if c.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		return nil, refusedf("container %s is %s, not running: a swap replaces a running container", short(c.Id), c.State)
	}
	st, err := e.rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: c.Id, Verbose: true})
	if err != nil {
		return nil, fmt.Errorf("container status %s: %w", short(c.Id), err)
	}
	ps, err := e.rt.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: c.PodSandboxId, Verbose: true})
	if err != nil {
		return nil, fmt.Errorf("sandbox status %s: %w", short(c.PodSandboxId), err)
	}
	if ps.Status.State != runtimeapi.PodSandboxState_SANDBOX_READY {
		return nil, refusedf("pod sandbox %s is not ready: nothing to swap into", short(c.PodSandboxId))
	}
	info, sbInfo := criinfo.ContainerOf(st.GetInfo()), criinfo.SandboxOf(ps.GetInfo())
	req, err := e.recorded(ctx, c.Id, ps.GetStatus().GetId(), info, sbInfo)
	if err != nil {
		return nil, err
	}
	limits := runningLimits(info, st.GetStatus())
	req = WithLimits(req, limits)
	name := c.Labels[LabelContainerName]
	if name == "" {
		name = c.GetMetadata().GetName()
	}
	id := identityOf(ps.GetStatus(), sbInfo)
	return &target{container: c, status: st.Status, sandbox: ps.Status, identity: id, request: req, limits: limits, name: name,
		pid: info.Pid(), netns: id.netnsPath()}, nil
}

// recorded returns the CreateContainerRequest a container was made from: from
// the store when it passed through inplaced, else adopted from the backend's
// verbose status (containerd keeps the original CRI configs there).
func (e *Engine) recorded(ctx context.Context, id, sandboxID string, info criinfo.Container, sbInfo criinfo.Sandbox) (*runtimeapi.CreateContainerRequest, error) {
	req, err := e.store.Container(id)
	if err == nil {
		if req.SandboxConfig == nil {
			if sb, err := e.store.Sandbox(req.PodSandboxId); err == nil {
				req.SandboxConfig = sb.Config
			}
		}
		if req.SandboxConfig != nil {
			return req, nil
		}
	} else if !errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("read recorded config of %s: %w", short(id), err)
	}
	cfg, err := info.Config()
	if err != nil {
		return nil, refusedf(
			"container %s was created before inplaced ran and the backend does not expose its CRI config (%v): it cannot be swapped; recreate the pod once with inplaced in place", short(id), err)
	}
	var sbCfg *runtimeapi.PodSandboxConfig
	if sb, err := e.store.Sandbox(sandboxID); err == nil {
		sbCfg = sb.Config
	} else if sbCfg, err = sbInfo.Config(); err != nil {
		return nil, refusedf(
			"sandbox of %s: the backend does not expose its CRI config (%v): it cannot be swapped", short(id), err)
	}
	req = &runtimeapi.CreateContainerRequest{PodSandboxId: sandboxID, Config: cfg, SandboxConfig: sbCfg}
	// Adopted: record it so the next swap does not depend on the backend.
	if err := e.store.PutContainer(id, req); err != nil {
		return nil, fmt.Errorf("record adopted config of %s: %w", short(id), err)
	}
	return req, nil
}

func short(id string) string {
	if len(id) > 13 {
		return id[:13]
	}
	return id
}

// runningLimits are the CPU and memory limits the runtime has for a
// container now: the OCI spec in its verbose status (containerd keeps it
// and every UpdateContainerResources moves it, on 1.6 as on 2.x), else the
// CRI status' resources; nil when neither says. A swap's new container and
// its rollback get these rather than the recorded create's: kubelet may have
// resized the container since (and lowered its pod cgroup, which cgroup v1
// enforces against a new container's quota), and its resize need not have
// reached inplaced's record.
func runningLimits(info criinfo.Container, st *runtimeapi.ContainerStatus) *runtimeapi.LinuxContainerResources {
	if lr := info.Limits(); lr != nil {
		return lr
	}
	return st.GetResources().GetLinux()
}

// WithLimits is req with the CPU and memory limits of lr where lr sets them
// (CRI's zero: not set), everything else of the recorded create kept; req
// itself is not changed. Package resize records kubelet's resizes with it.
func WithLimits(req *runtimeapi.CreateContainerRequest, lr *runtimeapi.LinuxContainerResources) *runtimeapi.CreateContainerRequest {
	if lr == nil || req.GetConfig() == nil {
		return req
	}
	out := proto.Clone(req).(*runtimeapi.CreateContainerRequest)
	setLimits(out.Config, lr)
	return out
}

// setLimits writes lr's CPU and memory limits into cfg (a copy).
func setLimits(cfg *runtimeapi.ContainerConfig, lr *runtimeapi.LinuxContainerResources) {
	if lr == nil {
		return
	}
	if cfg.Linux == nil {
		cfg.Linux = &runtimeapi.LinuxContainerConfig{}
	}
	if cfg.Linux.Resources == nil {
		cfg.Linux.Resources = &runtimeapi.LinuxContainerResources{}
	}
	r := cfg.Linux.Resources
	if lr.CpuPeriod != 0 {
		r.CpuPeriod = lr.CpuPeriod
	}
	if lr.CpuQuota != 0 {
		r.CpuQuota = lr.CpuQuota
	}
	if lr.CpuShares != 0 {
		r.CpuShares = lr.CpuShares
	}
	if lr.MemoryLimitInBytes != 0 {
		r.MemoryLimitInBytes = lr.MemoryLimitInBytes
	}
}
