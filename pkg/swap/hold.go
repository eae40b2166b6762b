package swap

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/pkg/holdmode"
	"github.com/inplaced/inplaced/pkg/store"
	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

// Pod annotations for the connection hold (kubelet copies a pod's
// annotations into its sandbox config, where the swap reads them).
const (
	AnnotationConnectionHold = "inplaced.io/connection-hold"
	AnnotationHoldMax        = "inplaced.io/hold-max"
	// AnnotationRequireListeners "false" lets a swap commit whose new
	// container has not listened by the hold's limit on every port the old
	// one listened on (by default it rolls back).
	AnnotationRequireListeners = "inplaced.io/require-listeners"
)

// StepConnectionHold is the step that installs the connection hold (and
// quiesces the old listener), named "hold" in swap records and events as
// users know it; the hold itself ends later, in the record's Hold.
const StepConnectionHold = "hold"

// quiesceMax bounds the wait for the old listener's accept queue to empty.
const quiesceMax = 200 * time.Millisecond

// Holder keeps a container's ports from refusing new connections while the
// container is swapped: new SYNs are parked (or dropped) in the pod's network
// namespace from before the old container is stopped until a new socket
// listens. Package hold does it; the engine sees only this interface.
type Holder interface {
	// Ports finds the TCP ports to hold: those the container's processes
	// (pid is its init) listen on in netns, and declared ports nobody else
	// in the pod listens on.
	Ports(netns string, pid int, declared []uint16) (HoldPorts, error)
	// Hold installs the hold. The mode in place may be weaker than asked
	// (queue → drop); ActiveHold says which and why.
	Hold(ctx context.Context, netns string, ports []uint16, mode holdmode.Mode) (ActiveHold, error)
	// Remove deletes whatever hold a crashed inplaced left in netns.
	Remove(netns string) ([]string, error)
}

// HoldPorts are the ports Holder.Ports found.
type HoldPorts struct {
	// Hold are the ports to hold; Listened those of them the container's
	// processes listen on (the others are only declared).
	Hold, Listened []uint16
}

// ActiveHold is a hold in place.
type ActiveHold interface {
	Mode() holdmode.Mode
	Why() string
	// Start is when the hold was in place.
	Start() time.Time
	// Quiesce waits (at most max) until the old listener's accept queue is
	// empty, so the stop resets no connection the kernel completed.
	Quiesce(ctx context.Context, max time.Duration) time.Duration
	// Listen releases each port when new sockets listen on it, until every
	// port is released, until passes or ctx ends; it returns the ports
	// still held (they stay parked).
	Listen(ctx context.Context, until time.Time) (missing []uint16)
	// End releases what is still held with reason and removes the hold.
	End(reason string) HoldResult
}

// HoldResult is how a hold ended.
type HoldResult struct {
	Ports       []HoldPortResult
	Duration    time.Duration
	LongestWait time.Duration
	Reason      string // listening, limit or aborted (the last port's)
	Err         error
}

// HoldPortResult is how one port's hold ended.
type HoldPortResult struct {
	Port                       uint16
	Parked                     int64
	LongestWait                time.Duration
	Reason                     string
	Batches, MaxBatch, Backlog int
}

// Parked sums the SYNs parked on every port.
func (r HoldResult) Parked() int64 {
	var n int64
	for _, p := range r.Ports {
		n += p.Parked
	}
	return n
}

// Release reasons of a hold (HoldResult.Reason).
const (
	HoldReleasedListening = "listening"
	HoldReleasedLimit     = "limit"
	HoldReleasedAborted   = "aborted"
)

// holdPlan is what the engine will do about connections for one swap.
type holdPlan struct {
	mode holdmode.Mode
	max  time.Duration
	why  string // why off, or what was ignored
	// requireListeners: the new container must listen by max on every port
	// the old one listened on, or the swap rolls back.
	requireListeners bool
}

