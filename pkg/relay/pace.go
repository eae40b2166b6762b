package relay

// overflowing is a peer that p's frames are forwarded to (the backends for
// the caller, the caller for a backend) whose writes wait beyond
// maxOverflow, if any: one atomic load per peer and flush. A reader never
// waits for its own peer's overflow, as a byte relay's direction never waits
// for the other: a backend that stops reading while its answers to us
// block (grpc-go's reader throttles behind its writer) drains only if we
// keep reading it, so waiting on it would deadlock both until the write
// deadline (TestLargeMessagesBothWays, -count=30).
func (s *session) overflowing(p *peer) *sockWriter {
	if p != s.down {
		if s.down.w.queued.Load() > maxOverflow {
			return s.down.w
		}
		return nil
	}
	for _, u := range s.ups {
		if u != nil && u.w.queued.Load() > maxOverflow {
			return u.w
		}
	}
	for _, u := range s.retired {
		if u.w.queued.Load() > maxOverflow {
			return u.w
		}
	}
	return nil
}
