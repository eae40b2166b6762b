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
)

// Mode is how connection attempts are held.
type Mode string

const (
	// ModeQueue parks SYNs in NFQUEUE and accepts them when the port listens.
	ModeQueue Mode = "queue"
	// ModeDrop drops SYNs during the window; clients retransmit (~1 s).
	ModeDrop Mode = "drop"
	// ModeOff holds nothing.
	ModeOff Mode = "off"
)

// ParseMode reads a mode as the flag and the annotation spell it.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(strings.TrimSpace(strings.ToLower(s))); m {
	case ModeQueue, ModeDrop, ModeOff:
		return m, nil
	}
	return "", fmt.Errorf("connection hold %q: use queue, drop or off", s)
}

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
	// HeldFor is from the install to the port's release; LongestWait from
	// its first parked SYN to the release (0 when none was parked).
	HeldFor, LongestWait time.Duration
}

// Result is how a hold ended.
type Result struct {
	Mode  Mode
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
	mode Mode
	why  string
	ns   *os.File
	d    *diag
	q    *queue // nil in drop mode
	rs   *ruleset
	name string
	num  map[uint16]uint16
	// before are the inodes of the sockets listening when the hold began:
	// a port is released for a socket not among them.
	before map[uint32]bool
	start  time.Time
	ports  []uint16

	mu       sync.Mutex
	released map[uint16]PortResult
	ended    bool
	result   Result
}

// Hold installs a hold on ports in the network namespace at netnsPath. The
// mode used may be weaker than asked (queue → drop): Mode and Why say. When
// it returns an error nothing is installed.
func Hold(ctx context.Context, netnsPath string, ports []uint16, mode Mode) (h *Held, retErr error) {
	if mode != ModeQueue && mode != ModeDrop {
		return nil, fmt.Errorf("hold: mode %q holds nothing", mode)
	}
	if len(ports) == 0 || len(ports) > MaxPorts {
		return nil, fmt.Errorf("hold: %d ports: give 1 to %d", len(ports), MaxPorts)
	}
	ns, err := openNetNS(netnsPath)
	if err != nil {
		return nil, err
	}
	h = &Held{ns: ns, mode: mode, start: time.Now(), ports: slices.Clone(ports), released: map[uint16]PortResult{}}
	defer func() {
		if retErr != nil {
			h.closeAll()
		}
	}()
	var others bool
	if err := inNetNS(ns, func() (err error) {
		if h.d, err = newDiag(); err != nil {
			return err
		}
		if mode == ModeQueue {
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
	h.before = map[uint32]bool{}
	for _, l := range ls {
		h.before[l.inode] = true
	}
	if others {
		h.mode, h.why = ModeDrop, "another program uses nfnetlink_queue in this network namespace"
	}
	for slot := 0; slot < slots; slot++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		err := h.installSlot(slot)
		if err == nil {
			h.start = time.Now()
			return h, nil
		}
		if !errors.Is(err, unix.EEXIST) && !errors.Is(err, unix.EBUSY) && !errors.Is(err, unix.EPERM) {
			if h.mode == ModeQueue {
				// Never hold what cannot be released: no queue, no
				// queue rule. Drop needs no userspace part.
				h.mode, h.why = ModeDrop, fmt.Sprintf("queue unusable: %v", err)
				slot--
				continue
			}
			return nil, err
		}
	}
	return nil, fmt.Errorf("hold: %d holds already in this network namespace", slots)
}

// installSlot binds the slot's queues (queue mode) and installs its table.
func (h *Held) installSlot(slot int) error {
	h.name = fmt.Sprintf("%s_%d", TablePrefix, slot)
	h.num = map[uint16]uint16{}
	for i, p := range h.ports {
		h.num[p] = uint16(queueBase + slot*MaxPorts + i)
	}
	a := action{drop: h.mode == ModeDrop, num: h.num}
	if h.mode == ModeQueue {
		if err := inNetNS(h.ns, func() (err error) { h.q, err = newQueue(); return err }); err != nil {
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
func (h *Held) Mode() Mode  { return h.mode }
func (h *Held) Why() string { return h.why }

// Ports are the held ports; Table the nftables table holding them.
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

// ReleaseWhenListening releases each port as soon as a socket listens on it
// that did not when the hold began, or all that are left when max has
// passed since the hold began, or when ctx ends or Abort is called; then it
// removes the table. Every release accepts: past the limit the kernel
// answers a SYN to a port nobody listens on with a reset, as without a hold.
func (h *Held) ReleaseWhenListening(ctx context.Context, max time.Duration) Result {
	deadline := h.start.Add(max)
	t := time.NewTicker(pollEvery)
	defer t.Stop()
	for {
		if h.isEnded() {
			return h.Result()
		}
		if ctx.Err() != nil {
			return h.end(ReasonAborted)
		}
		if !time.Now().Before(deadline) {
			return h.end(ReasonLimit)
		}
		if ls, err := h.d.listeners(); err == nil {
			for _, l := range ls {
				if !h.before[l.inode] && h.holding(l.port) {
					h.releasePort(l.port, ReasonListening)
				}
			}
		}
		if h.allReleased() {
			return h.end(ReasonListening)
		}
		select {
		case <-ctx.Done():
		case <-t.C:
		}
	}
}

// Abort releases every port still held (accepting what is parked) and
// removes the table. It is safe at any time and more than once.
func (h *Held) Abort() Result { return h.end(ReasonAborted) }

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

func (h *Held) allReleased() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.released) == len(h.ports)
}

// releasePort deletes the port's rule, then accepts what it parked: once
// after the reader caught up, once more for stragglers.
func (h *Held) releasePort(port uint16, reason string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, done := h.released[port]; done || h.ended {
		return
	}
	h.releaseLocked(port, reason)
}

func (h *Held) releaseLocked(port uint16, reason string) {
	var errs []error
	errs = append(errs, h.rs.unhold(port))
	pr := PortResult{Port: port, Reason: reason}
	if h.q != nil {
		time.Sleep(settle)
		_, err := h.q.acceptAll(h.num[port])
		errs = append(errs, err)
		time.Sleep(straggle)
		var first time.Time
		pr.Parked, first, err = h.q.acceptAllFirst(h.num[port])
		errs = append(errs, err)
		if !first.IsZero() {
			pr.LongestWait = time.Since(first)
		}
	}
	pr.HeldFor = time.Since(h.start)
	h.released[port] = pr
	if err := errors.Join(errs...); err != nil && h.result.Err == nil {
		h.result.Err = fmt.Errorf("release port %d: %w", port, err)
	}
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
