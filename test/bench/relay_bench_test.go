package bench

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/pkg/fence"
	"github.com/inplaced/inplaced/pkg/intercept"
	"github.com/inplaced/inplaced/pkg/kubeletview"
	"github.com/inplaced/inplaced/pkg/relay"
	"github.com/inplaced/inplaced/pkg/store"
	"github.com/inplaced/inplaced/test/bench/report"
)

// relayBackend is a CRI server in process that answers from memory, so that
// what BenchmarkRelay measures is the gRPC hops and the relay, not a
// runtime.
type relayBackend struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	list *runtimeapi.ListContainersResponse
}

func (f *relayBackend) Version(context.Context, *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	return &runtimeapi.VersionResponse{Version: "0.1.0", RuntimeName: "fake", RuntimeVersion: "1", RuntimeApiVersion: "v1"}, nil
}

func (f *relayBackend) ListContainers(context.Context, *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
	return f.list, nil
}

// relayContainers is a ListContainers answer for n containers labelled and
// annotated as kubelet does (about 1 KiB each on the wire).
func relayContainers(n int) *runtimeapi.ListContainersResponse {
	resp := &runtimeapi.ListContainersResponse{}
	for i := range n {
		pod := fmt.Sprintf("pod-%02d", i/10)
		resp.Containers = append(resp.Containers, &runtimeapi.Container{
			Id:           fmt.Sprintf("%064x", i+1),
			PodSandboxId: fmt.Sprintf("%064x", 1<<20+i/10),
			Metadata:     &runtimeapi.ContainerMetadata{Name: fmt.Sprintf("c%02d", i%10)},
			Image:        &runtimeapi.ImageSpec{Image: "sha256:" + fmt.Sprintf("%064x", 7), UserSpecifiedImage: "registry.local/app:v1"},
			ImageRef:     "sha256:" + fmt.Sprintf("%064x", 7),
			ImageId:      "sha256:" + fmt.Sprintf("%064x", 7),
			State:        runtimeapi.ContainerState_CONTAINER_RUNNING,
			CreatedAt:    time.Now().UnixNano(),
			Labels: map[string]string{
				"io.kubernetes.pod.name": pod, "io.kubernetes.pod.namespace": "default",
				"io.kubernetes.pod.uid": "uid-" + pod, "io.kubernetes.container.name": fmt.Sprintf("c%02d", i%10),
			},
			Annotations: map[string]string{
				"io.kubernetes.container.hash":                     "1a2b3c4d",
				"io.kubernetes.container.restartCount":             "0",
				"io.kubernetes.container.terminationMessagePath":   "/dev/termination-log",
				"io.kubernetes.container.terminationMessagePolicy": "File",
				"io.kubernetes.pod.terminationGracePeriod":         "30",
			},
		})
	}
	return resp
}

// relayServer is a grpc.Server (the fake backend) or a relay.Server.
type relayServer interface {
	Serve(net.Listener) error
	Stop()
}

func relayServe(b testing.TB, sock string, srv relayServer) {
	b.Helper()
	lis, err := net.Listen("unix", sock)
	if err != nil {
		b.Fatal(err)
	}
	go func() { _ = srv.Serve(lis) }()
	b.Cleanup(srv.Stop)
}

func relayDial(b testing.TB, sock string) runtimeapi.RuntimeServiceClient {
	b.Helper()
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16<<20)))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close() })
	return runtimeapi.NewRuntimeServiceClient(conn)
}

// BenchmarkRelay measures the relay in process, against an in-memory CRI
// backend: direct (client → backend) and through the relay (client → relay
// → backend), in alternating batches, single caller; the relay once with
// inplaced's interceptor table and once bare. Run it with -cpuprofile to see
// what the proxy spends its time on; no root or containerd needed.
// hack/bench.sh runs it alternately at two commits for a before/after
// (RELAY_AB).
func BenchmarkRelay(b *testing.B) {
	dir := b.TempDir()
	fake := &relayBackend{list: relayContainers(100)}
	backendSrv := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(backendSrv, fake)
	backendSock := filepath.Join(dir, "backend.sock")
	relayServe(b, backendSock, backendSrv)

	conn, err := relay.Dial(backendSock)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close() })
	st, err := store.Open(filepath.Join(dir, "state"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { st.Close() })
	ics, err := intercept.New(intercept.Options{Store: st, Fences: fence.NewRegistry(), Kubelet: kubeletview.New()})
	if err != nil {
		b.Fatal(err)
	}
	// The relay as inplaced runs it, and one with no interceptors at all: the
	// difference is what the interceptor table costs on methods it only
	// watches (ListContainers while no swap runs).
	for _, v := range []struct {
		name string
		opts []relay.Option
	}{
		{relayWithTable, []relay.Option{relay.WithInterceptors(ics.Table())}},
		{relayNoTable, nil},
	} {
		b.Run(v.name, func(b *testing.B) {
			relaySock := filepath.Join(dir, v.name+".sock")
			// The HTTP/2 router inplaced serves: pass-through streams as
			// frames, intercepted ones through its in-process gRPC server.
			relayServe(b, relaySock, relay.New(conn, v.opts...).NewServer())
			relayMeasure(b, relayDial(b, backendSock), relayDial(b, relaySock), v.name)
		})
	}
}

