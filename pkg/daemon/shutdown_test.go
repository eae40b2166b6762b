package daemon

import (
	"context"
	"testing"
	"time"
)

// TestHandoverOutlivesASpentGrace: a swap that held the whole shutdown
// grace must not leave the connections made during the drain to be cut at
// once (their calls failed, seen in the node guest's TestFleet): the
// handover gets handoverMin; with grace left, it gets what is left.
func TestHandoverOutlivesASpentGrace(t *testing.T) {
	spent, cancel := context.WithTimeout(context.Background(), time.Nanosecond)
	defer cancel()
	<-spent.Done()
	for _, c := range []struct {
		name  string
		grace context.Context
		want  time.Duration
	}{
		{"grace spent", spent, handoverMin},
		{"grace left", func() context.Context {
			c, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			t.Cleanup(cancel)
			return c
		}(), 5 * time.Second},
	} {
		h, cancel := handoverContext(c.grace)
		deadline, ok := h.Deadline()
		cancel()
		if left := time.Until(deadline); !ok || left > c.want || left < c.want-time.Second {
			t.Errorf("%s: the handover has %s, want about %s", c.name, left, c.want)
		}
	}
}
