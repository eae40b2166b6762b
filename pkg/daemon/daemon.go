// Package daemon wires inplaced together: backend connections, the CRI relay
// with its interceptors, the state store, the swap engine and the control
// API, and runs them until the context ends.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/pkg/config"
	"github.com/inplaced/inplaced/pkg/control"
	"github.com/inplaced/inplaced/pkg/fence"
	"github.com/inplaced/inplaced/pkg/intercept"
	"github.com/inplaced/inplaced/pkg/pull"
	"github.com/inplaced/inplaced/pkg/relay"
	"github.com/inplaced/inplaced/pkg/resize"
	"github.com/inplaced/inplaced/pkg/resources"
	"github.com/inplaced/inplaced/pkg/store"
	"github.com/inplaced/inplaced/pkg/swap"
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

	st, err := store.Open(cfg.StateDir)
	if err != nil {
		return err
	}
	defer st.Close()
	obs, err := newObservers(cfg, st)
	if err != nil {
		return err
	}
	fences := fence.NewRegistry()
	fences.SetWaitObserver(obs)
	rt := runtimeapi.NewRuntimeServiceClient(runtimeConn)
	images := runtimeapi.NewImageServiceClient(imageConn)
	puller, err := pull.New(pull.Options{Images: images, ContainerdAddress: cfg.EffectiveImageEndpoint(),
		Logger: log.Named("pull"), Bytes: obs.pulledBytes})
	if err != nil {
		return err
	}
	defer puller.Close()
	engine, err := swap.New(swap.Options{
		Runtime: rt, Images: images,
		Store: st, Fences: fences, Logger: log.Named("swap"), HealthMinRuntime: cfg.HealthMinRuntime.D(),
		Observer: obs.swap, Puller: puller,
	})
	if err != nil {
		return err
	}
	// Unfinished swaps are settled before kubelet is served, so it never
	// sees a half-done swap from before the crash.
	recoverSwaps(ctx, engine, log)

	resizer, err := newResizer(cfg, rt, resizeRecorder{st, obs}, fences, log.Named("resize"))
	if err != nil {
		return err
	}
	kc, err := newKubeController(cfg, engine, rt, st, log.Named("kube"))
	if err != nil {
		return err
	}
	icOpts := intercept.Options{Store: st, Fences: fences, Logger: log.Named("intercept"),
		FenceTimeout: cfg.FenceTimeout.D(), Resizer: resizer}
	if kc != nil {
		icOpts.StopHolder = kc
		engine.SetAdmission(kc.Admit)
		engine.OnSwap(kc.Report)
	}
	ics, err := intercept.New(icOpts)
	if err != nil {
		return err
	}
	opts := []relay.Option{
		relay.WithImageConn(imageConn),
		relay.WithInterceptors(ics.Table()),
		relay.WithLogger(log.Named("relay")),
	}
	for m, g := range ics.Gates() {
		opts = append(opts, relay.WithGate(m, g))
	}
	for m, f := range ics.StreamFilters() {
		opts = append(opts, relay.WithStreamFilter(m, f))
	}
	if obs.metrics != nil {
		// Every relayed call, passed through or intercepted.
		opts = append(opts, relay.WithObserver(obs.metrics.Observe))
	}
	r := relay.New(runtimeConn, opts...)

	lis, err := listenUnix(cfg.Listen)
	if err != nil {
		return err
	}
	srv := r.NewServer()
	ctlLis, err := listenUnix(cfg.ControlSocket)
	if err != nil {
		lis.Close()
		return err
	}
	ctl := grpc.NewServer(control.ServerOptions(log.Named("audit"))...)
	ctlSrv := control.New(engine, st, resizer)
	ctlSrv.SetEvents(obs.hub)
	ctlSrv.SetPuller(puller)
	// ps lists what kubelet sees: through inplaced's own CRI socket.
	selfConn, err := grpc.NewClient("unix://"+cfg.Listen, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		lis.Close()
		ctlLis.Close()
		return err
	}
	defer selfConn.Close()
	ctlSrv.SetKubeletView(runtimeapi.NewRuntimeServiceClient(selfConn))
	if kc != nil {
		ctlSrv.SetPodChecker(kc)
	}
	ctlSrv.Register(ctl)
	var metricsSrv *http.Server
	if obs.metrics != nil {
		mlis, err := net.Listen("tcp", cfg.MetricsListen)
		if err != nil {
			lis.Close()
			ctlLis.Close()
			return fmt.Errorf("--metrics-listen: %w", err)
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", obs.metrics.Handler())
		metricsSrv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go func() {
			if err := metricsSrv.Serve(mlis); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("metrics server stopped", zap.Error(err))
			}
		}()
		defer metricsSrv.Close()
		log.Info("serving metrics", zap.String("metrics_listen", mlis.Addr().String()))
	}
	errc := make(chan error, 2)
	go func() { errc <- srv.Serve(lis) }()
	go func() { errc <- ctl.Serve(ctlLis) }()
	kubeDone := make(chan struct{})
	kubeCtx, stopKube := context.WithCancel(ctx)
	defer func() { stopKube(); <-kubeDone }()
	go func() {
		defer close(kubeDone)
		if kc == nil {
			return
		}
		if err := kc.Run(kubeCtx); err != nil {
			log.Error("Kubernetes mode stopped: node-local mode only until restart", zap.Error(err))
		}
	}()

	log.Info("serving CRI",
		zap.String("listen", cfg.Listen),
		zap.String("control_socket", cfg.ControlSocket),
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
	ctl.Stop()
	waitSwaps(engine, cfg.ShutdownTimeout.D(), log)
	for range 2 {
		if err := <-errc; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			return err
		}
	}
	return nil
}

