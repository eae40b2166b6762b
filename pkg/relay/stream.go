package relay

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
)

// Sides of a stream.
const (
	sideDown = 0 // the caller
	sideUp   = 1 // the backend or the gRPC handler
)

// stream is one call: the caller's stream and the stream it was given on an
// upstream connection. Where it is in its life is state and half, changed
// only by the transitions below; the [2] arrays are each side's flow
// control and framing.
type stream struct {
	method   string
	unary    bool
	start    time.Time
	up       *peer
	state    streamState
	half     [2]halfState // each side's END_STREAMs
	answered bool         // response headers went toward the caller (the backend's or the router's own)
	ids      [2]uint32
	win      [2]int64  // send window that side granted for the stream
	q        [2][]item // frames waiting for that side's window, in order
	recv     [2]int64  // receive window we granted that side, left
	unacked  [2]int64
	msgs     [2]msgScanner // gRPC message lengths from that side
	clen     int64         // the request's content-length still to come; -1: none
	code     codes.Code
}

// streamState is where a stream is in its life, as the router sees it: one
// value at a time (x/net's streamState, for a stream with two sides).
//
//	stateNew ──▶ stateWaiting ──▶ stateOpen ──▶ stateUpReset
//	    │              │              │              │
//	    ├─▶ stateLocal ┴──────────────┴──────────────┴──▶ stateClosed
//	    └──────────────────────────────────────────────▶ stateClosed
//
// Each side's half-closes (RFC 9113 §5.1) are in halfState, apart: both
// sides of an open stream pass through them, in any order.
type streamState uint8

const (
	stateNew     streamState = iota // the caller opened it; not routed yet
	stateWaiting                    // queued for its upstream's MAX_CONCURRENT_STREAMS: no upstream stream yet
	stateOpen                       // open on its upstream connection (st.up) too
	stateLocal                      // answered by the router itself: nothing goes upstream
	stateUpReset                    // the backend reset it with NO_ERROR behind its answer, which still waits for the caller's window; RST_STREAM(NO_ERROR) follows it
	stateClosed                     // forgotten: nothing of it is forwarded any more
)

// halfState is one side's END_STREAMs, as that side's connection sees the
// stream (RFC 9113 §5.1): open (0), half-closed (remote), half-closed
// (local), closed.
type halfState uint8

const (
	halfClosedRemote halfState = 1 << iota // that side sent END_STREAM
	halfClosedLocal                        // we sent that side END_STREAM
	halfClosed       = halfClosedRemote | halfClosedLocal
)

// gotEnd says whether side sent END_STREAM.
func (st *stream) gotEnd(side int) bool { return st.half[side]&halfClosedRemote != 0 }

// sentEnd says whether we sent side END_STREAM.
func (st *stream) sentEnd(side int) bool { return st.half[side]&halfClosedLocal != 0 }

// endRecv: side sent END_STREAM.
func (st *stream) endRecv(side int) { st.half[side] |= halfClosedRemote }

// endSent: we sent side END_STREAM.
func (st *stream) endSent(side int) { st.half[side] |= halfClosedLocal }

// upLive says whether st has a stream on a live upstream connection.
func (st *stream) upLive() bool { return st.state == stateOpen && !st.up.dead }

// cancelable says whether st has a stream on a live upstream connection
// that has not ended both ways: a reset or failure must cancel it there.
func (st *stream) cancelable() bool { return st.upLive() && st.half[sideUp] != halfClosed }

// queue: routed to up, whose stream limit makes it wait for a slot.
func (st *stream) queue(up *peer) {
	st.up, st.state = up, stateWaiting
	up.waiting = append(up.waiting, st)
}

// openOn: given stream id on its upstream connection.
func (st *stream) openOn(id uint32) {
	st.state = stateOpen
	st.ids[sideUp] = id
	st.win[sideUp] = st.up.initWindow
	st.up.streams[id] = st
}

// toLocal: the router answers it; nothing goes upstream.
func (st *stream) toLocal() {
	st.state = stateLocal
	st.half[sideUp] = halfClosed
	st.answered = true
}

// upReset: its upstream stream is gone (RST_STREAM NO_ERROR) while its
// answer still waits for the caller.
func (st *stream) upReset() {
	delete(st.up.streams, st.ids[sideUp])
	st.state, st.up = stateUpReset, nil
}

// close forgets st, and says whether it had an upstream stream, which
// the caller must now forget too; false if it was closed already.
func (st *stream) close() (wasOpen, ok bool) {
	if st.state == stateClosed {
		return false, false
	}
	wasOpen = st.state == stateOpen
	st.state = stateClosed
	return wasOpen, true
}

// open gives st its stream on its upstream connection.
func (s *session) open(st *stream) {
	up := st.up
	st.openOn(up.nextID)
	up.nextID += 2
	if up.nextID >= 1<<31-1 {
		up.goaway = true // stream IDs used up: the next stream opens a new connection
		if s.ups[up.kind] == up {
			s.ups[up.kind] = nil
		}
		s.retired = append(s.retired, up)
	}
}

