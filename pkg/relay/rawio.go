package relay

import (
	"errors"
	"io"
	"net"
	"os"
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
// thread whenever it went to sleep while the process was idle. Measured in
// BenchmarkRelayCost (a CPU profile of the router at 16 callers): the wake-up
// alone was 12% of the router's CPU and the monitor's own loop more
// (docs/architecture.md). A raw call on a non-blocking socket returns at
// once (EAGAIN rather than blocking), so it needs none of that; deadlines,
// Close and the poller work as for net.Conn, through RawConn.
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

func (r *rawIO) Write(b []byte) (int, error) {
	done := 0
	var errno syscall.Errno
	err := r.rc.Write(func(fd uintptr) bool {
		for done < len(b) {
			m, _, e := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&b[done])), uintptr(len(b)-done))
			switch e {
			case 0:
				done += int(m)
			case syscall.EINTR:
			case syscall.EAGAIN:
				return false // wait for room
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

// deadlineWriter gives each write to conn (through w) a deadline of its
// own, timeout from its start: a peer that does not read cannot hold a
// session's lock for longer.
type deadlineWriter struct {
	conn    net.Conn
	w       io.Writer
	timeout time.Duration
}

func (d *deadlineWriter) Write(b []byte) (int, error) {
	_ = d.conn.SetWriteDeadline(time.Now().Add(d.timeout))
	return d.w.Write(b)
}
