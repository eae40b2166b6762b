// Package health is the list of inplaced's own parts that are out of
// service now (its state store, the kubeconfig, the metrics listener, the
// control socket), each with what an operator does about it. CRI
// pass-through never depends on any of them: the list says what inplaced
// refuses or cannot do meanwhile (inplacectl status, the log, the
// inplaced_degraded metric, Node events in Kubernetes mode).
package health

import (
	"sort"
	"sync"
	"time"
)

// Part names a part of inplaced that can be out of service.
type Part string

// The parts.
const (
	PartState      Part = "state"
	PartKubeconfig Part = "kubeconfig"
	PartMetrics    Part = "metrics"
	PartControl    Part = "control-socket"
	// PartCredentials: the image credential-provider configuration
	// (Kubernetes mode waits for it).
	PartCredentials Part = "credential-provider"
)

// Problem is one part out of service.
type Problem struct {
	Part   Part
	What   string
	Action string
	Since  time.Time
	// BlocksSwaps: swaps and resizes are refused while it lasts.
	BlocksSwaps bool
}

// Board keeps the problems of the moment.
type Board struct {
	mu       sync.Mutex
	problems map[Part]Problem
	watchers []func(p Problem, cleared bool)
}

// New returns an empty board.
func New() *Board { return &Board{problems: map[Part]Problem{}} }

// Watch calls f on every change (a problem set, changed or cleared); f must
// not block. Call it before the board is used.
func (b *Board) Watch(f func(p Problem, cleared bool)) { b.watchers = append(b.watchers, f) }

// Set records a problem. The same problem set again is no news; a problem
// of a part that goes on keeps its first Since.
func (b *Board) Set(p Problem) {
	b.mu.Lock()
	old, had := b.problems[p.Part]
	if had && old.What == p.What && old.Action == p.Action && old.BlocksSwaps == p.BlocksSwaps {
		b.mu.Unlock()
		return
	}
	if had {
		p.Since = old.Since
	} else if p.Since.IsZero() {
		p.Since = time.Now()
	}
	b.problems[p.Part] = p
	b.mu.Unlock()
	b.tell(p, false)
}

// Clear ends a part's problem, if it had one.
func (b *Board) Clear(part Part) {
	b.mu.Lock()
	p, had := b.problems[part]
	delete(b.problems, part)
	b.mu.Unlock()
	if had {
		b.tell(p, true)
	}
}

func (b *Board) tell(p Problem, cleared bool) {
	for _, f := range b.watchers {
		f(p, cleared)
	}
}

// Problems lists the problems, by part.
func (b *Board) Problems() []Problem {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]Problem, 0, len(b.problems))
	for _, p := range b.problems {
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Part < out[j].Part })
	return out
}

// Get returns a part's problem.
func (b *Board) Get(part Part) (Problem, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	p, ok := b.problems[part]
	return p, ok
}
