package swap

import (
	"sync"

	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

// Subscription delivers a swap's events; the channel closes after the last
// event, which carries the final record.
type Subscription struct {
	C <-chan *inplacedv1.SwapEvent
}

// broadcaster keeps every event of a swap, so that a late subscriber sees
// the whole story, and fans them out without ever blocking the swap.
type broadcaster struct {
	mu     sync.Mutex
	events []*inplacedv1.SwapEvent
	subs   []chan *inplacedv1.SwapEvent
	closed bool
}

func (b *broadcaster) publish(ev *inplacedv1.SwapEvent) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.events = append(b.events, ev)
	for _, s := range b.subs {
		select {
		case s <- ev:
		default: // a subscriber that does not read loses events, never the swap
		}
	}
}

func (b *broadcaster) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	for _, s := range b.subs {
		close(s)
	}
	b.subs = nil
}

func (b *broadcaster) subscribe() *Subscription {
	b.mu.Lock()
	defer b.mu.Unlock()
	ch := make(chan *inplacedv1.SwapEvent, len(b.events)+64)
	for _, ev := range b.events {
		ch <- ev
	}
	if b.closed {
		close(ch)
	} else {
		b.subs = append(b.subs, ch)
	}
	return &Subscription{C: ch}
}
