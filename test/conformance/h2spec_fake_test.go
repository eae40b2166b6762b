package conformance

import (
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"

	"github.com/inplaced/inplaced/pkg/relay"
	"github.com/inplaced/inplaced/test/harness"
)

// TestH2specFakeBackend runs h2spec against a grpc-go server standing in for
// containerd (the grpc-go this module builds with, as containerd configures
// it: no stream limit), directly and through the relay in each mode, in
// process: no root, no containerd. It shows the relay's own share of
// TestH2spec's differences, under the same rules (compareH2spec); the
// router must besides pass every case.
func TestH2specFakeBackend(t *testing.T) {
	if os.Getenv("INPLACED_CONFORMANCE") != "1" {
		t.Skip("set INPLACED_CONFORMANCE=1 (hack/conformance.sh) to run h2spec")
	}
	bin := harness.H2specPath()
	harness.RequireTool(t, "h2spec", bin)
	dir := t.TempDir()
	beSock := serveGRPCGo(t, filepath.Join(dir, "be.sock"))
	results := map[Mode]*Result{}
	for _, m := range []Mode{Direct, Proxy, ProxyGRPC, GRPCGo} {
		var sock string
		switch m {
		case Direct:
			sock = beSock
		case GRPCGo:
			sock = serveGRPCGo(t, filepath.Join(dir, "grpc-go.sock"), relay.FallbackLimits()...)
		default:
			sock = serveRelay(t, beSock, filepath.Join(dir, string(m)+".sock"), m == ProxyGRPC)
		}
		results[m] = runH2specOn(t, bin, sock, "fake", m)
	}
	compareH2spec(t, "fake", results)
	if r := results[Proxy]; len(r.Failed) > 0 || len(r.Skipped) > 0 {
		t.Errorf("the router: %d failed, %d skipped; want every case passed", len(r.Failed), len(r.Skipped))
	}
}

// runH2specGRPCGo is h2spec's result against grpc-go of this build as
// --relay=grpc configures its server (GRPCGo).
func runH2specGRPCGo(t *testing.T, bin string) *Result {
	t.Helper()
	sock := serveGRPCGo(t, filepath.Join(t.TempDir(), "grpc-go.sock"), relay.FallbackLimits()...)
	return runH2specOn(t, bin, sock, "in-process", GRPCGo)
}

// runH2specOn runs h2spec against sock and logs the counts and failures.
func runH2specOn(t *testing.T, bin, sock, backend string, m Mode) *Result {
	t.Helper()
	res, err := RunH2spec(t, bin, sock, backend+"-"+string(m))
	if err != nil {
		t.Fatalf("h2spec %s %s: %v", backend, m, err)
	}
	res.Backend, res.Mode = backend, m
	t.Logf("h2spec %s %s: %d passed, %d failed, %d skipped in %s",
		backend, m, len(res.Passed), len(res.Failed), len(res.Skipped), res.Duration.Round(time.Second))
	return res
}

// serveGRPCGo serves a grpc-go server with opts on sock, answering every
// call with an empty message.
func serveGRPCGo(t *testing.T, sock string, opts ...grpc.ServerOption) string {
	t.Helper()
	srv := grpc.NewServer(append([]grpc.ServerOption{grpc.UnknownServiceHandler(answerEmpty), grpc.ForceServerCodec(rawCodec{})}, opts...)...)
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return sock
}

// serveRelay serves the relay to the backend at beSock on a socket of its
// own, through grpc-go's server (relay: grpc) or the router.
func serveRelay(t *testing.T, beSock, sock string, grpcMode bool) string {
	t.Helper()
	conn, err := relay.Dial("unix://" + beSock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	var opts []relay.Option
	if grpcMode {
		opts = append(opts, relay.WithGRPCServer())
	}
	srv := relay.New(conn, opts...).NewServer()
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return sock
}

// answerEmpty answers any call with one empty message, after the caller's
// request has ended.
func answerEmpty(_ any, ss grpc.ServerStream) error {
	for {
		var in []byte
		if err := ss.RecvMsg(&in); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return err
		}
	}
	out := []byte{}
	return ss.SendMsg(&out)
}

// rawCodec passes messages as bytes.
type rawCodec struct{}

var _ encoding.Codec = rawCodec{}

func (rawCodec) Marshal(v any) ([]byte, error) { return *v.(*[]byte), nil }

func (rawCodec) Unmarshal(data []byte, v any) error {
	*v.(*[]byte) = append((*v.(*[]byte))[:0], data...)
	return nil
}

func (rawCodec) Name() string { return "proto" }
