// Package daemon wires inplaced together: backend connections, the CRI relay
// with its interceptors, the state store, the swap engine and the control
// API, and runs them until the context ends.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/inplaced/inplaced/pkg/config"
	"github.com/inplaced/inplaced/pkg/relay"
)

// Run serves until ctx is cancelled, then shuts down gracefully: it stops
// accepting, lets in-flight unary calls finish within cfg.ShutdownTimeout,
// ends streams, and returns nil.
func Run(ctx context.Context, cfg config.Config, log *zap.Logger) (retErr error) {
	if err := cfg.Validate(); err != nil {
		return err
	}
	runtimeConn, err := relay.Dial(cfg.RuntimeEndpoint)
	if err != nil {
		return fmt.Errorf("runtime endpoint: %w", err)
	}
	defer runtimeConn.Close()
	imageConn := runtimeConn
	if cfg.EffectiveImageEndpoint() != cfg.RuntimeEndpoint {
		if imageConn, err = relay.Dial(cfg.EffectiveImageEndpoint()); err != nil {
			return fmt.Errorf("image endpoint: %w", err)
		}
		defer imageConn.Close()
	}

	table := relay.Table{}
	r := relay.New(runtimeConn,
		relay.WithImageConn(imageConn),
		relay.WithInterceptors(table),
		relay.WithLogger(log.Named("relay")),
	)

	lis, err := listenUnix(cfg.Listen)
	if err != nil {
		return err
	}
	srv := grpc.NewServer(r.ServerOptions()...)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(lis) }()

	log.Info("serving CRI",
		zap.String("listen", cfg.Listen),
		zap.String("runtime_endpoint", cfg.RuntimeEndpoint),
		zap.String("image_endpoint", cfg.EffectiveImageEndpoint()))
	if _, err := daemon.SdNotify(false, daemon.SdNotifyReady); err != nil {
		log.Warn("sd_notify READY failed", zap.Error(err))
	}

	select {
	case <-ctx.Done():
	case err := <-errc:
		return fmt.Errorf("CRI server stopped: %w", err)
	}
	log.Info("shutting down", zap.Duration("timeout", cfg.ShutdownTimeout.D()))
	_, _ = daemon.SdNotify(false, daemon.SdNotifyStopping)
	gracefulStop(srv, r, cfg.ShutdownTimeout.D())
	if err := <-errc; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	return nil
}

// gracefulStop ends streams at once (they never finish by themselves), lets
// unary calls finish, and cuts them off after timeout.
func gracefulStop(srv *grpc.Server, r *relay.Relay, timeout time.Duration) {
	r.Drain()
	done := make(chan struct{})
	go func() { srv.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(timeout):
		srv.Stop()
		<-done
	}
}
