package control

import (
	"context"
	"errors"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/inplaced/inplaced/pkg/swap"
)

// grpcError maps the engine's refusals to their gRPC codes, once, at the
// control API's edge. Any other error keeps its own status: a runtime's
// NotFound reaches the caller as NotFound.
func grpcError(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	for _, m := range []struct {
		kind error
		code codes.Code
	}{
		{swap.ErrInvalid, codes.InvalidArgument},
		{swap.ErrNotFound, codes.NotFound},
		{swap.ErrRefused, codes.FailedPrecondition},
	} {
		if errors.Is(err, m.kind) {
			return status.Error(m.code, err.Error())
		}
	}
	return err
}

// The interceptors that apply grpcError to every call's error; inside the
// audit log's, so that it records the code the caller gets.
func mapUnary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	resp, err := h(ctx, req)
	return resp, grpcError(err)
}

func mapStream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	return grpcError(h(srv, ss))
}
