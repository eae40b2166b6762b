package relay

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

// rawIO reads and writes a socket's descriptor with raw system calls,
// waiting for it through the Go poller (syscall.RawConn) only when the
// socket has nothing to read or no room to write.
//
// Why: a relayed call is a few short reads and writes on non-blocking
// sockets, and a Go process that goes idle between calls pays for each of
// them in the scheduler — every read and write through net.Conn enters and
// leaves a system call (entersyscall), which wakes the runtime's monitor
// thread whenever it went to sleep while the process was idle (the profile
// that showed it is in docs/architecture.md). A raw call on a non-blocking
// socket returns at once (EAGAIN rather than blocking), so it needs none of
// that; deadlines, Close and the poller work as for net.Conn, through
// RawConn.
type rawIO struct {
	rc syscall.RawConn
}

// newRawIO returns c's raw reader and writer, or c itself when it has no
// descriptor (a net.Pipe in tests).
func newRawIO(c net.Conn) io.ReadWriter {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return c
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return c
	}
	return &rawIO{rc: rc}
}

func (r *rawIO) Read(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	var n int
	var errno syscall.Errno
	err := r.rc.Read(func(fd uintptr) bool {
		for {
			m, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
			switch e {
			case 0:
				n = int(m)
				return true
			case syscall.EINTR:
				continue
			case syscall.EAGAIN:
				return false // wait for the poller
			default:
				errno = e
				return true
			}
		}
	})
	if err == nil && errno != 0 {
		err = os.NewSyscallError("read", errno)
	}
	if err != nil {
		return 0, opError("read", err)
	}
	if n == 0 {
		return 0, io.EOF
	}
	return n, nil
}

func (r *rawIO) Write(b []byte) (int, error) { return rawWrite(r.rc, b, true) }

// rawWrite writes b to rc's descriptor; with wait, it waits for room in the
// poller (as net.Conn does), without, it returns what the socket took.
func rawWrite(rc syscall.RawConn, b []byte, wait bool) (int, error) {
	done := 0
	var errno syscall.Errno
	err := rc.Write(func(fd uintptr) bool {
		for done < len(b) {
			m, _, e := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&b[done])), uintptr(len(b)-done))
			switch e {
			case 0:
				done += int(m)
			case syscall.EINTR:
			case syscall.EAGAIN:
				return !wait
			default:
				errno = e
				return true
			}
		}
		return true
	})
	if err == nil && errno != 0 {
		err = os.NewSyscallError("write", errno)
	}
	if err != nil {
		return done, opError("write", err)
	}
	return done, nil
}

// opError wraps err as net.Conn would (a *net.OpError), so that errCode
// tells a peer that went away from one that broke the protocol; the
// poller's own errors (net.ErrClosed, os.ErrDeadlineExceeded) stay
// recognisable with errors.Is.
func opError(op string, err error) error {
	var ne *net.OpError
	if errors.As(err, &ne) {
		return err
	}
	return &net.OpError{Op: op, Net: "unix", Err: err}
}

// sockWriter is a peer's socket as the session writes to it, under the
// session's lock: a write never waits for the peer. Whatever the socket
// does not take at once (a peer that stops reading, or reads slowly) is
// kept in order in an overflow that a goroutine of its own writes out,
// outside the lock, with a deadline per write; later writes go after it.
//
// Why: the session's one lock is taken by every frame of every connection
// of the session, and a write that blocked under it (as before) made a
// caller or backend that stopped reading stall all of them, for up to the
// write deadline. A non-blocking write costs what the blocking one did when
// the socket had room, which is nearly always: the hot path is unchanged
// and takes no new lock (an atomic load). What may wait in an overflow is
// bounded by what flow control lets us send the peer, plus control frames,
// which the session counts (maxQueuedControlFrames) while the peer is
// stalled; the readers that feed a stalled peer stop reading past
// maxOverflow (session.read), so the backpressure reaches their own
// sockets, as behind a byte relay.
type sockWriter struct {
	conn    net.Conn
	rc      syscall.RawConn // nil: a conn with no descriptor (tests): writes block
	timeout time.Duration

	stalled atomic.Bool  // the overflow holds bytes: writes go after them
	queued  atomic.Int64 // bytes in the overflow
	control atomic.Int64 // control frames queued while stalled (the session's count)

	mu      sync.Mutex // the slow path: overflow, err, closing
	over    []byte
	spare   []byte
	err     error // the drain's write failed: every later write fails (stalled stays set)
	failed  atomic.Bool
	closing bool // close the socket once the overflow is out
	drained chan struct{}
}

