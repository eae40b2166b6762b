package install

import (
	"context"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

// ControlClient lists an inplaced's running swaps over its control API.
type ControlClient struct{}

var _ Swaps = ControlClient{}

// Running names the swaps in state RUNNING as namespace/pod/container.
func (ControlClient) Running(ctx context.Context, socket string) ([]string, error) {
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	r, err := inplacedv1.NewControlClient(conn).ListSwaps(ctx, &inplacedv1.ListSwapsRequest{})
	if err != nil {
		return nil, err
	}
	var out []string
	for _, s := range r.Swaps {
		if s.State == inplacedv1.SwapState_SWAP_STATE_RUNNING {
			out = append(out, s.Namespace+"/"+s.Pod+"/"+s.Container)
		}
	}
	return out, nil
}
