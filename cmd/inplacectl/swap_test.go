package main

import (
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"

	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

// swapCapture is a control server that records each swap request and
// answers it with a committed record.
type swapCapture struct {
	inplacedv1.UnimplementedControlServer
	got []*inplacedv1.SwapRequest
}

func (s *swapCapture) Swap(req *inplacedv1.SwapRequest, stream grpc.ServerStreamingServer[inplacedv1.SwapEvent]) error {
	s.got = append(s.got, req)
	return stream.Send(&inplacedv1.SwapEvent{Record: &inplacedv1.SwapRecord{Id: "s1", State: inplacedv1.SwapState_SWAP_STATE_COMMITTED}})
}

// serveControl serves c on a unix socket for the test and returns its path.
func serveControl(t *testing.T, c inplacedv1.ControlServer) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "ictl") // short: a socket path has 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "control.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	inplacedv1.RegisterControlServer(srv, c)
	go srv.Serve(l)
	t.Cleanup(srv.Stop)
	return sock
}

// What `inplacectl swap`'s arguments and flags send, and what they refuse
// before calling inplaced.
func TestSwapRequestFromFlags(t *testing.T) {
	image := "reg/app:v2"
	for _, tc := range []struct {
		name    string
		args    []string
		want    *inplacedv1.SwapRequest
		wantErr string
	}{{
		name: "image only",
		args: []string{"web", "-n", "shop", "-c", "app", "--image", image},
		want: &inplacedv1.SwapRequest{
			Target:  &inplacedv1.Target{Namespace: "shop", Pod: "web", Container: "app"},
			Change:  &inplacedv1.Change{Image: &image},
			Options: &inplacedv1.SwapOptions{HealthTimeoutMs: 30000},
		},
	}, {
		name: "every change and option",
		args: []string{"--id", "abc", "--env", "A=1", "--env", "B=x=y", "--unset-env", "C", "--command", "/bin/app",
			"--args", "-v", "--cpu", "1500m", "--cpu-request", "250m", "--memory", "512Mi", "--grace-period", "5",
			"--min-runtime", "2s", "--health-http", "8080/healthz", "--health-timeout", "10s",
			"--pre-stop-exec", "drain", "--post-start-exec", "warm", "--skip-pre-stop"},
		want: &inplacedv1.SwapRequest{
			Target: &inplacedv1.Target{ContainerId: "abc"},
			Change: &inplacedv1.Change{SetEnv: map[string]string{"A": "1", "B": "x=y"}, UnsetEnv: []string{"C"},
				SetCommand: true, Command: []string{"/bin/app"}, SetArgs: true, Args: []string{"-v"},
				Resources: &inplacedv1.Resources{CpuLimitMillis: 1500, CpuRequestMillis: 250, MemoryLimitBytes: 512 << 20}},
			Options: &inplacedv1.SwapOptions{GracePeriodSeconds: 5, MinRuntimeMs: 2000, HealthTimeoutMs: 10000, SkipPreStop: true,
				PreStop:     &inplacedv1.Handler{Exec: []string{"drain"}},
				PostStart:   &inplacedv1.Handler{Exec: []string{"warm"}},
				HealthCheck: &inplacedv1.Handler{HttpGet: &inplacedv1.HTTPGet{Port: 8080, Path: "/healthz"}}},
		},
	}, {
		name: "health exec before tcp",
		args: []string{"--id", "abc", "--health-exec", "true", "--health-tcp", "80"},
		want: &inplacedv1.SwapRequest{
			Target:  &inplacedv1.Target{ContainerId: "abc"},
			Change:  &inplacedv1.Change{},
			Options: &inplacedv1.SwapOptions{HealthTimeoutMs: 30000, HealthCheck: &inplacedv1.Handler{Exec: []string{"true"}}},
		},
	}, {
		name: "health tcp",
		args: []string{"--id", "abc", "--health-tcp", "80"},
		want: &inplacedv1.SwapRequest{
			Target:  &inplacedv1.Target{ContainerId: "abc"},
			Change:  &inplacedv1.Change{},
			Options: &inplacedv1.SwapOptions{HealthTimeoutMs: 30000, HealthCheck: &inplacedv1.Handler{TcpPort: 80}},
		},
	}, {
		name: "privileged is sent (and refused by inplaced)",
		args: []string{"--id", "abc", "--privileged"},
		want: &inplacedv1.SwapRequest{
			Target:  &inplacedv1.Target{ContainerId: "abc"},
			Change:  &inplacedv1.Change{Privileged: proto.Bool(true)},
			Options: &inplacedv1.SwapOptions{HealthTimeoutMs: 30000},
		},
	},
		{name: "overlap", args: []string{"web", "-n", "shop", "-c", "app", "--image", image, "--strategy", "Overlap"},
			want: &inplacedv1.SwapRequest{
				Target:  &inplacedv1.Target{Namespace: "shop", Pod: "web", Container: "app"},
				Change:  &inplacedv1.Change{Image: &image},
				Options: &inplacedv1.SwapOptions{HealthTimeoutMs: 30000, Strategy: "overlap"},
			}},
		{name: "bad strategy", args: []string{"--id", "abc", "--image", image, "--strategy", "blue-green"},
			wantErr: `--strategy "blue-green": use stop-first or overlap; nothing was changed`},
		{name: "no target", args: []string{"--image", image}, wantErr: "no target"},
		{name: "bad env", args: []string{"--id", "abc", "--env", "=1"}, wantErr: `--env "=1": want KEY=VALUE`},
		{name: "bad resources", args: []string{"--id", "abc", "--memory", "-1"}, wantErr: `--memory "-1"`},
		{name: "bad health-http", args: []string{"--id", "abc", "--health-http", "x/healthz"}, wantErr: `--health-http "x/healthz"`},
		{name: "missing registry auth file", args: []string{"--id", "abc", "--registry-auth", "/nonexistent/auth.json"}, wantErr: "auth.json"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := &swapCapture{}
			g := &globals{socket: serveControl(t, srv), output: "table"}
			cmd := newSwapCommand(g)
			cmd.SetArgs(tc.args)
			cmd.SetOut(io.Discard)
			cmd.SetErr(io.Discard)
			err := cmd.Execute()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one with %q", err, tc.wantErr)
				}
				if len(srv.got) != 0 {
					t.Fatalf("a refused request was sent: %v", srv.got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(srv.got) != 1 {
				t.Fatalf("%d requests sent, want 1", len(srv.got))
			}
			if !proto.Equal(tc.want, srv.got[0]) {
				t.Errorf("request\n%s\nwant\n%s", prototext.Format(srv.got[0]), prototext.Format(tc.want))
			}
		})
	}
}
