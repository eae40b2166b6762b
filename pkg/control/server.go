// Package control serves the inplaced.v1 Control API on the control socket.
// It is a thin edge: it reads the caller's credentials, hands requests to
// the swap engine and the resizer, and streams events back. The engine's
// refusals (swap.ErrInvalid, ErrNotFound, ErrRefused) get their gRPC codes
// here, once, in an interceptor (codes.go); a runtime's status passes as it
// is.
package control

import (
	"context"
	"errors"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/pkg/caller"
	"github.com/inplaced/inplaced/pkg/events"
	"github.com/inplaced/inplaced/pkg/store"
	"github.com/inplaced/inplaced/pkg/swap"
	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

// Resizer performs in-place resizes (package resize). Optional.
type Resizer interface {
	Resize(ctx context.Context, req *inplacedv1.ResizeRequest, uid, pid int64) (*inplacedv1.ResizeRecord, error)
}

// Server implements inplacedv1.ControlServer.
type Server struct {
	inplacedv1.UnimplementedControlServer
	engine  *swap.Engine
	store   *store.Store
	resizer Resizer
	pods    PodChecker
	hub     *events.Hub
	puller  swap.Puller
	view    runtimeapi.RuntimeServiceClient
	prepull prepulls
	status  StatusFunc
}

// PodChecker lists the pods that no longer fit the node (package kube).
type PodChecker interface {
	Misfits() (node string, checked int, misfits []*inplacedv1.PodFit, err error)
}

// CheckPods lists the pods on the node that no longer fit it.
func (s *Server) CheckPods(context.Context, *inplacedv1.CheckPodsRequest) (*inplacedv1.CheckPodsResponse, error) {
	if s.pods == nil {
		return nil, status.Error(codes.FailedPrecondition, "Kubernetes mode is off: start inplaced with --kubeconfig to check pods against their node")
	}
	node, n, misfits, err := s.pods.Misfits()
	if err != nil {
		return nil, err
	}
	return &inplacedv1.CheckPodsResponse{Node: node, PodsChecked: int32(n), Misfits: misfits}, nil
}

// Options configures a Server. Engine and Store are required; each other
// part enables the calls that need it (without it they say so).
type Options struct {
	Engine *swap.Engine
	Store  *store.Store
	// Resizer enables Resize.
	Resizer Resizer
	// Events enables Watch.
	Events *events.Hub
	// Puller enables Prepull.
	Puller swap.Puller
	// KubeletView enables ListContainers: a client of inplaced's own CRI
	// socket, so the list is what kubelet sees.
	KubeletView runtimeapi.RuntimeServiceClient
	// PodChecker enables CheckPods (Kubernetes mode).
	PodChecker PodChecker
	// Status enables Status.
	Status StatusFunc
}

// New returns a control server.
func New(o Options) (*Server, error) {
	if o.Engine == nil || o.Store == nil {
		return nil, errors.New("control.New: engine and store are required")
	}
	return &Server{engine: o.Engine, store: o.Store, resizer: o.Resizer, hub: o.Events, puller: o.Puller,
		view: o.KubeletView, pods: o.PodChecker, status: o.Status}, nil
}

// ServerOptions are the grpc.Server options the control socket needs: the
// peer credentials, the audit log (one line per call; nil: none) and the
// mapping of the engine's refusals to gRPC codes (grpcError).
func ServerOptions(audit *zap.Logger) []grpc.ServerOption {
	opts := []grpc.ServerOption{grpc.Creds(caller.Credentials())}
	if audit != nil {
		a := auditor{log: audit}
		opts = append(opts, grpc.ChainUnaryInterceptor(a.unary), grpc.ChainStreamInterceptor(a.stream))
	}
	// Chained after the audit's: errors are mapped before it logs them.
	return append(opts, grpc.ChainUnaryInterceptor(mapUnary), grpc.ChainStreamInterceptor(mapStream))
}

// callerOf is the peer as the swap engine records it.
func callerOf(ctx context.Context) swap.Caller {
	c := caller.FromContext(ctx)
	return swap.Caller{UID: c.UID, PID: c.PID, Exe: c.Exe}
}

// Register registers the service.
func (s *Server) Register(g *grpc.Server) { inplacedv1.RegisterControlServer(g, s) }

func stream(sub *swap.Subscription, out grpc.ServerStreamingServer[inplacedv1.SwapEvent]) error {
	for ev := range sub.C {
		if err := out.Send(ev); err != nil {
			// The caller went away; the swap goes on.
			return nil
		}
	}
	return nil
}

// Swap implements inplacedv1.ControlServer.
func (s *Server) Swap(req *inplacedv1.SwapRequest, out grpc.ServerStreamingServer[inplacedv1.SwapEvent]) error {
	sub, err := s.engine.Start(out.Context(), req, callerOf(out.Context()), swap.Hooks{})
	if err != nil {
		return err
	}
	return stream(sub, out)
}

// Revert implements inplacedv1.ControlServer.
func (s *Server) Revert(req *inplacedv1.RevertRequest, out grpc.ServerStreamingServer[inplacedv1.SwapEvent]) error {
	sub, err := s.engine.Revert(out.Context(), req, callerOf(out.Context()))
	if err != nil {
		return err
	}
	return stream(sub, out)
}

// WatchSwap implements inplacedv1.ControlServer.
func (s *Server) WatchSwap(req *inplacedv1.WatchSwapRequest, out grpc.ServerStreamingServer[inplacedv1.SwapEvent]) error {
	sub, rec, err := s.engine.Watch(req.Id)
	if err != nil {
		return err
	}
	if sub == nil {
		return out.Send(&inplacedv1.SwapEvent{SwapId: rec.Id, Step: "end", Message: rec.State.String(), Record: rec})
	}
	return stream(sub, out)
}

// GetSwap implements inplacedv1.ControlServer.
func (s *Server) GetSwap(_ context.Context, req *inplacedv1.GetSwapRequest) (*inplacedv1.SwapRecord, error) {
	rec, err := s.store.Swap(req.Id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, status.Errorf(codes.NotFound, "no swap %q: inplacectl swaps lists them", req.Id)
	}
	return rec, err
}

// ListSwaps implements inplacedv1.ControlServer.
func (s *Server) ListSwaps(ctx context.Context, req *inplacedv1.ListSwapsRequest) (*inplacedv1.ListSwapsResponse, error) {
	recs, err := s.engine.List(ctx, req.Target)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "%v", err)
	}
	return &inplacedv1.ListSwapsResponse{Swaps: recs}, nil
}

