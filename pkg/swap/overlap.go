package swap

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/pkg/strategy"
	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

// StepHandover is the overlap swap's step that waits until the new
// container's bind() of every port the old one listens on got the old
// listening socket.
const StepHandover = "handover"

// Taker hands the old container's listening sockets to the new one in an
// overlap swap: package takeover's agent, wired in by package daemon, so
// that the engine links none of it and is tested with a fake.
type Taker interface {
	// Running is "" when the agent serves, else why it does not.
	Running() string
	// Profile is the new container's Localhost seccomp profile (JSON): the
	// pod's own rules (base) plus a notify rule on bind naming the agent,
	// for swap. Its error says why the trap cannot be added.
	Profile(base SeccompBase, swap string) ([]byte, error)
	// Register lets the new container of swap take over the listening
	// sockets of the container whose init is pid; a bind that cannot be
	// handed over waits until that container no longer listens, or
	// deadline. events gets the handovers and refusals of swap's binds
	// until Unregister; it must not block.
	Register(swap string, pid int, deadline time.Time, events func(TakeoverEvent)) error
	// Unregister ends swap: its waiting binds continue, and every later
	// bind of the new container continues in the kernel.
	Unregister(swap string)
}

// downTaker stands for a Taker the engine cannot use: Running says why.
type downTaker struct{ why string }

func (d downTaker) Running() string                             { return d.why }
func (d downTaker) Profile(SeccompBase, string) ([]byte, error) { return nil, errors.New(d.why) }
func (d downTaker) Register(string, int, time.Time, func(TakeoverEvent)) error {
	return errors.New(d.why)
}
func (d downTaker) Unregister(string) {}

// SeccompBase is a container's own seccomp profile, which the new
// container keeps with the trap added.
type SeccompBase struct {
	Kind runtimeapi.SecurityProfile_ProfileType
	// Path is a Localhost profile's file.
	Path string
	// Capabilities are the container's bounding set: RuntimeDefault's
	// rules depend on them.
	Capabilities []string
}

// TakeoverEvent is what the agent did with a bind of a port the old
// container listens on.
type TakeoverEvent struct {
	// HandedOver: the bind got the old listening socket; else it was
	// refused and waits (Reason says why).
	HandedOver bool
	Port       uint16
	Reason     string
}

// takeoverRun is an overlap swap's part of the run.
type takeoverRun struct {
	profile  []byte   // the new container's seccomp profile
	path     string   // where it is written for the create
	ports    []uint16 // the ports the old container listens on
	handed   []uint16
	events   chan TakeoverEvent
	deadline time.Duration // for every port to be handed over, from start-new
	// registered: Register succeeded (Unregister at the end).
	registered bool
}

// chooseStrategy decides the swap's strategy and records it: overlap only
// when asked for and possible, else stop-first, saying why.
func (r *run) chooseStrategy() {
	e := r.e
	agent := "no takeover agent in this inplaced"
	if e.taker != nil {
		agent = e.taker.Running()
	}
	s, why := decideStrategy(strategyInput{requested: r.opts.GetStrategy(), annotations: r.oldReq.SandboxConfig.GetAnnotations(),
		node: e.strategy, kind: r.rec.Kind, class: e.classes.Lookup(r.t.identity.handler, r.t.identity.runtimeType),
		handler: r.t.identity.handler, agent: agent, config: r.oldReq.Config})
	r.rec.Strategy, r.rec.StrategyWhy = string(s), why
	if s != strategy.Overlap {
		return
	}
	tk, blocked := r.overlapPossible()
	if blocked != "" {
		r.rec.Strategy, r.rec.StrategyWhy = string(strategy.StopFirst), notPossible(why, blocked)
		r.log.Info("overlap not possible: stop-first", zap.String("why", blocked))
		return
	}
	r.tk = tk
}

