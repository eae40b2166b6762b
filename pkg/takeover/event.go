package takeover

import (
	"net/netip"
	"time"
)

// EventKind is what happened.
type EventKind string

const (
	// Attached: a notify fd arrived (from runc, or Adopt).
	Attached EventKind = "attached"
	// HandedOver: a bind got the old container's listening socket.
	HandedOver EventKind = "handed-over"
	// Refused: a bind of a port the old container listens on cannot be
	// handed over (Reason says why); it waits. A signal to the waiting
	// thread makes the kernel restart the bind: it is refused again.
	Refused EventKind = "refused"
	// Released: a waiting bind continued in the kernel (Reason says why).
	Released EventKind = "released"
	// Passed: a bind continued in the kernel at once (Reason says why).
	Passed EventKind = "passed"
	// Detached: every process the filter applied to is gone; the notify
	// fd is closed (remove it from an fd store).
	Detached EventKind = "detached"
)

// Event is one thing the agent did.
type Event struct {
	Kind EventKind
	At   time.Time
	// Name is the notify fd's name (see Agent.File).
	Name      string
	Container string
	Swap      string
	// Tid is the thread that called bind, Fd its socket, Addr the address
	// it asked for. Pid is its thread group where the agent read it (a
	// port of the old container's), else 0; for Attached, the process
	// runc started.
	Tid  int
	Pid  int
	Fd   int
	Addr netip.AddrPort
	// From is the old container's process and fd number of the socket
	// handed over.
	FromPid, FromFd int
	Reason          Reason
	// Err is the error behind ReasonFailed and ReasonUnreadable.
	Err error
	// Took is from the notification to the answer (for Released: from
	// the notification to the release).
	Took time.Duration
}