// planHold decides the mode and limit from the engine's defaults and the
// pod's annotations: decide, then do (no side effect here).
func planHold(defMode holdmode.Mode, defMax time.Duration, haveHolder bool, sb *runtimeapi.PodSandboxConfig) holdPlan {
	p := holdPlan{mode: defMode, max: defMax, requireListeners: true}
	explicit, notes := p.annotations(sb.GetAnnotations())
	switch {
	case p.mode == holdmode.Off && explicit:
		notes = append(notes, "off by the pod's annotation "+AnnotationConnectionHold)
	case p.mode == holdmode.Off:
		notes = append(notes, "off (--connection-hold=off)")
	case sb.GetLinux().GetSecurityContext().GetNamespaceOptions().GetNetwork() == runtimeapi.NamespaceMode_NODE && !explicit:
		p.mode = holdmode.Off
		notes = append(notes, "hostNetwork pod: the node's own network namespace is held only when the pod opts in ("+AnnotationConnectionHold+": queue)")
	case !haveHolder:
		p.mode = holdmode.Off
		notes = append(notes, "no connection holder in this inplaced")
	}
	p.why = strings.Join(notes, "; ")
	return p
}

// annotations applies the pod's hold annotations; it says whether the mode
// was the pod's choice, and what it ignored.
func (p *holdPlan) annotations(a map[string]string) (explicit bool, notes []string) {
	if v, ok := a[AnnotationConnectionHold]; ok {
		if m, err := holdmode.Parse(v); err == nil {
			p.mode, explicit = m, true
		} else {
			notes = append(notes, fmt.Sprintf("annotation %s=%q ignored: use %s", AnnotationConnectionHold, v, holdmode.Choices()))
		}
	}
	if v, ok := a[AnnotationHoldMax]; ok {
		if d, err := time.ParseDuration(strings.TrimSpace(v)); err == nil && d > 0 && d <= maxHoldMax {
			p.max = d
		} else {
			notes = append(notes, fmt.Sprintf("annotation %s=%q ignored: give a duration up to %s, e.g. 10s", AnnotationHoldMax, v, maxHoldMax))
		}
	}
	if v, ok := a[AnnotationRequireListeners]; ok {
		switch strings.TrimSpace(strings.ToLower(v)) {
		case "false":
			p.requireListeners = false
		case "true":
		default:
			notes = append(notes, fmt.Sprintf("annotation %s=%q ignored: use \"true\" or \"false\"", AnnotationRequireListeners, v))
		}
	}
	return explicit, notes
}

// maxHoldMax bounds --hold-max and the annotation: a held client waits in
// SYN-SENT, and past its connect timeout a refusal would have been kinder.
const maxHoldMax = 5 * time.Minute

// declaredPorts reads the TCP container ports kubelet records in the
// container's annotations.
func declaredPorts(cfg *runtimeapi.ContainerConfig) []uint16 {
	var ports []struct {
		ContainerPort int32  `json:"containerPort"`
		Protocol      string `json:"protocol"`
	}
	_ = json.Unmarshal([]byte(cfg.GetAnnotations()["io.kubernetes.container.ports"]), &ports)
	var out []uint16
	for _, p := range ports {
		if (p.Protocol == "" || strings.EqualFold(p.Protocol, "TCP")) && p.ContainerPort > 0 && p.ContainerPort < 65536 {
			out = append(out, uint16(p.ContainerPort))
		}
	}
	return out
}

// connectionHold decides what the swap does about new connections: the
// engine's defaults and the pod's annotations (planHold), and no hold where
// the sandbox runs a network stack of its own. A kubelet-driven swap never
// rolls back for a port (kubelet's probes judge the spec's image): its
// record and the pod's events say so instead.
func (r *run) connectionHold() holdPlan {
	plan := planHold(r.e.holdMode, r.e.holdMax, r.e.holder != nil, r.oldReq.SandboxConfig)
	if why := r.e.ownNetworkStack(r.t.identity); why != "" && plan.mode != holdmode.Off {
		plan.mode, plan.why = holdmode.Off, why
	}
	if r.rec.Kind == KindKubelet || r.e.listenersOptional {
		plan.requireListeners = false
	}
	return plan
}

// recordNoHold records why the swap installs no hold.
func (r *run) recordNoHold() error {
	r.rec.Hold = &inplacedv1.HoldRecord{Mode: string(holdmode.Off), Why: r.hold.why}
	return nil
}

