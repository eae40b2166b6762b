package control

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

// prepulls are the prepulls under way, by ID, for CancelPrepull.
type prepulls struct {
	mu  sync.Mutex
	run map[string]context.CancelCauseFunc
}

// errPrepullCancelled is the cause of a prepull stopped by CancelPrepull.
var errPrepullCancelled = errors.New("prepull cancelled by the caller")

// Prepull implements inplacedv1.ControlServer. The pulls run on a context
// of their own: a caller that goes away leaves them running.
func (s *Server) Prepull(req *inplacedv1.PrepullRequest, out grpc.ServerStreamingServer[inplacedv1.PullProgress]) error {
	if s.puller == nil {
		return status.Error(codes.Unimplemented, "prepull is not enabled in this daemon")
	}
	if len(req.Images) == 0 {
		return status.Error(codes.InvalidArgument, "no image given")
	}
	var auth *runtimeapi.AuthConfig
	if a := req.Auth; a != nil {
		auth = &runtimeapi.AuthConfig{Username: a.Username, Password: a.Password, Auth: a.Auth,
			ServerAddress: a.ServerAddress, IdentityToken: a.IdentityToken, RegistryToken: a.RegistryToken}
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	ctx, cancel := context.WithCancelCause(context.Background())
	s.prepull.mu.Lock()
	if s.prepull.run == nil {
		s.prepull.run = map[string]context.CancelCauseFunc{}
	}
	s.prepull.run[id] = cancel
	s.prepull.mu.Unlock()

	updates := make(chan *inplacedv1.PullProgress, 1024)
	results := make(chan error, 1)
	go func() {
		defer func() {
			s.prepull.mu.Lock()
			delete(s.prepull.run, id)
			s.prepull.mu.Unlock()
			cancel(nil)
			close(updates)
		}()
		var errs []error
		for _, image := range req.Images {
			_, err := s.puller.Pull(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: image, UserSpecifiedImage: image}, Auth: auth},
				func(p *inplacedv1.PullProgress) {
					p.PrepullId = id
					select {
					case updates <- p:
					default: // a caller that does not read loses updates, never the pull
					}
				})
			if err != nil {
				errs = append(errs, err)
			}
			if ctx.Err() != nil {
				break
			}
		}
		auth = nil
		if ctx.Err() != nil {
			results <- status.Error(codes.Canceled, context.Cause(ctx).Error())
			return
		}
		if len(errs) > 0 {
			results <- status.Errorf(status.Code(errs[0]), "%v", errors.Join(errs...))
			return
		}
		results <- nil
	}()
	gone := false
	for p := range updates {
		if gone {
			continue
		}
		if err := out.Send(p); err != nil {
			gone = true // the pulls go on
		}
	}
	if gone {
		return nil
	}
	return <-results
}

// CancelPrepull implements inplacedv1.ControlServer.
func (s *Server) CancelPrepull(_ context.Context, req *inplacedv1.CancelPrepullRequest) (*inplacedv1.CancelPrepullResponse, error) {
	s.prepull.mu.Lock()
	cancel := s.prepull.run[req.Id]
	s.prepull.mu.Unlock()
	if cancel == nil {
		return nil, status.Errorf(codes.NotFound, "no prepull %q under way", req.Id)
	}
	cancel(errPrepullCancelled)
	return &inplacedv1.CancelPrepullResponse{}, nil
}
