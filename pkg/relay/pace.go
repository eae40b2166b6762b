package relay

import "time"

// What a session's reader waits for between two frames, outside the
// session's lock: a pause when its caller is paced, and room at a peer it
// feeds that does not take what we write (back-pressure). Everything else
// a reader does is handling the frame, under the lock.

// A caller that makes us work for nothing is paced: past paceFree resets
// (as rapidResetLimit counts them) or control frames (as maxControlFrames
// counts them), its reader pauses pacePause after every paceEvery more.
// Its connection still ends at the limit, at least 90 pauses later;
// meanwhile it takes at most the CPU of paceEvery frames per pacePause, so
// that the other callers' calls keep their latency on a machine the flood
// would otherwise saturate. Kubelet and grpc-go clients stay far below
// paceFree: every answered call takes a reset off, every HEADERS or DATA
// frame we send clears the control count. Small bursts often rather than
// large ones seldom, so that a victim's call that meets a burst waits for
// at most paceEvery frames. The measurements behind these figures are in
// docs/performance.md ("Abuse limits").
const (
	paceFree  = 100
	paceEvery = 10
	pacePause = time.Millisecond
)

// pacer counts what a caller wastes past paceFree and says when its reader
// owes a pause.
type pacer struct {
	waste int // frames past paceFree not yet paid for with a pause
}

// wasted counts one frame that made us work for nothing, the n-th of its
// kind (resets, or control frames) the caller has sent.
func (pc *pacer) wasted(n int) {
	if n > paceFree {
		pc.waste++
	}
}

// due says whether a pause is owed now, and takes it off.
func (pc *pacer) due() bool {
	if pc.waste < paceEvery {
		return false
	}
	pc.waste -= paceEvery
	return true
}

// readerWait is what a reader waits for before its next frame (session.read
// fills it in under the lock, then waits outside it).
type readerWait struct {
	pause bool        // its caller is paced: pacePause
	full  *sockWriter // a peer it feeds whose overflow is past maxOverflow
}

// paused is told that p's reader will pause: what the wasted frames asked
// for goes out first. It runs with the session's lock held.
func (s *session) paused() {
	s.flush()
	if s.r.onPause != nil {
		s.r.onPause()
	}
}

// wait waits, without the session's lock: the pause, then, while a peer is
// not taking what we write, until it does or its write deadline (timeout)
// ends it, so that what waits for it stays bounded and the back-pressure
// reaches our sender.
func (w readerWait) wait(timeout time.Duration) {
	if w.pause {
		time.Sleep(pacePause)
	}
	if w.full != nil {
		w.full.wait(maxOverflow, timeout)
	}
}

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
