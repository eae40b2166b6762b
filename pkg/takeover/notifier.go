package takeover

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"sync/atomic"
	"syscall"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// waitPoll is how often a waiting bind looks whether the old socket is
// gone: the fallback it waits for takes far longer.
const waitPoll = 10 * time.Millisecond

// nativeArch is the audit arch of this build: a bind of another ABI
// (x86's 32-bit calls) has another syscall number and argument layout, and
// passes untouched.
var nativeArch = map[string]uint32{
	"amd64":   unix.AUDIT_ARCH_X86_64,
	"arm64":   unix.AUDIT_ARCH_AARCH64,
	"ppc64le": unix.AUDIT_ARCH_PPC64LE,
	"s390x":   unix.AUDIT_ARCH_S390X,
	"riscv64": unix.AUDIT_ARCH_RISCV64,
}[runtime.GOARCH]

// notifier serves one notify fd: a loop taking the notifications in turn,
// and a goroutine per bind that waits.
type notifier struct {
	a                     *Agent
	name, container, swap string
	f                     *os.File
	rc                    syscall.RawConn
	buf                   []byte // the kernel's struct seccomp_notif
	stopped               atomic.Bool
}

// stop ends the loop once it has answered the notification in hand
// (a deadline wakes it from the poller), leaving the fd open.
func (n *notifier) stop() {
	n.stopped.Store(true)
	if err := n.f.SetReadDeadline(time.Now()); err != nil {
		n.close() // not in the poller: nothing else wakes it
	}
}

// close closes the notify fd; the loop then ends.
func (n *notifier) close() {
	n.stopped.Store(true)
	n.f.Close()
}

// errHangup: no process is left under the filter.
var errHangup = errors.New("no process left under the filter")