// ListOverrides implements inplacedv1.ControlServer.
func (s *Server) ListOverrides(context.Context, *inplacedv1.ListOverridesRequest) (*inplacedv1.ListOverridesResponse, error) {
	os, err := s.store.Overrides()
	if err != nil {
		return nil, status.Errorf(codes.Internal, "read overrides: %v", err)
	}
	resp := &inplacedv1.ListOverridesResponse{}
	for _, o := range os {
		to := &inplacedv1.ConfigSummary{Image: o.Image, Command: o.Command, Args: o.Args}
		for _, kv := range o.Env {
			to.Env = append(to.Env, kv.Key)
		}
		resp.Overrides = append(resp.Overrides, &inplacedv1.Override{Namespace: o.Namespace, Pod: o.Pod, PodUid: o.PodUID,
			Container: o.Container, SwapId: o.SwapID, Hash: o.Hash, To: to, SandboxId: o.SandboxID})
	}
	return resp, nil
}

// Resize implements inplacedv1.ControlServer.
func (s *Server) Resize(ctx context.Context, req *inplacedv1.ResizeRequest) (*inplacedv1.ResizeRecord, error) {
	if s.resizer == nil {
		return nil, status.Error(codes.Unimplemented, "resize is not enabled in this daemon")
	}
	c := caller.FromContext(ctx)
	return s.resizer.Resize(ctx, req, c.UID, c.PID)
}

// ListResizes implements inplacedv1.ControlServer.
func (s *Server) ListResizes(context.Context, *inplacedv1.ListResizesRequest) (*inplacedv1.ListResizesResponse, error) {
	rs, err := s.store.Resizes()
	if err != nil {
		return nil, status.Errorf(codes.Internal, "read resize history: %v", err)
	}
	return &inplacedv1.ListResizesResponse{Resizes: rs}, nil
}
