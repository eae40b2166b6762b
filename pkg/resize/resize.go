package resize

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/pkg/caller"
	"github.com/inplaced/inplaced/pkg/criinfo"
	"github.com/inplaced/inplaced/pkg/errkind"
	"github.com/inplaced/inplaced/pkg/fence"
	"github.com/inplaced/inplaced/pkg/resources"
	"github.com/inplaced/inplaced/pkg/runtimeclass"
	"github.com/inplaced/inplaced/pkg/store"
	"github.com/inplaced/inplaced/pkg/swap"
	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

// Results and methods as they appear in a ResizeRecord.
const (
	ResultApplied = "applied"
	ResultRefused = "refused"
	ResultFailed  = "failed"

	MethodCgroup  = "cgroup"  // runtime call, then cgroups verified and repaired
	MethodSandbox = "sandbox" // the pod cgroup of a sandbox governed as a whole, and the runtime call
	MethodBackend = "backend" // runtime call only, verified through ContainerStatus
)

// Recorder stores resize records and kubelet's create of each container
// (store.Store): the limits kubelet creates a container with are the pod
// rule's floor (podPrev), and kubelet's own resizes move them.
type Recorder interface {
	PutResize(*inplacedv1.ResizeRecord) error
	Container(id string) (*runtimeapi.CreateContainerRequest, error)
	PutContainer(id string, req *runtimeapi.CreateContainerRequest) error
}

// Options configures a Resizer.
type Options struct {
	// Runtime is the backend (containerd), not the proxy: the control API's
	// resizes and every status read go to it directly.
	Runtime runtimeapi.RuntimeServiceClient
	// Cgroups reads and repairs cgroups. nil: every resize uses the backend
	// method (no cgroup hierarchy available to the daemon).
	Cgroups *resources.Manager
	// Store records every resize.
	Store Recorder
	// Fences, when set, make the control API refuse a container being swapped.
	Fences *fence.Registry
	// Classes say where each runtime handler's limits are enforced; nil:
	// the built-in table (runtimeclass.New(nil)).
	Classes *runtimeclass.Table
	Logger  *zap.Logger
	// Timeout bounds a resize once the runtime has been called; the caller's
	// cancellation does not cut it short. Default 30 s.
	Timeout time.Duration
	// Now is the clock (tests); default time.Now.
	Now func() time.Time
}

// Resizer performs in-place resizes. It implements control.Resizer and
// intercept.Resizer.
type Resizer struct {
	rt      runtimeapi.RuntimeServiceClient
	cg      *resources.Manager
	store   Recorder
	fences  *fence.Registry
	classes *runtimeclass.Table
	log     *zap.Logger
	timeout time.Duration
	now     func() time.Time

	// mu serialises resizes: each is a read, a runtime call and writes that
	// must not interleave with another resize of the same pod.
	mu sync.Mutex

	// missed keeps kubelet's resizes that went to the backend without the
	// resizer (PassedThrough), by container ID, until RecordMissed writes
	// them into the containers' recorded creates.
	missedMu sync.Mutex
	missed   map[string]*runtimeapi.LinuxContainerResources
}

// New returns a Resizer. Runtime and Store are required.
func New(o Options) (*Resizer, error) {
	if o.Runtime == nil || o.Store == nil {
		return nil, errors.New("resize.New: runtime and store are required")
	}
	r := &Resizer{rt: o.Runtime, cg: o.Cgroups, store: o.Store, fences: o.Fences,
		classes: o.Classes, log: o.Logger, timeout: o.Timeout, now: o.Now}
	if r.classes == nil {
		builtin, err := runtimeclass.New(nil)
		if err != nil {
			return nil, fmt.Errorf("resize.New: the built-in runtime classes: %w", err)
		}
		r.classes = builtin
	}
	if r.log == nil {
		r.log = zap.NewNop()
	}
	if r.timeout <= 0 {
		r.timeout = 30 * time.Second
	}
	if r.now == nil {
		r.now = time.Now
	}
	return r, nil
}

// updateFunc is how a resize reaches the runtime: the backend client for the
// control API, the relay's next for kubelet's calls.
type updateFunc func(context.Context, *runtimeapi.UpdateContainerResourcesRequest) (*runtimeapi.UpdateContainerResourcesResponse, error)