// holdConnections is the hold step, just before the old container stops:
// it finds the container's ports, journals them (so that a crash leaves a
// table recovery can remove), installs the hold, waits for the old process
// to stop accepting, and lets a goroutine release each port once new
// sockets listen on it (watchHold). Nothing it does can fail the swap:
// without a hold the swap runs as it would otherwise.
func (r *run) holdConnections() error {
	rec := &inplacedv1.HoldRecord{Mode: string(holdmode.Off), Why: r.hold.why}
	r.rec.Hold = rec
	h, listened, err := r.installHold(rec)
	if h == nil {
		return err
	}
	r.holdDone = make(chan HoldResult, 1)
	r.listeners = make(chan []uint16, 1)
	r.holdListened = listened
	r.newStarted = make(chan struct{})
	if !r.newAt.IsZero() { // an overlap that fell back: the new container runs already
		r.newOnce.Do(func() { close(r.newStarted) })
	}
	go r.watchHold(r.ctx, h)
	return nil
}

// watchHold releases each port when the new container listens on it. At
// the limit, the ports the old container listened on and the new one has
// not are the swap's verdict (listeners): when the swap must roll back for
// them they stay held, so that the rolled-back container's listener takes
// the parked SYNs, for one more limit at most. The rest are released.
func (r *run) watchHold(ctx context.Context, h ActiveHold) {
	missing := h.Listen(ctx, h.Start().Add(r.hold.max))
	if r.hold.requireListeners && len(r.required(missing)) > 0 {
		missing = r.listenAfterStart(ctx, h)
	}
	never := r.required(missing)
	r.neverListened = never
	if r.hold.requireListeners {
		r.listeners <- never
		if len(never) > 0 && ctx.Err() == nil {
			missing = h.Listen(ctx, time.Now().Add(r.hold.max))
		}
	} else {
		r.listeners <- nil
	}
	reason := HoldReleasedListening
	switch {
	case ctx.Err() != nil:
		reason = HoldReleasedAborted
	case len(missing) > 0:
		reason = HoldReleasedLimit
	}
	res := h.End(reason)
	r.emit(StepConnectionHold, fmt.Sprintf("released %s after %s (%s): %d connection attempts parked", portList(res.Ports),
		res.Duration.Round(time.Millisecond), res.Reason, res.Parked()))
	r.holdDone <- res
}

// listenAfterStart gives the new container the whole limit from its start
// to listen, when the old one's stop took part of it: the verdict is about
// the new version, not about how long the old one took to drain.
func (r *run) listenAfterStart(ctx context.Context, h ActiveHold) []uint16 {
	select {
	case <-r.newStarted:
	case <-ctx.Done():
	}
	return h.Listen(ctx, r.newAt.Add(r.hold.max))
}

// required are the ports among missing that the old container listened on.
func (r *run) required(missing []uint16) []uint16 {
	var out []uint16
	for _, p := range missing {
		if slices.Contains(r.holdListened, p) {
			out = append(out, p)
		}
	}
	return out
}

// markStarted records that start-new has run (or will not): the hold's
// watcher measures the new container's time to listen from here.
func (r *run) markStarted() {
	if r.newStarted == nil {
		return
	}
	r.newOnce.Do(func() {
		r.newAt = r.e.now()
		close(r.newStarted)
	})
}

