package hold

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/inplaced/inplaced/pkg/holdmode"
	"github.com/inplaced/inplaced/pkg/internal/netns"
)

// Release reasons.
const (
	ReasonListening = "listening" // a new socket listens on the port
	ReasonLimit     = "limit"     // the hold reached its maximum
	ReasonAborted   = "aborted"   // Abort, or the caller's context ended
)

const (
	// queueBase is the first queue number; queue numbers are per netns, so
	// a fixed range serves every pod. A second hold in the same netns (two
	// containers of a pod swapped at once) takes the next slot.
	queueBase = 18176
	slots     = 4
	// MaxPorts bounds the ports of one hold (one queue number each).
	MaxPorts = 64

	pollEvery = time.Millisecond
	// settle is how long the release waits after deleting a port's rule
	// before the verdict, so the reader has seen every SYN parked until
	// then; straggle is the wait before the second verdict.
	settle   = 2 * time.Millisecond
	straggle = 5 * time.Millisecond
)

// PortResult is how one port's hold ended.
type PortResult struct {
	Port   uint16
	Parked int // SYNs parked (queue mode; retransmits count too)
	// Reason is ReasonListening, ReasonLimit or ReasonAborted.
	Reason string
	// HeldFor is from the install to the port's release; LongestWait is the
	// longest a parked SYN waited for its verdict (0 when none was parked).
	HeldFor, LongestWait time.Duration
	// Batches is how many verdicts released the parked SYNs, MaxBatch the
	// largest, Backlog the new listener's backlog they were paced to (0
	// when no new listener took them: one batch, as at the limit).
	Batches, MaxBatch, Backlog int
}

// Result is how a hold ended.
type Result struct {
	Mode  holdmode.Mode
	Ports []PortResult
	// Duration is from the install to the last release.
	Duration time.Duration
	// Err is the first error of the release (the rules are gone all the
	// same when the socket closes: owner flag).
	Err error
}

// Parked sums the parked SYNs.
func (r Result) Parked() int {
	n := 0
	for _, p := range r.Ports {
		n += p.Parked
	}
	return n
}

// Held is a hold in place.
type Held struct {
	mode holdmode.Mode
	why  string
	ns   *os.File
	d    *diag
	q    *queue // nil in drop mode
	rs   *ruleset
	name string
	num  map[uint16]uint16
	// before are the inodes of the sockets listening when the hold began:
	// a port is released for sockets not among them. need is, per port,
	// the families those sockets took (IPv4, IPv6 or both): the port is
	// released once new sockets take them all (a port nobody listened on
	// needs any one listener).
	before   map[uint32]bool
	need     map[uint16]int
	start    time.Time
	ports    []uint16
	oneBatch bool

	mu       sync.Mutex
	released map[uint16]PortResult
	ended    bool
	result   Result
}

// Hold installs a hold on ports in the network namespace at netnsPath. The
// mode used may be weaker than asked (queue → drop): Mode and Why say. When
// it returns an error nothing is installed.
func Hold(ctx context.Context, netnsPath string, ports []uint16, mode holdmode.Mode, opts ...Option) (_ *Held, retErr error) {
	if mode != holdmode.Queue && mode != holdmode.Drop {
		return nil, fmt.Errorf("hold: mode %q holds nothing", mode)
	}
	if len(ports) == 0 || len(ports) > MaxPorts {
		return nil, fmt.Errorf("hold: %d ports: give 1 to %d", len(ports), MaxPorts)
	}
	ns, err := netns.Open(netnsPath)
	if err != nil {
		return nil, err
	}
	// Not the named result: a failing `return nil, err` sets that to nil
	// before the undo below runs, which would then close nothing and panic.
	h := &Held{ns: ns, mode: mode, start: time.Now(), ports: slices.Clone(ports), released: map[uint16]PortResult{}}
	for _, o := range opts {
		o(h)
	}
	defer func() {
		if retErr != nil {
			h.closeAll()
		}
	}()
	var others bool
	if err := netns.Run(ns, func() (err error) {
		if h.d, err = newDiag(); err != nil {
			return err
		}
		if mode == holdmode.Queue {
			others = queueInUse()
		}
		return nil
	}); err != nil {
		return nil, err
	}
	ls, err := h.d.listeners()
	if err != nil {
		return nil, err
	}
	h.before, h.need = map[uint32]bool{}, map[uint16]int{}
	for _, l := range ls {
		h.before[l.inode] = true
		if slices.Contains(h.ports, l.port) {
			h.need[l.port] |= l.takes()
		}
	}
	if others {
		h.mode, h.why = holdmode.Drop, "another program uses nfnetlink_queue in this network namespace"
	}
	if err := h.installFreeSlot(ctx); err != nil {
		return nil, err
	}
	return h, nil
}