// Resize implements control.Resizer: it resizes the container req names and
// returns the record. Errors are gRPC status errors; those of a resolved
// container carry the record as a status detail.
func (r *Resizer) Resize(ctx context.Context, req *inplacedv1.ResizeRequest, uid, pid int64) (*inplacedv1.ResizeRecord, error) {
	start := r.now()
	if err := validate(req.GetResources()); err != nil {
		return nil, err
	}
	c, err := swap.Resolve(ctx, r.rt, req.GetTarget())
	if err != nil {
		return nil, err
	}
	if c.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		return nil, errkind.Errorf(errkind.Refused, "container %s is %s, not running: only a running container is resized in place", short(c.Id), c.State)
	}
	if r.fences != nil && r.fences.ByContainer(c.Id) != nil {
		return nil, errkind.Errorf(errkind.Refused, "container %s is being swapped: resize it when the swap has ended", short(c.Id))
	}

	r.mu.Lock()
	defer r.mu.Unlock()
	o, err := r.inspect(ctx, c.Id, c.PodSandboxId)
	if err != nil {
		return nil, err
	}
	o.rec.Caller = &inplacedv1.Caller{Uid: uid, Pid: pid, Exe: caller.FromContext(ctx).Exe}
	o.resources = req.GetResources()
	o.update = func(ctx context.Context, req *runtimeapi.UpdateContainerResourcesRequest) (*runtimeapi.UpdateContainerResourcesResponse, error) {
		return r.rt.UpdateContainerResources(ctx, req)
	}
	o.exactPod = true
	err = r.run(ctx, o, start)
	return o.rec, err
}