// awaitListeners is the health gate's part of the hold: the new container
// must listen on every port the old one listened on by the hold's limit.
func (r *run) awaitListeners(ctx context.Context) error {
	select {
	case never := <-r.listeners:
		if len(never) > 0 {
			return fmt.Errorf("the new container did not listen on port %s within %s (the old one did; the pod opts out with %s: \"false\")",
				joinPorts(never), r.hold.max, AnnotationRequireListeners)
		}
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

func joinPorts(ports []uint16) string {
	s := make([]string, len(ports))
	for i, p := range ports {
		s[i] = fmt.Sprint(p)
	}
	return strings.Join(s, ", ")
}

func portList(ps []HoldPortResult) string {
	ports := make([]uint16, len(ps))
	for i, p := range ps {
		ports[i] = p.Port
	}
	return "[" + joinPorts(ports) + "]"
}

// installHold installs the hold on the container's ports, if it listens on
// any; nil when there is nothing to hold or it failed (rec says why). It
// also returns the ports the old container listened on.
func (r *run) installHold(rec *inplacedv1.HoldRecord) (ActiveHold, []uint16, error) {
	found, err := r.e.holder.Ports(r.t.netns, r.t.pid, declaredPorts(r.oldReq.Config))
	if err != nil {
		rec.Why = fmt.Sprintf("finding the ports failed: %v", err)
		return nil, nil, err
	}
	ports := found.Hold
	if len(ports) == 0 {
		rec.Why = "the container listens on no TCP port and declares none (or only ports another container listens on)"
		return nil, nil, nil
	}
	for _, p := range ports {
		rec.Ports = append(rec.Ports, uint32(p))
	}
	r.j.Hold = &store.JournalHold{NetNS: r.t.netns, Ports: ports, Mode: string(r.hold.mode)}
	if err := r.journal(r.j.Step); err != nil {
		rec.Why = err.Error()
		return nil, nil, err
	}
	h, err := r.e.holder.Hold(r.ctx, r.t.netns, ports, r.hold.mode)
	if err != nil {
		rec.Why = fmt.Sprintf("installing the hold failed: %v", err)
		return nil, nil, err
	}
	rec.StartedUnixNano = h.Start().UnixNano()
	rec.Mode, rec.Why = string(h.Mode()), strings.Trim(r.hold.why+"; "+h.Why(), "; ")
	rec.QuiesceNs = int64(h.Quiesce(r.ctx, quiesceMax))
	return h, found.Listened, nil
}

// endHold waits for the hold's release (bounded by its limit) and records
// it. Called when the swap ends, whatever the outcome.
func (r *run) endHold() {
	if r.holdDone == nil {
		return
	}
	res := <-r.holdDone
	r.holdDone = nil
	h := r.rec.Hold
	h.DurationNs, h.Parked, h.Reason, h.LongestWaitNs = int64(res.Duration), res.Parked(), res.Reason, int64(res.LongestWait)
	for _, p := range res.Ports {
		h.PortResults = append(h.PortResults, &inplacedv1.HoldPort{Port: uint32(p.Port), Parked: p.Parked,
			LongestWaitNs: int64(p.LongestWait), Reason: p.Reason, Batches: int32(p.Batches), MaxBatch: int32(p.MaxBatch),
			Backlog: int32(p.Backlog), Listened: slices.Contains(r.holdListened, p.Port)})
	}
	for _, p := range r.neverListened {
		h.NeverListened = append(h.NeverListened, uint32(p))
	}
	if res.Err != nil {
		h.Why = strings.Trim(h.Why+"; release: "+res.Err.Error(), "; ")
	}
	r.log.Info("connection hold ended", zap.String("mode", h.Mode), zap.String("ports", portList(res.Ports)),
		zap.Duration("held", res.Duration), zap.Int64("parked", res.Parked()), zap.String("reason", res.Reason),
		zap.Duration("longest_wait", res.LongestWait), zap.Uint32s("never_listened", h.NeverListened))
}

// recoverHold removes the table of a hold a crashed inplaced left behind
// (the kernel has done it where it supports table owners).
func (e *Engine) recoverHold(j *store.JournalEntry, rec *inplacedv1.SwapRecord, log *zap.Logger) {
	if j.Hold == nil || e.holder == nil {
		return
	}
	removed, err := e.holder.Remove(j.Hold.NetNS)
	if rec.Hold == nil {
		rec.Hold = &inplacedv1.HoldRecord{Mode: j.Hold.Mode}
		for _, p := range j.Hold.Ports {
			rec.Hold.Ports = append(rec.Hold.Ports, uint32(p))
		}
	}
	rec.Hold.Reason = "crash-recovered"
	switch {
	case err != nil:
		log.Error("remove the connection hold left by a crash", zap.String("netns", j.Hold.NetNS), zap.Error(err))
	case len(removed) > 0:
		log.Warn("removed the connection hold left by a crash", zap.String("netns", j.Hold.NetNS), zap.Strings("tables", removed))
	}
}