func newSockWriter(c net.Conn, timeout time.Duration) *sockWriter {
	w := &sockWriter{conn: c, timeout: timeout, drained: make(chan struct{}, 1)}
	if sc, ok := c.(syscall.Conn); ok {
		if rc, err := sc.SyscallConn(); err == nil {
			w.rc = rc
		}
	}
	return w
}

func (w *sockWriter) Write(b []byte) (int, error) {
	if w.rc == nil {
		_ = w.conn.SetWriteDeadline(time.Now().Add(w.timeout))
		return w.conn.Write(b)
	}
	if w.stalled.Load() {
		if queued, err := w.enqueue(b); queued {
			if err != nil {
				return 0, err
			}
			return len(b), nil
		}
	}
	n, err := rawWrite(w.rc, b, false)
	if err != nil {
		return n, err
	}
	if n < len(b) {
		w.mu.Lock()
		w.over = append(w.over[:0], b[n:]...)
		w.queued.Store(int64(len(w.over)))
		w.stalled.Store(true)
		w.mu.Unlock()
		go w.drain()
	}
	return len(b), nil
}

// enqueue appends b to the overflow if the drain still runs (or says
// why it stopped).
func (w *sockWriter) enqueue(b []byte) (bool, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.stalled.Load() {
		return false, nil
	}
	if w.err != nil {
		return true, w.err
	}
	w.over = append(w.over, b...)
	w.queued.Store(int64(len(w.over)))
	return true, nil
}

// drain writes the overflow out, waiting for the peer as long as the
// deadline allows, and ends the stall when it is empty. A failed write
// closes the socket: the peer's reader then fails, which ends what depends
// on it as any broken connection does.
func (w *sockWriter) drain() {
	for {
		w.mu.Lock()
		buf := w.over
		if len(buf) == 0 {
			// The deadline bounded the drain's writes only: left on the
			// socket, it would fail the first write of the fast path
			// that comes after it, however healthy the peer. Cleared
			// before the stall ends, while every write still comes
			// through here.
			_ = w.conn.SetWriteDeadline(time.Time{})
			w.stalled.Store(false)
			w.control.Store(0)
			closing := w.closing
			w.mu.Unlock()
			select {
			case w.drained <- struct{}{}:
			default:
			}
			if closing {
				w.conn.Close()
			}
			return
		}
		w.over, w.spare = w.spare[:0], nil
		w.mu.Unlock()
		_ = w.conn.SetWriteDeadline(time.Now().Add(w.timeout))
		_, err := rawWrite(w.rc, buf, true)
		w.mu.Lock()
		w.spare = buf[:0]
		w.queued.Store(int64(len(w.over)))
		if err != nil {
			w.err = err
			w.failed.Store(true)
		}
		w.mu.Unlock()
		select { // the overflow shrank, or will not any more
		case w.drained <- struct{}{}:
		default:
		}
		if err != nil {
			w.conn.Close()
			return
		}
	}
}

// close closes the socket, or, while the overflow is still being written
// (a GOAWAY may be in it), stops reading it and leaves the close to the
// drain, which its write deadline bounds.
func (w *sockWriter) close() {
	if w.rc != nil && w.stalled.Load() {
		w.mu.Lock()
		stalled := w.stalled.Load() && w.err == nil
		if stalled {
			w.closing = true
		}
		w.mu.Unlock()
		if stalled {
			if cr, ok := w.conn.(interface{ CloseRead() error }); ok && cr.CloseRead() == nil {
				return
			}
		}
	}
	w.conn.Close()
}

// wait blocks until the overflow is below limit, the drain failed, or
// timeout passes. It is called without the session's lock.
func (w *sockWriter) wait(limit int64, timeout time.Duration) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	for w.stalled.Load() && w.queued.Load() > limit && !w.failed.Load() {
		select {
		case <-w.drained:
		case <-t.C:
			return
		}
	}
}
