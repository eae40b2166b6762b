package takeover

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/inplaced/inplaced/pkg/hold"
)

// DefaultDeadline is how long a bind that cannot be handed over waits for
// the old container's socket to go when Old has no Deadline.
const DefaultDeadline = 30 * time.Second

// Old is a container being replaced: the binds of the new container whose
// profile names Swap may take over its listening sockets.
type Old struct {
	// Swap is the new container's profile's swap name (listenerMetadata).
	Swap string
	// Pid is the old container's init, a host pid: its processes (found
	// through its cgroup) have the sockets open, its network namespace is the
	// pod's.
	Pid int
	// Deadline ends the wait of a bind that cannot be handed over
	// (DefaultDeadline from Register when zero).
	Deadline time.Time
}

// registration is a Register'd Old and what the agent keeps of it, so
// that a bind of a port nobody listens on (most binds) costs one
// sock_diag dump, and a handover does not list the container's processes
// again unless they changed.
type registration struct {
	Old
	netns     nsID
	portStart int // the netns's ip_unprivileged_port_start
	done      chan struct{}

	mu     sync.Mutex
	lister *hold.Lister // the pod netns's listening ports; nil once closed
	pids   []int        // the old container's processes, as last listed
}

var errUnregistered = errors.New("swap unregistered")

func newRegistration(old Old) (*registration, error) {
	if old.Swap == "" || old.Pid <= 0 {
		return nil, fmt.Errorf("swap %q pid %d: both are needed", old.Swap, old.Pid)
	}
	if old.Deadline.IsZero() {
		old.Deadline = time.Now().Add(DefaultDeadline)
	}
	r := &registration{Old: old, done: make(chan struct{})}
	var err error
	if r.netns, err = netNS(old.Pid); err != nil {
		return nil, err
	}
	if r.portStart, err = unprivilegedPortStart(old.Pid); err != nil {
		return nil, err
	}
	if r.pids, err = hold.ContainerPids(old.Pid); err != nil {
		return nil, err
	}
	if r.lister, err = hold.NewLister(fmt.Sprintf("/proc/%d/ns/net", old.Pid)); err != nil {
		return nil, err
	}
	return r, nil
}

// close ends the registration: its waits continue, its socket closes.
func (r *registration) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.lister != nil {
		r.lister.Close()
		r.lister = nil
		close(r.done)
	}
}

// portListened reports whether anything listens on port in the pod's
// network namespace.
func (r *registration) portListened(port uint16) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.lister == nil {
		return false, errUnregistered
	}
	ports, err := r.lister.Ports()
	if err != nil {
		return false, fmt.Errorf("listening ports: %w", err)
	}
	return slices.Contains(ports, port), nil
}

// listeners copies the old container's sockets listening on port. A
// socket on the port that none of the processes last listed has open may
// be open in a process forked since: the list is made again once.
func (r *registration) listeners(port uint16) (listeners, error) {
	r.mu.Lock()
	pids := r.pids
	r.mu.Unlock()
	ls, err := scanListeners(pids, port, r.netns)
	if err != nil || len(ls) > 0 {
		return ls, err
	}
	fresh, err := hold.ContainerPids(r.Pid)
	if err != nil || sameSet(fresh, pids) {
		return nil, nil // the old container is gone (nothing of it listens), or nothing new
	}
	r.mu.Lock()
	r.pids = fresh
	r.mu.Unlock()
	return scanListeners(fresh, port, r.netns)
}

// listensOn reports whether the old container still listens on port.
func (r *registration) listensOn(port uint16) bool {
	if ok, err := r.portListened(port); err == nil && !ok {
		return false
	}
	ls, err := r.listeners(port)
	defer ls.close()
	return err != nil || len(ls) > 0
}

func sameSet(a, b []int) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}
