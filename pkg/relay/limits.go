package relay

import (
	"fmt"

	"go.uber.org/zap"
	"golang.org/x/net/http2"
)

// Limits on what a peer can make the router do, each ending the offending
// connection with GOAWAY (ENHANCE_YOUR_CALM) and counted by the abuse
// observer (WithAbuseObserver; the metric inplaced_relay_abuse_total). The
// threat model is in doc.go. Each is far above what kubelet, crictl or a
// grpc-go backend does, and is x/net/http2's where it has one.
const (
	// rapidResetLimit bounds a caller's resets of streams the backend had
	// not answered yet, and refusals of streams over maxStreams, less the
	// calls answered meanwhile (CVE-2023-44487: each reset costs the
	// backend a call started and cancelled, the caller a frame). A caller
	// that cancels its calls now and then never comes near it; a loop of
	// open and reset ends after this many.
	rapidResetLimit = 1000
	// maxControlFrames bounds the PING and SETTINGS frames a peer sends
	// between two HEADERS or DATA frames we send it: each costs us an
	// acknowledgement. A grpc-go client pings once per burst of data it
	// receives (BDP), kubelet's keepalive (off by default) once a while.
	maxControlFrames = 1000
	// maxQueuedControlFrames bounds the acknowledgements waiting for a peer
	// that does not read what we write (x/net's constant of this name).
	maxQueuedControlFrames = 10000
	// maxHeaderFrames bounds the frames of one header block: a 16 MiB list
	// (maxHeaderList) takes 1024 frames of 16 KiB; CONTINUATIONs beyond
	// cost us a read and a decode each for nothing (CVE-2024-27316's
	// family).
	maxHeaderFrames = 4096
	// maxOverflow bounds what waits for a peer that does not take what we
	// write (sockWriter): past it the readers of the session stop reading
	// until it drains or its write deadline ends it.
	maxOverflow = 4 << 20
)

// Abuse kinds, the observer's (and the metric's) label values.
const (
	limitRapidReset        = "rapid_reset"
	limitPingFlood         = "ping_flood"
	limitSettingsFlood     = "settings_flood"
	limitControlQueue      = "control_queue"
	limitContinuationFlood = "continuation_flood"
	limitClosedStreamFlood = "closed_stream_flood" // frames on closed streams that each cost a RST_STREAM
)

// AbuseObserver is told when a peer hit one of the router's limits and its
// connection ends; it runs with the session's lock held and must not block.
type AbuseObserver func(limit string)

// WithAbuseObserver installs an observer of the router's abuse limits.
func WithAbuseObserver(o AbuseObserver) Option { return func(r *Relay) { r.abuse = o } }

// abuse ends p's connection for hitting limit.
func (s *session) abuse(p *peer, limit string) error {
	side := "caller"
	if p.kind != down {
		side = "backend"
	}
	s.r.log.Warn("connection ended: it hit a limit of the relay", zap.String("limit", limit), zap.String("peer", side))
	if s.r.abuse != nil {
		s.r.abuse(limit)
	}
	return connErr{http2.ErrCodeEnhanceYourCalm, fmt.Sprintf("limit %s", limit)}
}

// controlFrame counts a frame from p that we must answer with one of ours
// (a PING, a SETTINGS, a frame on a closed stream).
func (s *session) controlFrame(p *peer, limit string) error {
	if p.ctrl++; p.ctrl > maxControlFrames {
		return s.abuse(p, limit)
	}
	if p == s.down {
		s.pace.wasted(p.ctrl)
	}
	if p.w.stalled.Load() && p.w.control.Add(1) > maxQueuedControlFrames {
		return s.abuse(p, limitControlQueue)
	}
	return nil
}

// countReset counts a caller's reset or refused stream against
// rapidResetLimit.
func (s *session) countReset() error {
	if s.resets++; s.resets > rapidResetLimit {
		return s.abuse(s.down, limitRapidReset)
	}
	s.pace.wasted(s.resets)
	return nil
}
