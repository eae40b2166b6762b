package relay

import (
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
)

// Dial opens a lazily connecting client to a CRI endpoint
// ("unix:///run/containerd/containerd.sock" or a bare socket path).
//
// The reconnect back-off is capped at one second: when containerd restarts,
// calls fail fast with Unavailable (non-wait-for-ready RPCs do so while the
// connection is in TRANSIENT_FAILURE) and succeed again within about a second
// of containerd being back, without restarting inplaced.
func Dial(endpoint string) (*grpc.ClientConn, error) {
	target, err := Target(endpoint)
	if err != nil {
		return nil, err
	}
	bo := backoff.DefaultConfig
	bo.BaseDelay = 50 * time.Millisecond
	bo.MaxDelay = time.Second
	conn, err := grpc.NewClient(target,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: bo, MinConnectTimeout: 2 * time.Second}),
		grpc.WithStaticStreamWindowSize(streamWindow),
		grpc.WithStaticConnWindowSize(connWindow),
		grpc.WithDefaultCallOptions(
			grpc.ForceCodecV2(codecV2{}),
			grpc.MaxCallRecvMsgSize(MaxMsgSize),
			grpc.MaxCallSendMsgSize(MaxMsgSize),
		),
	)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", endpoint, err)
	}
	conn.Connect()
	return conn, nil
}

// Target normalises a CRI endpoint to a gRPC target. Only unix sockets are
// accepted: CRI endpoints are local, and a TCP endpoint would expose the
// runtime.
func Target(endpoint string) (string, error) {
	switch {
	case strings.HasPrefix(endpoint, "unix://"):
		if len(endpoint) == len("unix://") {
			return "", fmt.Errorf("endpoint %q has no socket path", endpoint)
		}
		return endpoint, nil
	case strings.HasPrefix(endpoint, "/"):
		return "unix://" + endpoint, nil
	default:
		return "", fmt.Errorf("endpoint %q: want unix:///path/to.sock or an absolute socket path", endpoint)
	}
}
