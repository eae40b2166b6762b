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
