package harness

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"
)

// StartLink serves the registry's content on a second loopback port as if
// over a network link of bitsPerSec: response bodies (blobs, manifests) are
// paced so that all transfers through the link together never exceed its
// rate. It returns the link's address ("127.0.0.1:PORT"), which is an image
// reference's registry host like Addr. Containerd instances started after it
// pull from it over plain HTTP (writeConfig lists every link).
//
// Why: on loopback a 100 MiB pull takes about half a second, which is no
// node's network; a link gives the benchmark a pull as long as a real one.
func (r *Registry) StartLink(tb testing.TB, bitsPerSec int64) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("registry link: listen: %v", err)
	}
	p := &pacer{bytesPerSec: float64(bitsPerSec) / 8}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			r.srv.Handler.ServeHTTP(&pacedWriter{ResponseWriter: w, p: p, ctx: req.Context()}, req)
		}),
		ReadHeaderTimeout: 10 * time.Second,
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			_ = srv.Close()
		}
		if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
			tb.Logf("registry link %s: serve: %v", ln.Addr(), err)
		}
	})
	addr := ln.Addr().String()
	r.mu.Lock()
	r.links = append(r.links, addr)
	r.mu.Unlock()
	return addr
}

// Links returns the addresses of the links started so far.
func (r *Registry) Links() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.links...)
}

// pacerSlack is how far a link may run ahead of its schedule.
const pacerSlack = 5 * time.Millisecond

// pacer is one link's schedule: the time its last queued byte leaves.
type pacer struct {
	bytesPerSec float64
	mu          sync.Mutex
	next        time.Time
}

// wait blocks until n more bytes may leave.
func (p *pacer) wait(ctx context.Context, n int) error {
	p.mu.Lock()
	// An idle link banks no more than pacerSlack of capacity (so a timer
	// that fires late costs no throughput, and a burst stays short).
	if floor := time.Now().Add(-pacerSlack); p.next.Before(floor) {
		p.next = floor
	}
	p.next = p.next.Add(time.Duration(float64(n) / p.bytesPerSec * float64(time.Second)))
	until := p.next
	p.mu.Unlock()
	// Sleep only once the link is a few milliseconds behind: a timer per
	// 64 KiB chunk would make the link slower than its rate on a machine
	// whose timers fire late. The schedule keeps the average exact.
	d := time.Until(until)
	if d < pacerSlack {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// pacedWriter writes a response body in chunks, each after the link had
// time to carry it.
type pacedWriter struct {
	http.ResponseWriter
	p   *pacer
	ctx context.Context
}

func (w *pacedWriter) Write(b []byte) (int, error) {
	const chunk = 64 << 10
	written := 0
	for len(b) > 0 {
		n := min(len(b), chunk)
		if err := w.p.wait(w.ctx, n); err != nil {
			return written, err
		}
		m, err := w.ResponseWriter.Write(b[:n])
		written += m
		if err != nil {
			return written, err
		}
		b = b[n:]
	}
	return written, nil
}