// installFreeSlot installs the hold in the first free slot, falling back
// from queue to drop where the queue cannot be used.
func (h *Held) installFreeSlot(ctx context.Context) error {
	for slot := 0; slot < slots; slot++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		err := h.installSlot(slot)
		if err == nil {
			h.start = time.Now()
			return nil
		}
		if !errors.Is(err, unix.EEXIST) && !errors.Is(err, unix.EBUSY) && !errors.Is(err, unix.EPERM) {
			if h.mode == holdmode.Queue {
				// Never hold what cannot be released: no queue, no
				// queue rule. Drop needs no userspace part.
				h.mode, h.why = holdmode.Drop, fmt.Sprintf("queue unusable: %v", err)
				slot--
				continue
			}
			return err
		}
	}
	return fmt.Errorf("hold: %d holds already in this network namespace", slots)
}

// installSlot binds the slot's queues (queue mode) and installs its table.
func (h *Held) installSlot(slot int) error {
	h.name = fmt.Sprintf("%s_%d", TablePrefix, slot)
	h.num = map[uint16]uint16{}
	for i, p := range h.ports {
		h.num[p] = uint16(queueBase + slot*MaxPorts + i)
	}
	a := action{drop: h.mode == holdmode.Drop, num: h.num}
	if h.mode == holdmode.Queue {
		if err := netns.Run(h.ns, func() (err error) { h.q, err = newQueue(); return err }); err != nil {
			return err
		}
		for _, p := range h.ports {
			if err := h.q.bind(h.num[p]); err != nil {
				h.q.close()
				h.q = nil
				return err
			}
		}
		h.q.start()
	}
	rs, err := install(h.ns, h.name, h.ports, a)
	if err != nil {
		if h.q != nil {
			h.q.close()
			h.q = nil
		}
		return err
	}
	h.rs = rs
	if rs.compat && h.why == "" {
		h.why = "native nft queue expression missing: xtables NFQUEUE through nft_compat"
	}
	return nil
}

// queueInUse reports whether some queue of the current thread's netns is
// bound: deleting our chain would drop that program's queued packets too.
func queueInUse() bool {
	b, err := os.ReadFile("/proc/thread-self/net/netfilter/nfnetlink_queue")
	return err == nil && len(strings.TrimSpace(string(b))) > 0
}

// Mode is the mode in place; Why says why it is not the one asked, or how
// it was installed (empty when as asked, natively).
func (h *Held) Mode() holdmode.Mode { return h.mode }
func (h *Held) Why() string         { return h.why }

// Ports are the held ports; Table the nftables table with their rules.
func (h *Held) Ports() []uint16 { return slices.Clone(h.ports) }
func (h *Held) Table() string   { return h.name }

// Quiesce waits, at most max, until the accept queues of the sockets that
// listened on the held ports when the hold began are empty: a connection
// the kernel completed before the hold would be reset when the old process
// closes its socket without accepting it. It returns how long it waited.
func (h *Held) Quiesce(ctx context.Context, max time.Duration) time.Duration {
	start := time.Now()
	deadline := start.Add(max)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		ls, err := h.d.listeners()
		if err != nil {
			break
		}
		busy := false
		for _, l := range ls {
			if h.before[l.inode] && l.rqueue > 0 && slices.Contains(h.ports, l.port) {
				busy = true
			}
		}
		if !busy {
			break
		}
		time.Sleep(pollEvery)
	}
	return time.Since(start)
}

// Option changes how a hold releases.
type Option func(*Held)

// OneBatch releases every parked SYN of a port with one verdict, however
// small the new listener's backlog (the release before pacing; kept for
// the benchmark that compares the two).
func OneBatch() Option { return func(h *Held) { h.oneBatch = true } }

// ReleaseWhenListening releases each port as soon as new sockets listen on
// it (Listen), and all that are left when max has passed since the hold
// began, or when ctx ends or Abort is called; then it removes the table.
// Every release accepts: past the limit the kernel answers a SYN to a port
// nobody listens on with a reset, as without a hold.
func (h *Held) ReleaseWhenListening(ctx context.Context, max time.Duration) Result {
	missing := h.Listen(ctx, h.start.Add(max))
	switch {
	case ctx.Err() != nil:
		return h.end(ReasonAborted)
	case len(missing) > 0:
		return h.end(ReasonLimit)
	}
	return h.end(ReasonListening)
}