// UpdateContainerResources implements intercept.Resizer: kubelet's in-place
// resize gets the same ordering, verification and undo as the control API's.
// Calls it cannot improve on (no CPU or memory limit in them, a container
// that is not running or that the backend does not describe) go to next
// unchanged, so kubelet never gets a worse answer than the backend's own.
func (r *Resizer) UpdateContainerResources(ctx context.Context, req *runtimeapi.UpdateContainerResourcesRequest,
	next func(context.Context, *runtimeapi.UpdateContainerResourcesRequest) (*runtimeapi.UpdateContainerResourcesResponse, error),
) (*runtimeapi.UpdateContainerResourcesResponse, error) {
	start := r.now()
	want := resources.LimitsFromCRI(req.GetLinux())
	if want == (resources.Limits{}) {
		return next(ctx, req)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	o, err := r.inspect(ctx, req.GetContainerId(), "")
	if err != nil {
		r.log.Debug("resize: passing kubelet's update through", zap.String("container_id", req.GetContainerId()), zap.Error(err))
		return next(ctx, req)
	}
	if o.status.GetState() != runtimeapi.ContainerState_CONTAINER_RUNNING {
		return next(ctx, req)
	}
	o.req = req
	o.update = next
	if err := r.run(ctx, o, start); err != nil {
		return nil, err
	}
	r.kubeletResized(o.id, req.GetLinux())
	return &runtimeapi.UpdateContainerResourcesResponse{}, nil
}

// kubeletResized records kubelet's new limits in its create of the
// container: kubelet creates the container with them from now on (a
// restart), so does a swap's new container, and the control API's pod rule
// keeps the pod above them. A store that cannot take it is logged, and the
// limits are noted as PassedThrough notes them: the resize itself is done.
func (r *Resizer) kubeletResized(id string, lr *runtimeapi.LinuxContainerResources) {
	r.missedMu.Lock()
	defer r.missedMu.Unlock()
	delete(r.missed, id) // this resize is newer
	if err := r.recordLimits(id, lr); err != nil {
		r.log.Warn("resize: kubelet's new limits not recorded; recorded when the state store takes writes again",
			zap.String("container_id", id), zap.Error(err))
		r.noteLocked(id, lr)
	}
}

// recordLimits moves container id's recorded create to limits lr; nil when
// inplaced did not record its create (nothing to move).
func (r *Resizer) recordLimits(id string, lr *runtimeapi.LinuxContainerResources) error {
	req, err := r.store.Container(id)
	if errors.Is(err, store.ErrNotFound) || err == nil && req.GetConfig() == nil {
		return nil // not created through inplaced
	}
	if err != nil {
		return err
	}
	return r.store.PutContainer(id, swap.WithLimits(req, lr))
}

// PassedThrough notes a resize of kubelet's that went to the backend
// without the resizer (the state store was unusable: the daemon passes
// kubelet's calls through then). Its limits are what kubelet creates the
// container with from now on; without them the recorded create keeps the
// old ones, and the control API's pod rule would lower the pod below what
// kubelet's next create of the container asks (the 30-minute soak: on
// cgroup v1 that create then fails with EINVAL, and the pod crash-loops).
// The pod rule counts them at once; RecordMissed records them.
func (r *Resizer) PassedThrough(id string, lr *runtimeapi.LinuxContainerResources) {
	r.missedMu.Lock()
	defer r.missedMu.Unlock()
	r.noteLocked(id, lr)
}

func (r *Resizer) noteLocked(id string, lr *runtimeapi.LinuxContainerResources) {
	if lr == nil {
		return
	}
	if r.missed == nil {
		r.missed = map[string]*runtimeapi.LinuxContainerResources{}
	}
	r.missed[id] = proto.Clone(lr).(*runtimeapi.LinuxContainerResources)
}

// RecordMissed writes the resizes PassedThrough noted into the recorded
// creates, once the store takes writes again; what it cannot write stays
// noted (and counted by the pod rule) for the next call.
func (r *Resizer) RecordMissed() error {
	r.missedMu.Lock()
	defer r.missedMu.Unlock()
	var errs []error
	for id, lr := range r.missed {
		if err := r.recordLimits(id, lr); err != nil {
			errs = append(errs, fmt.Errorf("container %s: %w", short(id), err))
			continue
		}
		delete(r.missed, id)
	}
	if len(errs) > 0 {
		return fmt.Errorf("record kubelet's resizes made while the state store was unusable: %w", errors.Join(errs...))
	}
	return nil
}

// missedLimits is kubelet's last resize of id that PassedThrough noted and
// RecordMissed has not recorded yet, or nil.
func (r *Resizer) missedLimits(id string) *runtimeapi.LinuxContainerResources {
	r.missedMu.Lock()
	defer r.missedMu.Unlock()
	return r.missed[id]
}

// declared is what kubelet creates container id with (its recorded
// create, moved by kubelet's resizes since); ok is false when inplaced did
// not see the create.
func (r *Resizer) declared(id string) (resources.Limits, bool) {
	req, err := r.store.Container(id)
	if err != nil {
		return resources.Limits{}, false
	}
	if lr := r.missedLimits(id); lr != nil && req.GetConfig() != nil {
		req = swap.WithLimits(req, lr)
	}
	lr := req.GetConfig().GetLinux().GetResources()
	if lr == nil {
		return resources.Limits{}, false
	}
	return resources.LimitsFromCRI(lr), true
}

// op is one resize in progress.
type op struct {
	rec         *inplacedv1.ResizeRecord
	id          string
	status      *runtimeapi.ContainerStatus
	cgroupsPath string
	sandboxID   string
	// sandboxCgroup is the pod cgroup the sandbox method resized.
	sandboxCgroup string
	class         runtimeclass.Class
	// overhead is the pod overhead the sandbox config declares (kubelet
	// passes a RuntimeClass's there), else the class's.
	overhead runtimeclass.Overhead
	update   updateFunc
	// resources is the control API's request; req is built from it once the
	// container's CPU period is known. kubelet's calls set req directly.
	resources *inplacedv1.Resources
	req       *runtimeapi.UpdateContainerResourcesRequest
	// exactPod: raise the pod by the container's raise, never lower it
	// (control API, podPrev); else kubelet moves the pod itself and it is
	// only kept above the container.
	exactPod bool
}

// inspect reads what a resize needs to know about container id: its status,
// cgroupsPath and whether its sandbox is a VM. sandboxID may be empty.
func (r *Resizer) inspect(ctx context.Context, id, sandboxID string) (*op, error) {
	resp, err := r.rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id, Verbose: true})
	if err != nil {
		return nil, fmt.Errorf("container status %s: %w", short(id), err)
	}
	st := resp.GetStatus()
	if st == nil {
		return nil, errkind.Errorf(errkind.NotFound, "container %s: the runtime returned no status", short(id))
	}
	o := &op{id: st.GetId(), status: st}
	if o.id == "" {
		o.id = id
	}
	info := criinfo.ContainerOf(resp.GetInfo())
	if err := info.Err(); err != nil && !errors.Is(err, criinfo.ErrNoInfo) {
		r.log.Warn("resize: cannot decode verbose container info", zap.String("container_id", o.id), zap.Error(err))
	}
	o.cgroupsPath = info.CgroupsPath()
	if sandboxID == "" {
		sandboxID = info.SandboxID()
	}
	if sandboxID == "" {
		list, err := r.rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{Id: o.id}})
		if err != nil {
			return nil, fmt.Errorf("list container %s: %w", short(o.id), err)
		}
		if len(list.GetContainers()) > 0 {
			sandboxID = list.Containers[0].GetPodSandboxId()
		}
	}
	o.sandboxID = sandboxID
	o.class = r.classes.Lookup("", "")
	if sandboxID != "" {
		ps, err := r.rt.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: sandboxID, Verbose: true})
		if err != nil {
			return nil, fmt.Errorf("sandbox status %s: %w", short(sandboxID), err)
		}
		sb := criinfo.SandboxOf(ps.GetInfo())
		cfg, err := sb.Config()
		if err != nil && !errors.Is(err, criinfo.ErrNoInfo) && !errors.Is(err, criinfo.ErrNoConfig) {
			r.log.Warn("resize: cannot decode verbose sandbox info", zap.String("sandbox_id", sandboxID), zap.Error(err))
		}
		o.class = r.classes.Lookup(ps.GetStatus().GetRuntimeHandler(), sb.RuntimeType())
		o.overhead = overhead(cfg, o.class.Overhead)
	}
	labels := st.GetLabels()
	o.rec = &inplacedv1.ResizeRecord{
		Namespace:      labels[swap.LabelPodNamespace],
		Pod:            labels[swap.LabelPodName],
		Container:      labels[swap.LabelContainerName],
		ContainerId:    o.id,
		RuntimeHandler: o.class.Handler,
		RuntimeClass:   string(o.class.Enforcement),
	}
	if o.rec.Container == "" {
		o.rec.Container = st.GetMetadata().GetName()
	}
	return o, nil
}

