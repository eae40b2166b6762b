package harness

import (
	"context"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"
)

// Registry is an in-process OCI registry (go-containerregistry's) serving plain
// HTTP on a loopback port. Containerd instances started with it use it as a
// mirror of itself, so CRI PullImage of Ref(...) is a real pull.
type Registry struct {
	// Addr is "127.0.0.1:PORT".
	Addr string

	srv *http.Server

	mu     sync.Mutex
	images *Images
	links  []string // StartLink
}

// StartRegistry starts a registry on 127.0.0.1 with a free port; tb.Cleanup
// stops it.
func StartRegistry(tb testing.TB) *Registry {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("registry: listen: %v", err)
	}
	r := &Registry{
		Addr: ln.Addr().String(),
		srv: &http.Server{
			Handler:           registry.New(registry.Logger(log.New(io.Discard, "", 0))),
			ReadHeaderTimeout: 10 * time.Second,
		},
	}
	errc := make(chan error, 1)
	go func() { errc <- r.srv.Serve(ln) }()
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := r.srv.Shutdown(ctx); err != nil {
			tb.Logf("registry %s: shutdown: %v", r.Addr, err)
			_ = r.srv.Close()
		}
		if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
			tb.Logf("registry %s: serve: %v", r.Addr, err)
		}
	})
	return r
}

// Ref returns the reference of nameTag ("app:v1") in this registry:
// "127.0.0.1:PORT/app:v1".
func (r *Registry) Ref(nameTag string) string { return r.Addr + "/" + nameTag }