// Start is when the hold was in place.
func (h *Held) Start() time.Time { return h.start }

// Listen releases each port as soon as sockets that were not there when the
// hold began listen on it for every family the old ones took, until every
// port is released, until passes, or ctx ends or Abort is called. It
// returns the ports still held: those stay parked until the next Listen or
// the end.
func (h *Held) Listen(ctx context.Context, until time.Time) (missing []uint16) {
	t := time.NewTicker(pollEvery)
	defer t.Stop()
	for {
		if h.isEnded() {
			return nil
		}
		if ls, err := h.d.listeners(); err == nil {
			for port, fresh := range h.fresh(ls) {
				if h.holding(port) && fresh.takes&h.needOf(port) == h.needOf(port) {
					h.releasePort(port, ReasonListening)
				}
			}
		}
		missing = h.stillHeld()
		if len(missing) == 0 || ctx.Err() != nil || !time.Now().Before(until) {
			return missing
		}
		select {
		case <-ctx.Done():
		case <-t.C:
		}
	}
}

// freshPort is what listens on a held port that did not when the hold
// began: the families it takes, and the room in its accept queue.
type freshPort struct {
	takes int
	room  int
	// backlog is the smallest backlog among the new listeners.
	backlog int
}

// fresh sums up, per port, the sockets that listen now and did not when
// the hold began. With more than one (IPv4 and IPv6 sockets), the room is
// the smallest: a released SYN goes to either.
func (h *Held) fresh(ls []listener) map[uint16]freshPort {
	out := map[uint16]freshPort{}
	for _, l := range ls {
		if h.before[l.inode] || !slices.Contains(h.ports, l.port) {
			continue
		}
		// The accept queue takes backlog+1; a SYN released into a full
		// one is dropped and its client retransmits a second later. One
		// slot stays free for a SYN that arrives meanwhile.
		room := int(l.backlog) - int(l.rqueue)
		if l.rqueue == 0 {
			room = max(room, 1)
		}
		f, seen := out[l.port]
		if !seen || room < f.room {
			f.room, f.backlog = room, int(l.backlog)
		}
		f.takes |= l.takes()
		out[l.port] = f
	}
	return out
}

func (h *Held) needOf(port uint16) int {
	if n := h.need[port]; n != 0 {
		return n
	}
	return takesV4 // any listener takes one family at least
}

// Abort releases every port still held (accepting what is parked) and
// removes the table. It is safe at any time and more than once.
func (h *Held) Abort() Result { return h.end(ReasonAborted) }

// End releases every port still held with reason (ReasonLimit,
// ReasonAborted) and removes the table; a port released before keeps its
// own reason. Safe more than once.
func (h *Held) End(reason string) Result { return h.end(reason) }

// Result is the hold's result so far (final once released).
func (h *Held) Result() Result {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ended {
		return h.result
	}
	return h.resultLocked()
}

func (h *Held) isEnded() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.ended
}

func (h *Held) holding(port uint16) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	_, done := h.released[port]
	return !h.ended && slices.Contains(h.ports, port) && !done
}

func (h *Held) stillHeld() []uint16 {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []uint16
	for _, p := range h.ports {
		if _, done := h.released[p]; !done && !h.ended {
			out = append(out, p)
		}
	}
	return out
}

// releasePort deletes the port's rule, then accepts what it parked, paced
// to the new listener's accept queue.
func (h *Held) releasePort(port uint16, reason string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, done := h.released[port]; done || h.ended {
		return
	}
	h.releaseLocked(port, reason)
}

// paceFor bounds the paced release of one port: past it, whatever is still
// parked goes in one batch (a listener that accepts nothing for that long
// would not take them any sooner).
const paceFor = 2 * time.Second