// run performs a resize and records it, whatever its outcome.
func (r *Resizer) run(ctx context.Context, o *op, start time.Time) (err error) {
	o.rec.Id = newID(start)
	o.rec.StartedUnixNano = start.UnixNano()
	log := r.log.With(zap.String("resize_id", o.rec.Id), zap.String("container_id", o.id))
	defer func() {
		o.rec.DurationNs = int64(r.now().Sub(start))
		o.describe()
		if err != nil {
			if o.rec.Result == "" || o.rec.Result == ResultApplied {
				o.rec.Result = ResultFailed
			}
			o.rec.Error = status.Convert(err).Message()
			err = errkind.WithDetail(err, o.rec) // so a client sees what is in effect even when the call failed
		}
		if perr := r.store.PutResize(o.rec); perr != nil {
			log.Error("resize: record", zap.Error(perr))
		}
		fields := []zap.Field{zap.String("result", o.rec.Result), zap.String("method", o.rec.Method),
			zap.Duration("duration", time.Duration(o.rec.DurationNs)), zap.Strings("repaired", o.rec.Repaired)}
		switch {
		case o.rec.Result == ResultRefused:
			log.Info("resize refused", append(fields, zap.Error(err))...)
		case err != nil:
			log.Warn("resize failed", append(fields, zap.Error(err))...)
		default:
			log.Info("resize", fields...)
		}
	}()
	switch {
	case r.cg == nil || o.cgroupsPath == "":
		return r.viaBackend(ctx, o)
	case o.class.Enforcement == runtimeclass.SandboxCgroup:
		return r.viaSandbox(ctx, o)
	case o.class.Enforcement == runtimeclass.ContainerCgroups:
		return r.viaCgroups(ctx, o)
	default: // vm, unknown: no host cgroup contains the container
		return r.viaBackend(ctx, o)
	}
}

// RecordOf returns the ResizeRecord a failed Resize carries: in process
// as the error's detail, over the control API as a status detail.
func RecordOf(err error) *inplacedv1.ResizeRecord {
	if rec, ok := errkind.DetailOf(err).(*inplacedv1.ResizeRecord); ok {
		return rec
	}
	for _, d := range status.Convert(err).Details() {
		if rec, ok := d.(*inplacedv1.ResizeRecord); ok {
			return rec
		}
	}
	return nil
}

// newID returns a time-ordered resize ID: store history sorts by key.
func newID(t time.Time) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s-%s", t.UTC().Format("20060102T150405.000"), hex.EncodeToString(b[:]))
}

func short(id string) string {
	if len(id) > 13 {
		return id[:13]
	}
	return id
}