func (n *notifier) serve() {
	for {
		nt, err := n.next()
		switch {
		case err == nil:
			n.handle(nt) // stopping or not: a notification taken is answered
		case errors.Is(err, errHangup):
			n.a.forget(n)
			n.a.log.Info("takeover: notify fd detached", zap.String("container_id", n.container), zap.String("name", n.name))
			n.a.emit(Event{Kind: Detached, At: time.Now(), Name: n.name, Container: n.container, Swap: n.swap})
			return
		case n.stopped.Load():
			return
		case err != nil:
			// Unexpected: keep the fd (closing it would fail every later
			// bind of the container) and try again.
			n.a.log.Error("takeover: notification", zap.String("container_id", n.container), zap.Error(err))
			select {
			case <-n.a.closing:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
}

// next waits for the next notification in the runtime's poller.
func (n *notifier) next() (notification, error) {
	var nt notification
	var rerr error
	err := n.rc.Read(func(fd uintptr) bool {
		for {
			ready, hup, err := pollIn(fd)
			switch {
			case err != nil:
				rerr = err
				return true
			case ready:
				nt, rerr = recv(fd, n.buf)
				if errors.Is(rerr, errGone) || errors.Is(rerr, unix.EAGAIN) {
					continue // withdrawn before we took it
				}
				return true
			case hup:
				rerr = errHangup
				return true
			}
			return false
		}
	})
	if err != nil {
		return nt, err
	}
	return nt, rerr
}

// pollIn looks, without waiting, whether a notification is there (POLLIN)
// or the filter has no process left (POLLHUP).
func pollIn(fd uintptr) (ready, hup bool, err error) {
	p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		_, err = unix.Poll(p, 0)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		return false, false, fmt.Errorf("poll notify fd: %w", err)
	}
	return p[0].Revents&unix.POLLIN != 0, p[0].Revents&(unix.POLLHUP|unix.POLLERR|unix.POLLNVAL) != 0, nil
}

// control runs f on the notify fd while it is open.
func (n *notifier) control(f func(fd uintptr) error) error {
	var ferr error
	if err := n.rc.Control(func(fd uintptr) { ferr = f(fd) }); err != nil {
		return err
	}
	return ferr
}

func (n *notifier) answer(id uint64, how int) error {
	return n.control(func(fd uintptr) error { return respond(fd, n.a.sizes.resp, id, how) })
}

func (n *notifier) idValid(id uint64) error {
	return n.control(func(fd uintptr) error { return idValid(fd, id) })
}

// dup returns a copy of the notify fd.
func (n *notifier) dup() (*os.File, error) {
	fd := -1
	err := n.control(func(raw uintptr) (err error) {
		fd, err = unix.FcntlInt(raw, unix.F_DUPFD_CLOEXEC, 0)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("takeover: copy notify fd %s: %w", n.name, err)
	}
	return os.NewFile(uintptr(fd), n.name), nil
}

// handle answers one notification, or leaves it to a waiting goroutine.
func (n *notifier) handle(nt notification) {
	start := time.Now()
	p := n.plan(nt)
	defer p.olds.close()
	if p.drop {
		return
	}
	e := Event{At: start, Name: n.name, Container: n.container, Swap: n.swap, Tid: nt.pid, Pid: p.tgid, Fd: int(int32(nt.args[0])),
		Addr: p.addr, Reason: p.v.reason, Err: p.err}
	var err error
	switch p.v.action {
	case pass:
		e.Kind = Passed
		err = n.answer(nt.id, answerContinue)
	case handOver:
		e.Kind = HandedOver
		e.FromPid, e.FromFd = p.olds[p.v.from].pid, p.olds[p.v.from].fd
		if err = n.handOver(nt, p); err != nil && !isGone(err) {
			e.Kind, e.Reason, e.FromPid, e.FromFd = Refused, ReasonFailed, 0, 0
		}
	case wait:
		e.Kind = Refused
	}
	if isGone(err) {
		return
	}
	if err != nil {
		e.Err = err
	}
	e.Took = time.Since(start)
	n.log(e)
	n.a.emit(e)
	if e.Kind == Refused {
		n.startWait(nt, p.reg, e)
	}
}

// handOver installs the old socket at the caller's fd number and answers
// bind with 0. A bind interrupted after the install (a signal: the kernel
// restarts it) comes back with the old socket in place, and is answered 0
// again.
func (n *notifier) handOver(nt notification, p plan) error {
	old := p.olds[p.v.from]
	if !p.installed {
		target := int(int32(nt.args[0]))
		err := n.control(func(fd uintptr) error { return addFD(fd, nt.id, old.copy, target, p.cloexec) })
		if err != nil {
			return fmt.Errorf("install %d:%d at %d:%d: %w", old.pid, old.fd, p.tgid, target, err)
		}
	}
	return n.answer(nt.id, answerSuccess)
}

// startWait leaves a bind waiting for the old socket to go; e is the
// refusal, the template of the release.
func (n *notifier) startWait(nt notification, reg *registration, e Event) {
	if !n.a.spawn(&n.a.waits, func() { n.wait(nt, reg, e) }) {
		n.release(nt, e, ReasonClosing)
	}
}

func (n *notifier) wait(nt notification, reg *registration, e Event) {
	tick := time.NewTicker(waitPoll)
	defer tick.Stop()
	deadline := time.NewTimer(time.Until(reg.Deadline))
	defer deadline.Stop()
	for {
		select {
		case <-n.a.closing:
			n.release(nt, e, ReasonClosing)
			return
		case <-reg.done:
			n.release(nt, e, ReasonUnregistered)
			return
		case <-deadline.C:
			n.release(nt, e, ReasonDeadline)
			return
		case <-tick.C:
		}
		if n.idValid(nt.id) != nil {
			return // abandoned: the thread was killed, or a signal restarts the call as a new notification
		}
		if !reg.listensOn(e.Addr.Port()) {
			n.release(nt, e, ReasonReleased)
			return
		}
	}
}

// release lets a waiting bind continue in the kernel.
func (n *notifier) release(nt notification, e Event, why Reason) {
	if err := n.answer(nt.id, answerContinue); isGone(err) {
		return
	}
	e.Kind, e.Reason, e.Err, e.Took = Released, why, nil, time.Since(e.At)
	e.At = time.Now()
	n.log(e)
	n.a.emit(e)
}

func (n *notifier) log(e Event) {
	fields := []zap.Field{zap.String("container_id", e.Container), zap.String("swap_id", e.Swap),
		zap.Int("tid", e.Tid), zap.Int("pid", e.Pid), zap.Stringer("addr", e.Addr), zap.Duration("took", e.Took)}
	switch e.Kind {
	case Passed:
		n.a.log.Debug("takeover: bind passed", append(fields, zap.String("reason", string(e.Reason)))...)
	case HandedOver:
		n.a.log.Info("takeover: socket handed over", append(fields, zap.Int("from_pid", e.FromPid), zap.Int("from_fd", e.FromFd))...)
	default:
		n.a.log.Info("takeover: bind "+string(e.Kind), append(fields, zap.String("reason", string(e.Reason)), zap.Error(e.Err))...)
	}
}

// plan is what the agent found about a notification and decided.
type plan struct {
	v         verdict
	reg       *registration
	addr      netip.AddrPort
	tgid      int
	olds      listeners
	cloexec   bool // the caller's fd was close-on-exec
	installed bool // the caller's fd is the old socket already
	drop      bool // the notification is gone: nothing to answer
	err       error
}

func passing(r Reason, err error) plan { return plan{v: verdict{action: pass, reason: r}, err: err} }
