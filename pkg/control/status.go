package control

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

// StatusFunc says how inplaced serves now (package daemon).
type StatusFunc func() *inplacedv1.StatusResponse

// Status implements inplacedv1.ControlServer.
func (s *Server) Status(context.Context, *inplacedv1.StatusRequest) (*inplacedv1.StatusResponse, error) {
	if s.status == nil {
		return nil, status.Error(codes.Unimplemented, "status is not wired in this server")
	}
	return s.status(), nil
}
