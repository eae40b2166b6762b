package hold

import (
	"fmt"

	"github.com/inplaced/inplaced/pkg/internal/netns"
)

// Lister lists the ports TCP sockets listen on in one network namespace,
// from a sock_diag socket made there once: for callers that ask often (the
// takeover agent, on every bind it is notified of).
type Lister struct{ d *diag }

// NewLister opens a Lister on the network namespace at netnsPath.
func NewLister(netnsPath string) (*Lister, error) {
	ns, err := netns.Open(netnsPath)
	if err != nil {
		return nil, err
	}
	defer ns.Close()
	var d *diag
	if err := netns.Run(ns, func() (err error) { d, err = newDiag(); return err }); err != nil {
		return nil, fmt.Errorf("listener list in %s: %w", netnsPath, err)
	}
	return &Lister{d: d}, nil
}

// Ports dumps the listening sockets, IPv4 and IPv6, and returns their
// ports (an MPTCP listener shows as its TCP subflow's).
func (l *Lister) Ports() ([]uint16, error) {
	ls, err := l.d.listeners()
	if err != nil {
		return nil, err
	}
	out := make([]uint16, len(ls))
	for i, s := range ls {
		out[i] = s.port
	}
	return out, nil
}

// Close closes the sock_diag socket.
func (l *Lister) Close() { l.d.close() }