// startWaiting opens the streams waiting for p's stream limit, in order,
// as far as the limit allows, and sends what they queued.
func (s *session) startWaiting(p *peer) {
	for len(p.waiting) > 0 && uint32(len(p.streams)) < p.maxStreams && !p.dead && !p.goaway {
		st := p.waiting[0]
		p.waiting[0] = nil
		p.waiting = p.waiting[1:]
		if st.state == stateClosed {
			continue
		}
		s.open(st)
		s.flushQueue(st, sideUp)
	}
	if len(p.waiting) == 0 {
		p.waiting = nil
	}
}

// maybeDone forgets a stream both sides have ended.
func (s *session) maybeDone(st *stream) {
	if st.state != stateClosed && st.sentEnd(sideDown) && st.sentEnd(sideUp) && len(st.q[0]) == 0 && len(st.q[1]) == 0 {
		if st.state == stateLocal && !st.gotEnd(sideDown) {
			return // kept until the caller ends its side, or resets it
		}
		s.remove(st, st.code)
	}
}

// remove forgets st; bytes still waiting in its queues free their
// connections' windows.
func (s *session) remove(st *stream, code codes.Code) {
	wasOpen, ok := st.close()
	if !ok {
		return
	}
	delete(s.streams, st.ids[sideDown])
	for to := range 2 {
		s.dropQueue(st, to)
	}
	if st.answered && s.resets > 0 {
		s.resets-- // an answered call earns back a reset (rapidResetLimit)
	}
	if wasOpen {
		delete(st.up.streams, st.ids[sideUp])
		if len(st.up.waiting) > 0 {
			s.startWaiting(st.up)
		}
		s.retire(st.up)
	}
	if s.r.observe != nil {
		s.r.observe(st.method, code, time.Since(st.start))
	}
	if s.goingAway && len(s.streams) == 0 && !s.closed {
		s.flush()
		s.closeLocked()
	}
}

// retire closes an upstream connection no new stream will use once its
// last stream is gone.
func (s *session) retire(p *peer) {
	if (p.goaway || p.dead) && len(p.streams) == 0 && s.ups[p.kind] != p {
		if !p.dead {
			_ = p.bw.Flush()
		}
		p.dead = true
		p.w.close()
	}
}

// resetBoth resets st on both sides.
func (s *session) resetBoth(st *stream, code http2.ErrCode, c codes.Code) {
	_ = s.down.fr.WriteRSTStream(st.ids[sideDown], code)
	s.down.dirty = true
	if st.upLive() {
		_ = st.up.fr.WriteRSTStream(st.ids[sideUp], http2.ErrCodeCancel)
		st.up.dirty = true
	}
	s.remove(st, c)
}

// failStream ends st for the caller with a gRPC status of the relay's own
// (trailers-only before any response headers, trailers after), discarding
// what still waits for the caller, and cancels it upstream.
func (s *session) failStream(st *stream, code codes.Code, msg string) {
	if st.state == stateClosed {
		return
	}
	s.dropQueue(st, sideDown)
	if !st.sentEnd(sideDown) && !s.down.dead {
		fields := make([]hpack.HeaderField, 0, 4)
		if !st.answered {
			fields = append(fields, hpack.HeaderField{Name: ":status", Value: "200"},
				hpack.HeaderField{Name: "content-type", Value: "application/grpc"})
		}
		fields = append(fields, hpack.HeaderField{Name: "grpc-status", Value: strconv.Itoa(int(code))},
			hpack.HeaderField{Name: "grpc-message", Value: encodeGrpcMessage(msg)})
		s.down.writeHeaders(st.ids[sideDown], fields, true)
		st.endSent(sideDown)
		if !st.gotEnd(sideDown) {
			// As grpc-go's server does: the caller's side is still open.
			_ = s.down.fr.WriteRSTStream(st.ids[sideDown], http2.ErrCodeNo)
		}
	}
	if st.cancelable() {
		_ = st.up.fr.WriteRSTStream(st.ids[sideUp], http2.ErrCodeCancel)
		st.up.dirty = true
	}
	s.remove(st, code)
}

func rstCode(c http2.ErrCode) codes.Code {
	switch c {
	case http2.ErrCodeRefusedStream:
		return codes.Unavailable
	case http2.ErrCodeCancel:
		return codes.Canceled
	default:
		return codes.Internal
	}
}

// statusOf reads grpc-status from trailers; Unknown if absent.
func statusOf(fields []hpack.HeaderField) codes.Code {
	for _, f := range fields {
		if f.Name == "grpc-status" {
			if n, err := strconv.Atoi(f.Value); err == nil {
				return codes.Code(n)
			}
		}
	}
	return codes.Unknown
}

// encodeGrpcMessage percent-encodes a grpc-message value as grpc-go does.
func encodeGrpcMessage(msg string) string {
	clean := true
	for i := 0; i < len(msg); i++ {
		if c := msg[i]; c < ' ' || c > '~' || c == '%' {
			clean = false
			break
		}
	}
	if clean {
		return msg
	}
	var b strings.Builder
	for i := 0; i < len(msg); i++ {
		if c := msg[i]; c >= ' ' && c <= '~' && c != '%' {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}