// overlapPossible prepares the overlap, or says why there is none: the
// pod's limits, its seccomp profile, the old container's ports.
func (r *run) overlapPossible() (*takeoverRun, string) {
	e := r.e
	if why := r.overlapResources(); why != "" {
		return nil, why
	}
	base, err := seccompBase(r.oldReq.Config)
	if err != nil {
		return nil, err.Error()
	}
	profile, err := e.taker.Profile(base, r.rec.Id)
	if err != nil {
		return nil, err.Error()
	}
	if e.holder == nil {
		return nil, "no way to find the old container's listening ports in this inplaced"
	}
	found, err := e.holder.Ports(r.t.netns, r.t.pid, nil)
	if err != nil {
		return nil, fmt.Sprintf("the old container's listening ports: %v", err)
	}
	return &takeoverRun{profile: profile, path: filepath.Join(e.profileDir, r.rec.Id+".json"), ports: found.Listened,
		events: make(chan TakeoverEvent, 64), deadline: r.hold.max}, ""
}

// overlapResources says why the pod's limits cannot hold both containers,
// or "" (see memoryFits).
func (r *run) overlapResources() string {
	pod := r.oldReq.SandboxConfig.GetLinux().GetResources().GetMemoryLimitInBytes()
	if pod <= 0 {
		return ""
	}
	ctx, cancel := context.WithTimeout(r.ctx, 10*time.Second)
	defer cancel()
	running, err := r.e.podMemory(ctx, r.t.container.PodSandboxId)
	if err != nil {
		return fmt.Sprintf("pod limits not known to hold both containers: %v", err)
	}
	return memoryFits(pod, running, r.t.limits.GetMemoryLimitInBytes())
}

// doCreateTrapped writes the new container's profile, registers the old
// container with the agent and creates the new container with the trap.
// The recorded config (journal, store) is the untrapped one: the profile
// file goes with the swap, and a later create must not name it.
func (r *run) doCreateTrapped() error {
	tk := r.tk
	if err := os.WriteFile(tk.path, tk.profile, 0o600); err != nil {
		return fmt.Errorf("write the seccomp profile: %w", err)
	}
	// A bind that cannot be handed over waits at most until the old
	// container's stop has had its grace after the deadline: by then the
	// swap has fallen back and the old socket is gone.
	deadline := r.e.now().Add(tk.deadline + r.gracePeriod() + 2*r.hold.max + time.Minute)
	events := func(ev TakeoverEvent) {
		select {
		case tk.events <- ev:
		default:
		}
	}
	if err := r.e.taker.Register(r.rec.Id, r.t.pid, deadline, events); err != nil {
		return err
	}
	tk.registered = true
	req := proto.Clone(r.newReq).(*runtimeapi.CreateContainerRequest)
	trap(req.Config, tk.path)
	return r.createNew(req)
}

// trap gives cfg (a copy) the Localhost seccomp profile at path.
func trap(cfg *runtimeapi.ContainerConfig, path string) {
	if cfg.Linux == nil {
		cfg.Linux = &runtimeapi.LinuxContainerConfig{}
	}
	if cfg.Linux.SecurityContext == nil {
		cfg.Linux.SecurityContext = &runtimeapi.LinuxContainerSecurityContext{}
	}
	sc := cfg.Linux.SecurityContext
	sc.Seccomp = &runtimeapi.SecurityProfile{ProfileType: runtimeapi.SecurityProfile_Localhost, LocalhostRef: path}
	sc.SeccompProfilePath = "" //nolint:staticcheck // the deprecated spelling must not contradict the profile
}

// doStartOverlap starts the new container while the old one runs.
func (r *run) doStartOverlap() error {
	r.rec.Takeover = &inplacedv1.TakeoverRecord{}
	for _, p := range r.tk.ports {
		r.rec.Takeover.Ports = append(r.rec.Takeover.Ports, uint32(p))
	}
	_, err := runToEnd(r.ctx, func(ctx context.Context) (*runtimeapi.StartContainerResponse, error) {
		return r.e.rt.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: r.newID})
	})
	r.newAt = r.e.now()
	return err
}

// fellBack is the handover's verdict that the overlap cannot be: the swap
// goes on as stop-first with the hold (fallbackPlan).
type fellBack struct{ why string }

func (f *fellBack) Error() string { return "overlap fell back to stop-first: " + f.why }

// handoverPoll is how often the handover looks at the new container.
const handoverPoll = 100 * time.Millisecond

