package daemon

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/inplaced/inplaced/pkg/health"
)

// listenUnix creates a root-only unix socket at path: the directory is
// created if missing, a stale socket (left by a crash) is replaced, and the
// socket is never visible with a wider mode than 0600.
func listenUnix(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, fmt.Errorf("create socket directory for %s: %w", path, err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != fs.ModeSocket {
			return nil, fmt.Errorf("%s exists and is not a socket: remove it or choose another path", path)
		}
		if c, err := net.Dial("unix", path); err == nil {
			c.Close()
			return nil, fmt.Errorf("%s is in use by a running process: is inplaced already running?", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("remove stale socket %s: %w", path, err)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("stat %s: %w", path, err)
	}
	// The umask closes the window between bind and chmod. It is process-wide,
	// which is fine: sockets are created at start-up, before other work.
	old := syscall.Umask(0o177)
	l, err := net.Listen("unix", path)
	syscall.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, fmt.Errorf("chmod %s: %w", path, err)
	}
	// The socket file is removed by Close (net.UnixListener unlinks on close).
	return l, nil
}

// criListener is the CRI socket: the one systemd passed (socket
// activation: LISTEN_PID, LISTEN_FDS, LISTEN_FDNAMES) when one of them is
// bound at path, else one bound here (listenUnix). systemd's socket
// outlives this process: connections made while no inplaced runs wait in
// its backlog for the next one, so it is never unlinked here. Any other
// socket systemd passed is closed, with a warning: a socket unit and a
// --listen that disagree are the operator's to fix, and kubelet is pointed
// at --listen, so it is served there meanwhile.
func criListener(path string, activated []*os.File, log *zap.Logger) (l net.Listener, fromSystemd bool, err error) {
	l, rest := takeActivated(activated, path)
	for _, f := range rest {
		log.Warn("systemd passed a socket that is not --listen: closed (make the socket unit's ListenStream= and --listen agree)",
			zap.String("fd_name", f.Name()), zap.String("address", fileAddr(f)), zap.String("listen", path))
		f.Close()
	}
	if l != nil {
		return l, true, nil
	}
	l, err = listenUnix(path)
	return l, false, err
}

// takeActivated returns the listener among files bound at path, and the
// files it did not take.
func takeActivated(files []*os.File, path string) (net.Listener, []*os.File) {
	var rest []*os.File
	var found net.Listener
	for _, f := range files {
		if found == nil {
			if l := unixListenerAt(f, path); l != nil {
				f.Close() // l holds its own descriptor
				found = l
				continue
			}
		}
		rest = append(rest, f)
	}
	return found, rest
}

// unixListenerAt is f as a listener, if it is a listening unix socket
// bound at path.
func unixListenerAt(f *os.File, path string) net.Listener {
	if !listening(f) {
		return nil // a connection's local address can be the path too
	}
	l, err := net.FileListener(f)
	if err != nil {
		return nil
	}
	ul, ok := l.(*net.UnixListener)
	if !ok {
		l.Close()
		return nil
	}
	// A listener made from a file never unlinks its path (net's
	// FileListener); said again here because systemd's socket file must
	// outlive us.
	ul.SetUnlinkOnClose(false)
	if !samePath(ul.Addr().String(), path) {
		ul.Close()
		return nil
	}
	return ul
}

// listening says whether f is a socket that listens (SO_ACCEPTCONN).
func listening(f *os.File) bool {
	rc, err := f.SyscallConn()
	if err != nil {
		return false
	}
	v, optErr := 0, error(nil)
	if err := rc.Control(func(fd uintptr) { v, optErr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_ACCEPTCONN) }); err != nil {
		return false
	}
	return optErr == nil && v == 1
}

// samePath says whether two socket paths name the same file: equal once
// cleaned, or once their directories' symlinks are resolved
// (/var/run → /run).
func samePath(a, b string) bool {
	a, b = filepath.Clean(a), filepath.Clean(b)
	if a == b {
		return true
	}
	resolve := func(p string) string {
		dir, err := filepath.EvalSymlinks(filepath.Dir(p))
		if err != nil {
			return p
		}
		return filepath.Join(dir, filepath.Base(p))
	}
	return resolve(a) == resolve(b)
}

// fileAddr is the address a passed socket is bound at, for the log.
func fileAddr(f *os.File) string {
	l, err := net.FileListener(f)
	if err != nil {
		return "not a listening socket: " + err.Error()
	}
	defer l.Close()
	if ul, ok := l.(*net.UnixListener); ok {
		ul.SetUnlinkOnClose(false)
	}
	return l.Addr().Network() + ":" + l.Addr().String()
}

// listenRetry is how often a control socket or metrics address that could
// not be listened on is tried again.
const listenRetry = 5 * time.Second

// serveWhenListening listens — retrying every listenRetry while it cannot,
// with the failure on the board — then serves until ctx ends, and stops.
// It is for inplaced's side doors (control socket, metrics): kubelet's CRI
// socket never waits on them.
func serveWhenListening(ctx context.Context, board *health.Board, part health.Part, log *zap.Logger,
	listen func() (net.Listener, error), serve func(net.Listener) error, stop func(), action string) {
	var l net.Listener
	for {
		var err error
		if l, err = listen(); err == nil {
			break
		}
		board.Set(health.Problem{Part: part, What: err.Error(), Action: fmt.Sprintf("%s; inplaced tries again every %s", action, listenRetry)})
		select {
		case <-ctx.Done():
			return
		case <-time.After(listenRetry):
		}
	}
	board.Clear(part)
	log.Info("serving "+string(part), zap.String("address", l.Addr().String()))
	done := make(chan error, 1)
	go func() { done <- serve(l) }()
	select {
	case <-ctx.Done():
		stop()
		<-done
	case err := <-done:
		if err != nil {
			log.Error(string(part)+" stopped serving", zap.Error(err))
		}
	}
}
