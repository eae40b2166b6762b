package control

import (
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/inplaced/inplaced/pkg/events"
	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

// Watch implements inplacedv1.ControlServer.
func (s *Server) Watch(req *inplacedv1.WatchRequest, out grpc.ServerStreamingServer[inplacedv1.Event]) error {
	if s.hub == nil {
		return status.Error(codes.Unimplemented, "watch is not enabled in this daemon")
	}
	c, done := s.hub.Subscribe(events.Filter{Namespace: req.Namespace, Pod: req.Pod})
	defer done()
	// Headers now, so the caller knows it is subscribed before any event.
	if err := out.SendHeader(nil); err != nil {
		return nil
	}
	for {
		select {
		case <-out.Context().Done():
			return nil
		case ev, ok := <-c:
			if !ok {
				return nil
			}
			if err := out.Send(ev); err != nil {
				return nil
			}
		}
	}
}