// doHandover waits until the new container's bind() of every port the old
// one listens on got the old socket. A refused bind, or the deadline,
// make the swap fall back; the new container's exit fails it (undo: the
// new container goes, the old one never stopped).
func (r *run) doHandover() error {
	tk := r.tk
	deadline := time.NewTimer(max(time.Until(r.newAt.Add(tk.deadline)), 0))
	defer deadline.Stop()
	tick := time.NewTicker(handoverPoll)
	defer tick.Stop()
	for len(tk.missing()) > 0 {
		select {
		case ev := <-tk.events:
			if err := r.handoverEvent(ev); err != nil {
				return err
			}
		case <-deadline.C:
			return r.fallBack(fmt.Sprintf("the new container did not bind port %s within %s", joinPorts(tk.missing()), tk.deadline))
		case <-tick.C:
			if err := r.newRunning(); err != nil {
				return err
			}
		case <-r.ctx.Done():
			return context.Cause(r.ctx)
		}
	}
	r.rec.Takeover.HandoverNs = int64(r.e.now().Sub(r.newAt))
	return nil
}

// handoverEvent records a handover, or falls back on a refusal.
func (r *run) handoverEvent(ev TakeoverEvent) error {
	tk := r.tk
	if !ev.HandedOver {
		return r.fallBack(fmt.Sprintf("port %d cannot be handed over: %s", ev.Port, ev.Reason))
	}
	if !slices.Contains(tk.handed, ev.Port) {
		tk.handed = append(tk.handed, ev.Port)
		r.rec.Takeover.HandedOver = append(r.rec.Takeover.HandedOver, uint32(ev.Port))
		r.emit(StepHandover, fmt.Sprintf("port %d handed over", ev.Port))
	}
	return nil
}

// missing are the old container's ports not handed over yet.
func (tk *takeoverRun) missing() []uint16 {
	var out []uint16
	for _, p := range tk.ports {
		if !slices.Contains(tk.handed, p) {
			out = append(out, p)
		}
	}
	return out
}

// newRunning fails when the new container no longer runs.
func (r *run) newRunning() error {
	st, err := r.e.rt.ContainerStatus(r.ctx, &runtimeapi.ContainerStatusRequest{ContainerId: r.newID})
	if err != nil {
		if runtimeDown(err) {
			return nil
		}
		return fmt.Errorf("new container status: %w", err)
	}
	return notRunning(r.newID, st.GetStatus())
}

// fallBack records why the overlap became stop-first.
func (r *run) fallBack(why string) error {
	r.rec.Strategy = string(strategy.StopFirst)
	r.rec.StrategyWhy = fmt.Sprintf("overlap fell back to stop-first with the connection hold: %s", why)
	r.rec.Takeover.FellBack = true
	r.log.Warn("overlap fell back to stop-first", zap.String("why", why))
	return &fellBack{why: why}
}

// endTakeover ends the overlap's part when the swap ends: the agent lets
// every later bind of the new container continue (its filter stays for
// the container's life), and the profile file goes.
func (r *run) endTakeover() {
	tk := r.tk
	if tk == nil {
		return
	}
	if tk.registered {
		r.e.taker.Unregister(r.rec.Id)
		tk.registered = false
	}
	if err := os.Remove(tk.path); err != nil && !errors.Is(err, os.ErrNotExist) {
		r.log.Warn("remove the swap's seccomp profile", zap.String("path", tk.path), zap.Error(err))
	}
}

// sweepProfiles removes the seccomp profiles a crashed inplaced left: no
// swap runs when the engine is made.
func sweepProfiles(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("seccomp profile dir: %w", err)
	}
	// The profiles name the agent's socket, which runc trusts with notify
	// fds: the directory is root's alone.
	if err := os.Chmod(dir, 0o700); err != nil {
		return fmt.Errorf("seccomp profile dir: %w", err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("seccomp profile dir: %w", err)
	}
	for _, e := range ents {
		if filepath.Ext(e.Name()) == ".json" {
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil {
				return fmt.Errorf("remove a profile left by a crash: %w", err)
			}
		}
	}
	return nil
}