func (h *Held) releaseLocked(port uint16, reason string) {
	var errs []error
	pr := PortResult{Port: port, Reason: reason}
	if h.q != nil && reason == ReasonListening && !h.oneBatch {
		// While the rule stays, a SYN that comes meanwhile is parked
		// behind the others instead of racing them for the accept queue;
		// the rule goes once the new listener has taken what was parked,
		// so that the SYNs that come straight to it find room.
		errs = append(errs, h.paceUntilTaken(port, &pr))
	}
	errs = append(errs, h.rs.unhold(port))
	if h.q != nil {
		// Let the reader see every SYN parked until the rule went; then
		// once more for stragglers.
		time.Sleep(settle)
		errs = append(errs, h.pace(port, &pr))
		time.Sleep(straggle)
		errs = append(errs, h.pace(port, &pr))
	}
	pr.HeldFor = time.Since(h.start)
	h.released[port] = pr
	if err := errors.Join(errs...); err != nil && h.result.Err == nil {
		h.result.Err = fmt.Errorf("release port %d: %w", port, err)
	}
}

// paceUntilTaken paces the parked SYNs until none is left and the new
// listener's accept queue is empty, bounded by paceFor.
func (h *Held) paceUntilTaken(port uint16, pr *PortResult) error {
	deadline := time.Now().Add(paceFor)
	for {
		if err := h.pace(port, pr); err != nil {
			return err
		}
		if h.taken(port) || !time.Now().Before(deadline) {
			return nil
		}
		time.Sleep(pollEvery / 4)
	}
}

// taken reports whether the new listeners of port have accepted every
// connection in their queue (or are gone: nothing to wait for).
func (h *Held) taken(port uint16) bool {
	ls, err := h.d.listeners()
	if err != nil {
		return true
	}
	for _, l := range ls {
		if l.port == port && !h.before[l.inode] && l.rqueue > 0 {
			return false
		}
	}
	return true
}

// pace accepts the SYNs parked on port in batches that fit the new
// listener's accept queue, reading its length (sock_diag) before each; with
// no new listener (the limit, an abort) or OneBatch, all at once.
func (h *Held) pace(port uint16, pr *PortResult) error {
	num := h.num[port]
	deadline := time.Now().Add(paceFor)
	for h.q.pending(num) > 0 {
		n := -1
		if !h.oneBatch && pr.Reason == ReasonListening && time.Now().Before(deadline) {
			ls, err := h.d.listeners()
			if err != nil {
				return err
			}
			f, ok := h.fresh(ls)[port]
			if !ok {
				return fmt.Errorf("port %d: the new listener went away", port) // accepted at the end
			}
			pr.Backlog = f.backlog
			if n = f.room; n <= 0 {
				time.Sleep(pollEvery / 4)
				continue
			}
		}
		got, waited, err := h.q.accept(num, n)
		pr.Parked += got
		pr.Batches++
		pr.MaxBatch = max(pr.MaxBatch, got)
		pr.LongestWait = max(pr.LongestWait, waited)
		if err != nil {
			return err
		}
		if h.q.pending(num) > 0 {
			// Let the handshakes complete, so the next read counts them.
			time.Sleep(pollEvery / 4)
		}
	}
	return nil
}

// end releases whatever is still held with reason, removes the table and
// closes every socket. Idempotent.
func (h *Held) end(reason string) Result {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ended {
		return h.result
	}
	for _, p := range h.ports {
		if _, done := h.released[p]; !done {
			h.releaseLocked(p, reason)
		}
	}
	// Whatever pacing left (its listener went away) is accepted before the
	// table goes: removing the chain would drop it.
	if h.q != nil {
		for _, p := range h.ports {
			if n, _, err := h.q.accept(h.num[p], -1); n > 0 || err != nil {
				pr := h.released[p]
				pr.Parked += n
				h.released[p] = pr
			}
		}
	}
	if err := h.rs.remove(); err != nil && h.result.Err == nil {
		h.result.Err = fmt.Errorf("remove %s: %w", h.name, err)
	}
	h.rs = nil
	h.closeAll()
	h.result = h.resultLocked()
	h.ended = true
	return h.result
}

func (h *Held) resultLocked() Result {
	r := Result{Mode: h.mode, Err: h.result.Err}
	for _, p := range h.ports {
		if pr, ok := h.released[p]; ok {
			r.Ports = append(r.Ports, pr)
			r.Duration = max(r.Duration, pr.HeldFor)
		}
	}
	return r
}

// closeAll closes the sockets and the namespace; the rules' socket closes
// with remove (or here, when the hold failed half-way).
func (h *Held) closeAll() {
	if h.rs != nil {
		_ = h.rs.c.CloseLasting()
		h.rs = nil
	}
	if h.q != nil {
		h.q.close()
		h.q = nil
	}
	if h.d != nil {
		h.d.close()
		h.d = nil
	}
	if h.ns != nil {
		h.ns.Close()
		h.ns = nil
	}
}