// newResizer makes the in-place resizer for the control API and kubelet's
// UpdateContainerResources. Without a usable cgroup hierarchy it still
// resizes, through the backend only, and says so.
func newResizer(cfg config.Config, rt runtimeapi.RuntimeServiceClient, st resize.Recorder, fences *fence.Registry, log *zap.Logger) (*resize.Resizer, error) {
	cg, err := resources.New(cfg.CgroupRoot)
	if err != nil {
		log.Warn("no cgroup hierarchy: resizes go through the backend only, unverified on the host", zap.String("cgroup_root", cfg.CgroupRoot), zap.Error(err))
		cg = nil
	}
	return resize.New(resize.Options{Runtime: rt, Cgroups: cg, Store: st, Fences: fences,
		VMRuntimeHandlers: cfg.VMRuntimeHandlers, Logger: log})
}

// recoverSwaps settles the journal. When the backend is not reachable yet it
// keeps trying in the background rather than holding kubelet off.
func recoverSwaps(ctx context.Context, engine *swap.Engine, log *zap.Logger) {
	try := func() error {
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		return engine.Recover(rctx)
	}
	if err := try(); err != nil {
		log.Error("swap recovery failed; retrying in the background", zap.Error(err))
		go func() {
			for {
				select {
				case <-ctx.Done():
					return
				case <-time.After(5 * time.Second):
				}
				if err := try(); err == nil {
					log.Info("swap recovery done")
					return
				}
			}
		}()
	}
}

// waitSwaps gives running swaps time to finish; what does not finish is
// journaled and settled by the next start.
func waitSwaps(engine *swap.Engine, timeout time.Duration, log *zap.Logger) {
	done := make(chan struct{})
	go func() { engine.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(timeout):
		log.Warn("swaps still running at shutdown: the journal will settle them on next start")
	}
}

// gracefulStop ends streams at once (they never finish by themselves), lets
// unary calls finish, and cuts them off after timeout.
func gracefulStop(srv *relay.Server, r *relay.Relay, timeout time.Duration) {
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
