package swap

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

func TestRecordedPreStop(t *testing.T) {
	ports := `[{"name":"metrics","containerPort":9090,"protocol":"TCP"},{"name":"http","containerPort":8080,"protocol":"TCP"}]`
	for _, tc := range []struct {
		name    string
		handler string // the preStopHandler annotation, as kubelet writes it
		ports   string // the ports annotation
		want    *inplacedv1.Handler
		wantErr string
	}{
		{"none", "", "", nil, ""},
		{"exec", `{"exec":{"command":["/bin/sh","-c","nginx -s quit; sleep 1"]}}`, "",
			&inplacedv1.Handler{Exec: []string{"/bin/sh", "-c", "nginx -s quit; sleep 1"}}, ""},
		{"httpGet int port", `{"httpGet":{"path":"/shutdown","port":8080,"host":"10.0.0.7","scheme":"HTTPS"}}`, "",
			&inplacedv1.Handler{HttpGet: &inplacedv1.HTTPGet{Path: "/shutdown", Port: 8080, Host: "10.0.0.7", Scheme: "HTTPS"}}, ""},
		{"httpGet named port", `{"httpGet":{"path":"/quit","port":"http","scheme":"HTTP"}}`, ports,
			&inplacedv1.Handler{HttpGet: &inplacedv1.HTTPGet{Path: "/quit", Port: 8080, Scheme: "HTTP"}}, ""},
		{"httpGet other named port", `{"httpGet":{"port":"metrics"}}`, ports,
			&inplacedv1.Handler{HttpGet: &inplacedv1.HTTPGet{Port: 9090}}, ""},
		{"httpGet unknown named port", `{"httpGet":{"port":"admin"}}`, ports, nil, `named port "admin" not found`},
		{"httpGet named port without ports annotation", `{"httpGet":{"port":"http"}}`, "", nil, `named port "http" not found`},
		{"httpGet port of a bad type", `{"httpGet":{"port":true}}`, "", nil, "port true"},
		{"sleep", `{"sleep":{"seconds":7}}`, "", &inplacedv1.Handler{SleepSeconds: 7}, ""},
		{"tcpSocket is not a preStop kubelet runs", `{"tcpSocket":{"port":80}}`, "", nil, ""},
		{"not json", `{exec`, "", nil, AnnotationPreStop},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := &runtimeapi.ContainerConfig{Annotations: map[string]string{}}
			if tc.handler != "" {
				cfg.Annotations[AnnotationPreStop] = tc.handler
			}
			if tc.ports != "" {
				cfg.Annotations["io.kubernetes.container.ports"] = tc.ports
			}
			got, err := recordedPreStop(cfg)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(got, tc.want) {
				t.Errorf("handler = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestStopTimeout(t *testing.T) {
	for _, tc := range []struct {
		grace, spent time.Duration
		want         int64
	}{
		{30 * time.Second, 0, 30},
		{30 * time.Second, 400 * time.Millisecond, 30}, // kubelet subtracts whole seconds spent
		{30 * time.Second, 5 * time.Second, 25},
		{30 * time.Second, 5900 * time.Millisecond, 25},
		{10 * time.Second, 7900 * time.Millisecond, 3},
		{10 * time.Second, 8 * time.Second, 2},
		{10 * time.Second, 9 * time.Second, 2}, // floor
		{30 * time.Second, 29500 * time.Millisecond, 2},
		{10 * time.Second, time.Minute, 2}, // preStop overran
		{2 * time.Second, 0, 2},
		{time.Second, 0, 2},
	} {
		if got := stopTimeout(tc.grace, tc.spent); got != tc.want {
			t.Errorf("stopTimeout(%s, %s) = %d, want %d", tc.grace, tc.spent, got, tc.want)
		}
	}
}

func TestGracePeriod(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts *inplacedv1.SwapOptions
		ann  string
		want time.Duration
	}{
		{"request wins", &inplacedv1.SwapOptions{GracePeriodSeconds: 5}, "30", 5 * time.Second},
		{"pod's", nil, "45", 45 * time.Second},
		{"pod's zero: kubelet minimum", nil, "0", 2 * time.Second},
		{"none: kubelet minimum", nil, "", 2 * time.Second},
		{"bad annotation", nil, "soon", 2 * time.Second},
	} {
		cfg := &runtimeapi.ContainerConfig{Annotations: map[string]string{}}
		if tc.ann != "" {
			cfg.Annotations[AnnotationGracePeriod] = tc.ann
		}
		r := &run{opts: tc.opts, oldReq: &runtimeapi.CreateContainerRequest{Config: cfg}}
		if got := r.gracePeriod(); got != tc.want {
			t.Errorf("%s: grace = %s, want %s", tc.name, got, tc.want)
		}
	}
}

// execStub answers ExecSync with a fixed result and records the request.
type execStub struct {
	runtimeapi.RuntimeServiceClient
	resp *runtimeapi.ExecSyncResponse
	err  error
	got  *runtimeapi.ExecSyncRequest
}

func (s *execStub) ExecSync(_ context.Context, req *runtimeapi.ExecSyncRequest, _ ...grpc.CallOption) (*runtimeapi.ExecSyncResponse, error) {
	s.got = req
	return s.resp, s.err
}

func TestProbe(t *testing.T) {
	ctx := context.Background()
	t.Run("exec", func(t *testing.T) {
		stub := &execStub{resp: &runtimeapi.ExecSyncResponse{}}
		e := &Engine{rt: stub}
		if err := e.probe(ctx, "c1", "", &inplacedv1.Handler{Exec: []string{"true"}}, 1500*time.Millisecond); err != nil {
			t.Fatal(err)
		}
		if stub.got.ContainerId != "c1" || stub.got.Cmd[0] != "true" || stub.got.Timeout != 1 {
			t.Errorf("ExecSync request = %v", stub.got)
		}
		stub.resp = &runtimeapi.ExecSyncResponse{ExitCode: 3, Stderr: []byte("boom\n")}
		err := e.probe(ctx, "c1", "", &inplacedv1.Handler{Exec: []string{"false"}}, 100*time.Millisecond)
		if err == nil || !strings.Contains(err.Error(), "exited 3: boom") {
			t.Errorf("err = %v, want exit code and stderr", err)
		}
		if stub.got.Timeout != 1 {
			t.Errorf("timeout = %d, want at least 1 s", stub.got.Timeout)
		}
		stub.err = errors.New("backend down")
		if err := e.probe(ctx, "c1", "", &inplacedv1.Handler{Exec: []string{"true"}}, time.Second); err == nil {
			t.Error("ExecSync error: want an error")
		}
	})
	t.Run("httpGet", func(t *testing.T) {
		var mu sync.Mutex
		var paths []string
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			paths = append(paths, r.URL.Path)
			mu.Unlock()
			if r.URL.Path == "/bad" {
				w.WriteHeader(http.StatusServiceUnavailable)
			}
		}))
		defer srv.Close()
		u, _ := url.Parse(srv.URL)
		host, portS, _ := net.SplitHostPort(u.Host)
		port, _ := strconv.Atoi(portS)
		e := &Engine{}
		// No host: the pod IP.
		if err := e.probe(ctx, "c1", host, &inplacedv1.Handler{HttpGet: &inplacedv1.HTTPGet{Port: int32(port), Path: "healthz"}}, time.Second); err != nil {
			t.Fatal(err)
		}
		// A host given wins over the pod IP.
		if err := e.probe(ctx, "c1", "192.0.2.1", &inplacedv1.Handler{HttpGet: &inplacedv1.HTTPGet{Host: host, Port: int32(port), Path: "/ok", Scheme: "HTTP"}}, time.Second); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		if strings.Join(paths, ",") != "/healthz,/ok" {
			t.Errorf("paths = %v", paths)
		}
		mu.Unlock()
		if err := e.probe(ctx, "c1", host, &inplacedv1.Handler{HttpGet: &inplacedv1.HTTPGet{Port: int32(port), Path: "/bad"}}, time.Second); err == nil || !strings.Contains(err.Error(), "503") {
			t.Errorf("503: err = %v", err)
		}
		if err := e.probe(ctx, "c1", "", &inplacedv1.Handler{HttpGet: &inplacedv1.HTTPGet{Port: int32(port)}}, time.Second); err == nil {
			t.Error("no pod IP and no host: want an error")
		}
	})
	t.Run("tcp", func(t *testing.T) {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := lis.Addr().(*net.TCPAddr).Port
		e := &Engine{}
		if err := e.probe(ctx, "c1", "127.0.0.1", &inplacedv1.Handler{TcpPort: int64(port)}, time.Second); err != nil {
			t.Fatal(err)
		}
		lis.Close()
		if err := e.probe(ctx, "c1", "127.0.0.1", &inplacedv1.Handler{TcpPort: int64(port)}, time.Second); err == nil {
			t.Error("closed port: want an error")
		}
	})
	t.Run("sleep ends with its context", func(t *testing.T) {
		e := &Engine{}
		cctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
		defer cancel()
		start := time.Now()
		err := e.probe(cctx, "c1", "", &inplacedv1.Handler{SleepSeconds: 60}, time.Minute)
		if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 5*time.Second {
			t.Errorf("err = %v after %s, want the context's deadline at once", err, time.Since(start))
		}
	})
	t.Run("empty handler", func(t *testing.T) {
		if err := (&Engine{}).probe(ctx, "c1", "", &inplacedv1.Handler{}, time.Second); err != nil {
			t.Errorf("empty handler: %v", err)
		}
	})
}
