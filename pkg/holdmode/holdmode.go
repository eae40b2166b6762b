// Package holdmode is the vocabulary of the connection hold's modes: what a
// swap does about new connections to a container's ports while no process
// listens on them. It is defined and read here only, for every place a mode
// comes from (--connection-hold, the config file, the pod annotation
// inplaced.io/connection-hold) and every place that acts on one (the swap
// engine, package hold). A leaf with no netlink, so that the engine and the
// config can use it without linking what installs a hold.
package holdmode

import "github.com/inplaced/inplaced/pkg/internal/enum"

// Mode is how connection attempts are held.
type Mode string

const (
	// Queue parks SYNs (NFQUEUE) and lets them in when the port listens
	// again: clients wait instead of being refused.
	Queue Mode = "queue"
	// Drop drops SYNs during the window; clients retransmit (~1 s).
	Drop Mode = "drop"
	// Off does nothing: a connection while no process listens is refused.
	Off Mode = "off"
)

// Default is the mode when none is configured.
const Default = Queue

// modes are every mode, in the order messages list them.
var modes = enum.Set[Mode]{Queue, Drop, Off}

// Choices lists the modes for a message: "queue, drop or off".
func Choices() string { return modes.Choices() }

// Parse reads a mode as the flag, the config file and the annotation spell
// it; case and surrounding blanks do not matter. The error names the value
// and the choices, for the caller to say where the value came from.
func Parse(s string) (Mode, error) { return modes.Parse(s) }
