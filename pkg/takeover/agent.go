package takeover

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"
)

// Config configures an Agent.
type Config struct {
	// Socket is the unix socket runc connects to: the profile's
	// listenerPath. It is made mode 0600 and only root peers are served;
	// its directory should be root's alone.
	Socket string
	// Logger; nil logs nothing.
	Logger *zap.Logger
	// OnEvent, when set, is called for every event, from the goroutine
	// serving the container: it must return quickly.
	OnEvent func(Event)
}

// Agent serves the notify fds of the new containers' bind traps.
type Agent struct {
	cfg   Config
	log   *zap.Logger
	sizes notifSizes
	ln    *net.UnixListener
	sock  os.FileInfo // the socket file as created, to remove only ours

	mu        sync.Mutex
	swaps     map[string]*registration
	notifiers map[string]*notifier
	seq       int
	stopping  bool          // Close or Detach began: no more connections
	closing   chan struct{} // closed then: waiting binds continue
	closed    bool          // no more loops or waits start
	conns     sync.WaitGroup
	loops     sync.WaitGroup
	waits     sync.WaitGroup // binds waiting for an old socket to go
}

// Listen checks that the kernel has seccomp user notification with
// structs the agent knows, and listens on cfg.Socket (a stale socket file
// is replaced; a socket another agent serves is not).
func Listen(cfg Config) (*Agent, error) {
	if cfg.Socket == "" {
		return nil, errors.New("takeover agent: no socket path")
	}
	sizes, err := kernelSizes()
	if err != nil {
		return nil, fmt.Errorf("takeover agent: %w", err)
	}
	a := &Agent{cfg: cfg, log: cfg.Logger, sizes: sizes, swaps: map[string]*registration{},
		notifiers: map[string]*notifier{}, closing: make(chan struct{})}
	if a.log == nil {
		a.log = zap.NewNop()
	}
	if a.ln, a.sock, err = listenUnix(cfg.Socket); err != nil {
		return nil, fmt.Errorf("takeover agent: %w", err)
	}
	return a, nil
}

// listenUnix listens on path, mode 0600.
func listenUnix(path string) (*net.UnixListener, os.FileInfo, error) {
	if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
		c.Close()
		return nil, nil, fmt.Errorf("%s: another agent listens there", path)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, nil, fmt.Errorf("remove stale socket: %w", err)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, nil, fmt.Errorf("listen: %w", err)
	}
	ln.SetUnlinkOnClose(false) // Close removes it only while it is ours
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, nil, fmt.Errorf("socket mode: %w", err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		ln.Close()
		return nil, nil, fmt.Errorf("socket: %w", err)
	}
	return ln, fi, nil
}

// Serve accepts runc's connections until Close; it returns nil then.
func (a *Agent) Serve() error {
	for {
		c, err := a.ln.AcceptUnix()
		if err != nil {
			select {
			case <-a.closing:
				return nil
			default:
			}
			if errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) || errors.Is(err, syscall.ECONNABORTED) {
				a.log.Warn("takeover: accept", zap.Error(err))
				time.Sleep(10 * time.Millisecond)
				continue
			}
			return fmt.Errorf("takeover agent: accept: %w", err)
		}
		a.mu.Lock()
		if a.stopping { // accepted as Close began: runc sees the connection close
			a.mu.Unlock()
			c.Close()
			continue
		}
		a.conns.Add(1)
		a.mu.Unlock()
		go func() {
			defer a.conns.Done()
			a.attachConn(c)
		}()
	}
}

// spawn runs fn in a goroutine counted by wg, unless the agent is closing.
func (a *Agent) spawn(wg *sync.WaitGroup, fn func()) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return false
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		fn()
	}()
	return true
}

// Close stops the agent: the connections under way attach their fds,
// waiting binds continue in the kernel, each loop answers the bind it has
// in hand, then the notify fds and the socket close. A container's filter
// keeps working only through copies taken with File or Files; without
// one, every later bind() in it fails with ENOSYS.
func (a *Agent) Close() error {
	_, err := a.shutdown(false)
	return err
}

// Detach is Close, but returns the notify fds by name instead of closing
// them, with no notification received and unanswered: for an agent taking
// over (Adopt). Binds made meanwhile wait for it.
func (a *Agent) Detach() (map[string]*os.File, error) {
	return a.shutdown(true)
}

func (a *Agent) shutdown(keep bool) (map[string]*os.File, error) {
	a.mu.Lock()
	if a.stopping {
		a.mu.Unlock()
		return nil, errors.New("takeover agent: closed already")
	}
	a.stopping = true
	close(a.closing)
	a.mu.Unlock()

	err := a.ln.Close()
	a.conns.Wait()
	a.mu.Lock()
	a.closed = true
	ns := make([]*notifier, 0, len(a.notifiers))
	for _, n := range a.notifiers {
		ns = append(ns, n)
	}
	a.mu.Unlock()
	a.waits.Wait()
	for _, n := range ns {
		n.stop()
	}
	a.loops.Wait()
	var kept map[string]*os.File
	if keep {
		kept, err = a.Files()
	}
	a.mu.Lock()
	for _, n := range a.notifiers {
		n.close()
	}
	for swap, r := range a.swaps {
		r.close()
		delete(a.swaps, swap)
	}
	a.mu.Unlock()
	if fi, serr := os.Stat(a.cfg.Socket); serr == nil && os.SameFile(fi, a.sock) {
		if rerr := os.Remove(a.cfg.Socket); rerr != nil {
			err = errors.Join(err, rerr)
		}
	}
	if err != nil {
		return kept, fmt.Errorf("takeover agent: close: %w", err)
	}
	return kept, nil
}

// Register lets the new container of old.Swap take over the listening
// sockets of the container whose init is old.Pid.
func (a *Agent) Register(old Old) error {
	r, err := newRegistration(old)
	if err != nil {
		return fmt.Errorf("takeover: register swap %s: %w", old.Swap, err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	_, dup := a.swaps[old.Swap]
	if dup || a.closed {
		r.close()
		return fmt.Errorf("takeover: register swap %s: registered already, or the agent is closed", old.Swap)
	}
	a.swaps[old.Swap] = r
	return nil
}

// Unregister ends swap: its waiting binds continue, later binds pass.
func (a *Agent) Unregister(swap string) {
	a.mu.Lock()
	r, ok := a.swaps[swap]
	delete(a.swaps, swap)
	a.mu.Unlock()
	if ok {
		r.close()
	}
}

func (a *Agent) registration(swap string) *registration {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.swaps[swap]
}

func (a *Agent) emit(e Event) {
	if a.cfg.OnEvent != nil {
		a.cfg.OnEvent(e)
	}
}
