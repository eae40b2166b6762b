package relay

import (
	"context"
	"sync"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// BenchmarkRouterVersion relays Version calls from 16 callers sharing one
// connection through the router, in process: for allocation counts and
// profiles of the pass-through path (go test -bench Router -benchmem
// -cpuprofile/-memprofile). The cost as a process of its own, beside the
// floors, is BenchmarkRelayCost's (test/bench).
func BenchmarkRouterVersion(b *testing.B) {
	s := start(b, nil)
	c := runtimeapi.NewRuntimeServiceClient(s.client)
	ctx := context.Background()
	if _, err := c.Version(ctx, &runtimeapi.VersionRequest{}); err != nil {
		b.Fatal(err)
	}
	const callers = 16
	b.ResetTimer()
	var wg sync.WaitGroup
	per := b.N/callers + 1
	for range callers {
		wg.Go(func() {
			for range per {
				if _, err := c.Version(ctx, &runtimeapi.VersionRequest{}); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}