// BenchmarkRelay's relay variants.
const (
	relayWithTable = "interceptors"
	relayNoTable   = "bare"
)

func relayMeasure(b *testing.B, direct, proxy runtimeapi.RuntimeServiceClient, variant string) {
	for _, m := range []struct {
		name string
		do   func(context.Context, runtimeapi.RuntimeServiceClient) error
	}{
		{"Version", func(ctx context.Context, c runtimeapi.RuntimeServiceClient) error {
			_, err := c.Version(ctx, &runtimeapi.VersionRequest{})
			return err
		}},
		{"ListContainers", func(ctx context.Context, c runtimeapi.RuntimeServiceClient) error {
			_, err := c.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
			return err
		}},
	} {
		b.Run(m.name, func(b *testing.B) {
			ctx := context.Background()
			const batch = 64
			var dS, pS []time.Duration
			// Heap allocations per path, read around each batch (outside the
			// timed calls): the relay's own are the proxy path's minus the
			// direct path's.
			var ms runtime.MemStats
			var allocBytes, allocs [2]uint64
			run := func(c runtimeapi.RuntimeServiceClient, out *[]time.Duration) {
				runtime.ReadMemStats(&ms)
				b0, n0 := ms.TotalAlloc, ms.Mallocs
				for range batch {
					t0 := time.Now()
					if err := m.do(ctx, c); err != nil {
						b.Fatal(err)
					}
					*out = append(*out, time.Since(t0))
				}
				runtime.ReadMemStats(&ms)
				i := 0
				if c == proxy {
					i = 1
				}
				allocBytes[i] += ms.TotalAlloc - b0
				allocs[i] += ms.Mallocs - n0
			}
			var warm []time.Duration
			run(direct, &warm)
			run(proxy, &warm)
			allocBytes, allocs = [2]uint64{}, [2]uint64{}
			round := 0
			for b.Loop() {
				if round%2 == 0 {
					run(direct, &dS)
					run(proxy, &pS)
				} else {
					run(proxy, &pS)
					run(direct, &dS)
				}
				round++
			}
			for len(dS) < criMinSamples {
				run(direct, &dS)
				run(proxy, &pS)
				round++
			}
			l := &report.Latency{Backend: report.InProcessBackend, Method: m.name, Concurrency: 1, Rounds: round,
				Direct: report.Summarize(dS), Proxy: report.Summarize(pS), Phase: relayPhase(), Variant: variant}
			if m.name == "ListContainers" {
				l.Note = "100 containers"
			}
			perCall := func(v uint64, n int) float64 { return float64(v) / float64(n) }
			l.ProxyAllocBytes = int64(perCall(allocBytes[1], len(pS)) - perCall(allocBytes[0], len(dS)))
			l.ProxyAllocs = int64(perCall(allocs[1], len(pS)) - perCall(allocs[0], len(dS)))
			b.ReportMetric(float64(l.ProxyAllocBytes), "relay-B/call")
			b.ReportMetric(float64(l.ProxyAllocs), "relay-allocs/call")
			b.ReportMetric(float64(l.Proxy.P50-l.Direct.P50), "ns/op")
			b.ReportMetric(float64(l.Direct.P50)/1e3, "direct-p50-µs")
			b.ReportMetric(float64(l.Proxy.P50)/1e3, "proxy-p50-µs")
			b.ReportMetric(float64(l.Proxy.P50)/float64(l.Direct.P50), "p50-ratio")
			mustAppend(b, report.Record{Latency: l})
		})
	}
}
