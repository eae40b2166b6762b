package install

import (
	"context"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// CRIClient asks a CRI socket for its version over a fresh connection each
// time: a socket that is not there yet, or a service that restarts, costs
// one failed try.
type CRIClient struct {
	// Timeout bounds one call (default 3 s).
	Timeout time.Duration
}

var _ CRI = CRIClient{}

// Version is the runtime's name and version as the socket answers them:
// through inplaced, the backend's.
func (c CRIClient) Version(ctx context.Context, socket string) (string, error) {
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return "", err
	}
	defer conn.Close()
	t := c.Timeout
	if t <= 0 {
		t = 3 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, t)
	defer cancel()
	r, err := runtimeapi.NewRuntimeServiceClient(conn).Version(ctx, &runtimeapi.VersionRequest{})
	if err != nil {
		return "", err
	}
	return r.RuntimeName + " " + r.RuntimeVersion, nil
}
