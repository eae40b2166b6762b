package harness

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// CRILoad calls Version and ListContainers through a CRI endpoint, each at
// a steady rate, with kubelet's CRI client settings, and records every
// call: what a restart of inplaced must not fail.
type CRILoad struct {
	conn *grpc.ClientConn
	rt   runtimeapi.RuntimeServiceClient
	stop chan struct{}
	done chan struct{}
	wg   sync.WaitGroup

	mu    sync.Mutex
	calls []CRICall
}

// CRICall is one call of a CRILoad.
type CRICall struct {
	Method string
	At     time.Time
	Took   time.Duration
	Err    error
}

// KubeletDialOptions are the options kubelet's CRI client dials with
// (k8s.io/cri-client, remote_runtime.go, v0.37): a connection attempt gets
// MinConnectTimeout 5 s, the backoff starts at 100 ms and stops growing at
// 3 s, messages up to 16 MiB, authority "localhost"; calls are not
// wait-for-ready (one made while the connection is in TRANSIENT_FAILURE
// fails at once with Unavailable).
func KubeletDialOptions() []grpc.DialOption {
	params := grpc.ConnectParams{Backoff: backoff.DefaultConfig, MinConnectTimeout: 5 * time.Second}
	params.Backoff.BaseDelay, params.Backoff.MaxDelay = 100*time.Millisecond, 3*time.Second
	return []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithAuthority("localhost"),
		grpc.WithConnectParams(params), grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16 << 20)),
	}
}

// kubeletCallTimeout is kubelet's default --runtime-request-timeout.
const kubeletCallTimeout = 2 * time.Minute

// StartCRILoad calls Version and ListContainers perSecond times a second
// each through endpoint, each call in its own goroutine as kubelet's
// goroutines make them, until Stop.
func StartCRILoad(tb testing.TB, endpoint string, perSecond int) *CRILoad {
	tb.Helper()
	if !strings.HasPrefix(endpoint, "unix://") {
		endpoint = "unix://" + endpoint
	}
	conn, err := grpc.NewClient(endpoint, KubeletDialOptions()...)
	if err != nil {
		tb.Fatal(err)
	}
	l := &CRILoad{conn: conn, rt: runtimeapi.NewRuntimeServiceClient(conn), stop: make(chan struct{}), done: make(chan struct{})}
	tb.Cleanup(func() { l.Stop() })
	go l.run(time.Second / time.Duration(perSecond))
	return l
}

func (l *CRILoad) run(every time.Duration) {
	defer close(l.done)
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-tick.C:
		}
		l.wg.Add(2)
		go l.call("Version", func(ctx context.Context) error {
			_, err := l.rt.Version(ctx, &runtimeapi.VersionRequest{})
			return err
		})
		go l.call("ListContainers", func(ctx context.Context) error {
			_, err := l.rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
			return err
		})
	}
}

func (l *CRILoad) call(method string, do func(context.Context) error) {
	defer l.wg.Done()
	ctx, cancel := context.WithTimeout(context.Background(), kubeletCallTimeout)
	defer cancel()
	c := CRICall{Method: method, At: time.Now()}
	c.Err = do(ctx)
	c.Took = time.Since(c.At)
	l.mu.Lock()
	l.calls = append(l.calls, c)
	l.mu.Unlock()
}

// Stop stops calling, waits for the calls under way and returns every
// call, in the order they were made.
func (l *CRILoad) Stop() []CRICall {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	<-l.done
	l.wg.Wait()
	_ = l.conn.Close()
	l.mu.Lock()
	defer l.mu.Unlock()
	calls := append([]CRICall(nil), l.calls...)
	sort.Slice(calls, func(i, j int) bool { return calls[i].At.Before(calls[j].At) })
	return calls
}

// CallStats sums up calls.
type CallStats struct {
	Calls, Failed int
	Max           time.Duration
	MaxAt         time.Time // when the slowest call was made
	Errors        []string  // the first failures, with when they were made
}

// Stats sums up the calls made in [from, to) (zero times: unbounded).
func Stats(calls []CRICall, from, to time.Time) CallStats {
	var s CallStats
	for _, c := range calls {
		if (!from.IsZero() && c.At.Before(from)) || (!to.IsZero() && !c.At.Before(to)) {
			continue
		}
		s.Calls++
		if c.Took > s.Max {
			s.Max, s.MaxAt = c.Took, c.At
		}
		if c.Err != nil {
			s.Failed++
			if len(s.Errors) < 10 {
				s.Errors = append(s.Errors, fmt.Sprintf("%s at %s (took %s): %v", c.Method, c.At.Format("15:04:05.000"), c.Took.Round(time.Millisecond), c.Err))
			}
		}
	}
	return s
}
