// Package strategy is the vocabulary of how a swap replaces a container:
// stop the old one first (with the connection hold) or overlap the two,
// the new one taking over the old one's listening sockets. It is defined
// and read here only, for every place a strategy comes from (the pod
// annotation inplaced.io/swap-strategy, --swap-strategy and the config
// file, inplacectl swap --strategy, kubectl inplace swap --strategy) and
// every place that acts on one (the swap engine). A leaf (the standard
// library and pkg/internal/enum), so that the CLIs link it without the
// daemon.
package strategy

import "github.com/inplaced/inplaced/pkg/internal/enum"

// Annotation is the pod annotation that asks for a strategy for every swap
// of the pod's containers (kubelet copies a pod's annotations into its
// sandbox config, where the swap reads them). A request's own strategy
// (inplacectl swap --strategy, the inplaced.io/swap request's "strategy")
// wins over it; it wins over the node's --swap-strategy.
const Annotation = "inplaced.io/swap-strategy"

// Strategy is how a swap replaces a container.
type Strategy string

const (
	// StopFirst stops the old container, then starts the new one; the
	// connection hold parks new connections for the gap.
	StopFirst Strategy = "stop-first"
	// Overlap starts the new container while the old one runs; the new
	// one's bind() of a port the old one listens on gets the old listening
	// socket, and the old one is stopped once the new one is healthy.
	Overlap Strategy = "overlap"
)

// Default is the strategy when none is asked for.
const Default = StopFirst

// strategies are every strategy, in the order messages list them.
var strategies = enum.Set[Strategy]{StopFirst, Overlap}

// Choices lists the strategies for a message: "stop-first or overlap".
func Choices() string { return strategies.Choices() }

// Parse reads a strategy as the flag, the config file, the annotation and
// a request spell it; case and surrounding blanks do not matter. The error
// names the value and the choices, for the caller to say where the value
// came from.
func Parse(s string) (Strategy, error) { return strategies.Parse(s) }
