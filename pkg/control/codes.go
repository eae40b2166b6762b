package control

import (
	"context"

	"google.golang.org/grpc"

	"github.com/inplaced/inplaced/pkg/errkind"
)

// grpcError is err as the caller gets it: the kinds of package errkind
// (the engine's and the resizer's refusals) mapped to their gRPC codes,
// once, at the control API's edge. Any other error keeps its own status: a
// runtime's NotFound reaches the caller as NotFound.
func grpcError(err error) error { return errkind.GRPC(err) }

// The interceptors that apply grpcError to every call's error; inside the
// audit log's, so that it records the code the caller gets.
func mapUnary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	resp, err := h(ctx, req)
	return resp, grpcError(err)
}

func mapStream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	return grpcError(h(srv, ss))
}
