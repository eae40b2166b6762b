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
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/coreos/go-systemd/v22/activation"
	sddaemon "github.com/coreos/go-systemd/v22/daemon"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/pkg/config"
	"github.com/inplaced/inplaced/pkg/control"
	"github.com/inplaced/inplaced/pkg/fence"
	"github.com/inplaced/inplaced/pkg/health"
	"github.com/inplaced/inplaced/pkg/intercept"
	"github.com/inplaced/inplaced/pkg/kubeletview"
	"github.com/inplaced/inplaced/pkg/pull"
	"github.com/inplaced/inplaced/pkg/relay"
	"github.com/inplaced/inplaced/pkg/resize"
	"github.com/inplaced/inplaced/pkg/resources"
	"github.com/inplaced/inplaced/pkg/runtimeclass"
	"github.com/inplaced/inplaced/pkg/store"
	"github.com/inplaced/inplaced/pkg/swap"
	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

// Run serves until ctx is cancelled, then shuts down gracefully: it takes
// no new calls, lets the calls and swaps in flight run on within
// cfg.ShutdownGrace, cuts what is left, and returns nil. It builds every
// part first (build), serves (serve), and shuts down (shutDown); what build
// made is closed, in the reverse order, whichever way Run returns.
func Run(ctx context.Context, cfg config.Config, log *zap.Logger) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	d := &daemon{cfg: cfg, log: log, activated: activation.Files(true)}
	defer d.close()
	if err := d.build(ctx); err != nil {
		return err
	}
	return d.serve(ctx)
}

// daemon is what Run builds, with the undo of each part (closers).
type daemon struct {
	cfg     config.Config
	log     *zap.Logger
	closers []func()

	runtimeConn, imageConn *grpc.ClientConn
	rt                     runtimeapi.RuntimeServiceClient
	images                 runtimeapi.ImageServiceClient
	board                  *health.Board
	st                     *store.Store
	obs                    *observers
	kslot                  *kubeSlot
	rep                    *reporter
	fences                 *fence.Registry
	view                   *kubeletview.View
	puller                 *pull.Puller
	engine                 *swap.Engine
	keeper                 *stateKeeper
	resizer                guardedResizer
	relay                  *relay.Relay
	ctl                    *grpc.Server
	// activated are the files systemd passed (LISTEN_FDS): the CRI socket
	// and the takeover agent's stored notify fds.
	activated []*os.File
}

// onClose registers the undo of a part just built.
func (d *daemon) onClose(f func()) { d.closers = append(d.closers, f) }

// close undoes what was built, last first.
func (d *daemon) close() {
	for i := len(d.closers) - 1; i >= 0; i-- {
		d.closers[i]()
	}
}

// build makes every part, in the order they depend on each other.
func (d *daemon) build(ctx context.Context) error {
	for _, step := range []func(context.Context) error{d.dial, d.openState, d.newEngine, d.newRelay, d.newControl} {
		if err := step(ctx); err != nil {
			return err
		}
	}
	return nil
}

// dial connects to the backend's runtime and image endpoints.
func (d *daemon) dial(context.Context) error {
	var err error
	if d.runtimeConn, err = relay.Dial(d.cfg.RuntimeEndpoint); err != nil {
		return fmt.Errorf("runtime endpoint: %w", err)
	}
	d.onClose(func() { d.runtimeConn.Close() })
	d.imageConn = d.runtimeConn
	if d.cfg.EffectiveImageEndpoint() != d.cfg.RuntimeEndpoint {
		if d.imageConn, err = relay.Dial(d.cfg.EffectiveImageEndpoint()); err != nil {
			return fmt.Errorf("image endpoint: %w", err)
		}
		d.onClose(func() { d.imageConn.Close() })
	}
	d.rt = runtimeapi.NewRuntimeServiceClient(d.runtimeConn)
	d.images = runtimeapi.NewImageServiceClient(d.imageConn)
	return nil
}

// openState opens the store and what reports on inplaced's own parts.
// Nothing of inplaced's own stops kubelet's calls from passing through: a
// state store, kubeconfig, metrics listener or control socket that cannot be
// used is put on the board, reported, retried, and only what needs it is
// refused meanwhile.
func (d *daemon) openState(context.Context) error {
	d.board = health.New()
	d.st = store.OpenOrDegrade(d.cfg.StateDir)
	d.onClose(func() { d.st.Close() })
	var err error
	if d.obs, err = newObservers(d.cfg, d.st); err != nil {
		return err
	}
	d.kslot = &kubeSlot{kubeconfig: d.cfg.Kubeconfig}
	d.rep = &reporter{obs: d.obs, kube: d.kslot, log: d.log}
	d.board.Watch(d.rep.changed)
	d.st.OnSetAside(d.rep.setAside)
	d.fences = fence.NewRegistry()
	d.fences.SetWaitObserver(d.obs)
	d.view = kubeletview.New()
	return nil
}

// newEngine makes the puller, the swap engine and the resizer, and settles
// the journal (stateKeeper.start) before anything is served.
func (d *daemon) newEngine(ctx context.Context) error {
	var err error
	d.puller, err = pull.New(pull.Options{Images: d.images, ContainerdAddress: d.cfg.EffectiveImageEndpoint(),
		Logger: d.log.Named("pull"), Bytes: d.obs.pulledBytes})
	if err != nil {
		return err
	}
	d.onClose(func() { d.puller.Close() })
	// One table for both: the swap asks a class for its network stack, the
	// resizer for where its limits are enforced.
	classes, err := d.cfg.RuntimeClassTable()
	if err != nil {
		return err
	}
	// The takeover agent outlives every swap: closed after the engine's
	// swaps have ended (closers run last first).
	var tk *taker
	tk, d.activated = newTaker(d.cfg.EffectiveTakeoverSocket(), newFDStore(), d.activated, d.log.Named("takeover"))
	d.onClose(tk.close)
	go tk.serve()
	d.engine, err = swap.New(swap.Options{
		Runtime: d.rt, Images: d.images,
		Store: d.st, Fences: d.fences, Kubelet: d.view, Logger: d.log.Named("swap"), HealthMinRuntime: d.cfg.HealthMinRuntime.D(),
		Observer: d.obs.swap, Puller: d.puller, Classes: classes,
		Holder: holder{oneBatch: os.Getenv(HoldOneBatchEnv) == "1"}, ConnectionHold: d.cfg.ConnectionHold, HoldMax: d.cfg.HoldMax.D(),
		ListenersOptional: !d.cfg.RequireListeners,
		SwapStrategy:      d.cfg.SwapStrategy, Taker: tk, ProfileDir: filepath.Join(d.cfg.StateDir, "seccomp"),
		// The keeper is made just below, from the engine; swaps start only
		// once both are, when serving.
		Ready: func() error { return d.keeper.refusal() }, Admission: d.kslot.Admit, OnSwap: d.kslot.Report,
	})
	if err != nil {
		return err
	}
	d.keeper = &stateKeeper{st: d.st, board: d.board, engine: d.engine, log: d.log.Named("state")}
	d.keeper.start(ctx)
	resizer, err := newResizer(d.cfg, classes, d.rt, resizeRecorder{d.st, d.obs}, d.fences, d.log.Named("resize"))
	if err != nil {
		return err
	}
	d.resizer = guardedResizer{r: resizer, k: d.keeper}
	return nil
}

// newRelay makes the interceptors and the CRI relay.
func (d *daemon) newRelay(context.Context) error {
	icOpts := intercept.Options{Store: d.st, Fences: d.fences, Kubelet: d.view, Logger: d.log.Named("intercept"),
		FenceTimeout: d.cfg.FenceTimeout.D(), Resizer: d.resizer}
	if d.cfg.Kubeconfig != "" {
		icOpts.StopHolder = d.kslot
	}
	ics, err := intercept.New(icOpts)
	if err != nil {
		return err
	}
	d.keeper.sweep = func(ctx context.Context) {
		ics.SweepOverrides(ctx, d.rt)
		if err := d.resizer.r.RecordMissed(); err != nil {
			d.log.Warn("kubelet's resizes from while the state store was unusable are not recorded yet; retried when it is back", zap.Error(err))
		}
	}
	opts := []relay.Option{
		relay.WithImageConn(d.imageConn),
		relay.WithInterceptors(ics.Table()),
		relay.WithLogger(d.log.Named("relay")),
	}
	if d.cfg.Relay == "grpc" {
		opts = append(opts, relay.WithGRPCServer())
	}
	for m, g := range ics.Gates() {
		opts = append(opts, relay.WithGate(m, g))
	}
	for m, f := range ics.StreamFilters() {
		opts = append(opts, relay.WithStreamFilter(m, f))
	}
	if d.obs.metrics != nil {
		// Every relayed call, passed through or intercepted.
		opts = append(opts, relay.WithObserver(d.obs.metrics.Observe))
		opts = append(opts, relay.WithAbuseObserver(d.obs.metrics.RelayAbuse))
	}
	d.relay = relay.New(d.runtimeConn, opts...)
	return nil
}

// newControl makes the control API server.
func (d *daemon) newControl(context.Context) error {
	// ps lists what kubelet sees: through inplaced's own CRI socket (the
	// client dials when first used, once the socket is served).
	selfConn, err := grpc.NewClient("unix://"+d.cfg.Listen, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	d.onClose(func() { selfConn.Close() })
	o := control.Options{Engine: d.engine, Store: d.st, Resizer: d.resizer, Events: d.obs.hub, Puller: d.puller,
		KubeletView: runtimeapi.NewRuntimeServiceClient(selfConn),
		Status:      func() *inplacedv1.StatusResponse { return statusOf(d.board, d.keeper, d.kslot, d.st) }}
	if d.cfg.Kubeconfig != "" {
		o.PodChecker = d.kslot
	}
	ctlSrv, err := control.New(o)
	if err != nil {
		return err
	}
	d.ctl = grpc.NewServer(control.ServerOptions(d.log.Named("audit"))...)
	ctlSrv.Register(d.ctl)
	return nil
}

// serve serves CRI until ctx ends or the CRI server fails, with the control
// socket, the metrics listener and Kubernetes mode beside it, then shuts
// down.
func (d *daemon) serve(ctx context.Context) error {
	lis, fromSystemd, err := criListener(d.cfg.Listen, d.activated, d.log)
	if err != nil {
		return err
	}
	defer lis.Close()
	srv := d.relay.NewServer()
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(lis) }()
	var side sync.WaitGroup
	sideCtx, stopSide := context.WithCancel(ctx)
	defer func() { stopSide(); side.Wait() }()
	d.serveSide(sideCtx, &side)

	d.log.Info("serving CRI",
		zap.String("listen", d.cfg.Listen),
		zap.Bool("socket_from_systemd", fromSystemd),
		zap.String("control_socket", d.cfg.ControlSocket),
		zap.String("runtime_endpoint", d.cfg.RuntimeEndpoint),
		zap.String("image_endpoint", d.cfg.EffectiveImageEndpoint()))
	if _, err := sddaemon.SdNotify(false, sddaemon.SdNotifyReady); err != nil {
		d.log.Warn("sd_notify READY failed", zap.Error(err))
	}
	side.Go(func() { d.keeper.run(sideCtx) })

	select {
	case <-ctx.Done():
	case err := <-errc:
		return fmt.Errorf("CRI server stopped: %w", err)
	}
	d.shutDown(srv, fromSystemd, stopSide)
	if err := <-errc; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	return nil
}

// serveSide serves the control socket and the metrics listener when they
// can be (a path or port in use is retried, not fatal), and starts
// Kubernetes mode once its kubeconfig can be used.
func (d *daemon) serveSide(ctx context.Context, side *sync.WaitGroup) {
	cfg, log := d.cfg, d.log
	side.Go(func() {
		serveWhenListening(ctx, d.board, health.PartControl, log, func() (net.Listener, error) { return listenUnix(cfg.ControlSocket) },
			d.ctl.Serve, d.ctl.Stop, fmt.Sprintf("remove what holds %s, or choose another --control-socket", cfg.ControlSocket))
	})
	if d.obs.metrics != nil {
		mux := http.NewServeMux()
		mux.Handle("/metrics", d.obs.metrics.Handler())
		metricsSrv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		side.Go(func() {
			serveWhenListening(ctx, d.board, health.PartMetrics, log, func() (net.Listener, error) {
				l, err := net.Listen("tcp", cfg.MetricsListen)
				if err != nil {
					return nil, fmt.Errorf("--metrics-listen: %w", err)
				}
				return l, nil
			}, metricsSrv.Serve, func() { metricsSrv.Close() }, fmt.Sprintf("free %s or choose another --metrics-listen", cfg.MetricsListen))
		})
	}
	if cfg.Kubeconfig != "" {
		side.Go(func() {
			d.kslot.run(ctx, kubeDeps{cfg: cfg, engine: d.engine, view: d.view, rt: d.rt, st: d.st, board: d.board, log: log.Named("kube"),
				started: func() {
					// Events of what went wrong before the API server was known.
					for _, p := range d.board.Problems() {
						d.rep.event(p)
					}
				}})
		})
	}
}

// handoverMin is the least time the calls on connections made during the
// drain get to end at the handover (short CRI calls: a list, a status).
const handoverMin = 2 * time.Second

// handoverContext is the handover's time: what is left of the grace, and
// at least handoverMin.
func handoverContext(grace context.Context) (context.Context, context.CancelFunc) {
	left := handoverMin
	if deadline, ok := grace.Deadline(); ok {
		left = max(time.Until(deadline), handoverMin)
	}
	return context.WithTimeout(context.Background(), left)
}

// shutDown drains the CRI server (no new calls on the callers'
// connections; the calls in flight run on), stops the side servers, waits
// for running swaps, all within one grace from SIGTERM, then stops the CRI
// server. On systemd's socket the connections made meanwhile are served
// until the swaps are settled; then the handover leaves the socket to the
// next process and ends them as the drain ended the others.
func (d *daemon) shutDown(srv *relay.Server, fromSystemd bool, stopSide func()) {
	grace := d.cfg.ShutdownGrace.D()
	d.log.Info("shutting down: no new calls; the calls and swaps in flight have the grace", zap.Duration("shutdown_grace", grace))
	_, _ = sddaemon.SdNotify(false, sddaemon.SdNotifyStopping)
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	// systemd's socket outlives this process: what comes during the drain
	// waits in its queue for the next one. A socket of our own goes with us.
	mode := relay.Refuse
	if fromSystemd {
		mode = relay.HandOff
	}
	if err := srv.Drain(ctx, mode); err != nil {
		d.log.Warn("calls still running at the shutdown grace were cut: their callers retry, on the next process", zap.Duration("shutdown_grace", grace))
	}
	drained := time.Since(start)
	stopSide()
	waitSwaps(ctx, d.engine, d.log)
	// The connections made during the drain carry kubelet's calls of the
	// last moments, not the ones the grace was for: they get at least
	// handoverMin, even when a swap took the whole grace.
	hctx, hcancel := handoverContext(ctx)
	defer hcancel()
	if err := srv.Handover(hctx); err != nil {
		d.log.Warn("calls made during the drain still running at the shutdown grace were cut: their callers retry, on the next process", zap.Duration("shutdown_grace", grace))
	}
	srv.Stop()
	d.log.Info("shut down", zap.Duration("calls_drained_in", drained), zap.Duration("took", time.Since(start)))
}

// newResizer makes the in-place resizer for the control API and kubelet's
// UpdateContainerResources. Without a usable cgroup hierarchy it still
// resizes, through the backend only, and says so.
func newResizer(cfg config.Config, classes *runtimeclass.Table, rt runtimeapi.RuntimeServiceClient, st resize.Recorder, fences *fence.Registry, log *zap.Logger) (*resize.Resizer, error) {
	cg, err := resources.New(cfg.CgroupRoot)
	if err != nil {
		log.Warn("no cgroup hierarchy: resizes go through the backend only, unverified on the host", zap.String("cgroup_root", cfg.CgroupRoot), zap.Error(err))
		cg = nil
	}
	return resize.New(resize.Options{Runtime: rt, Cgroups: cg, Store: st, Fences: fences, Classes: classes, Logger: log})
}

// waitSwaps gives running swaps until ctx ends to finish; one that does
// not is left as a crash leaves it: journaled, and settled by the next
// start's recovery before it serves kubelet.
func waitSwaps(ctx context.Context, engine *swap.Engine, log *zap.Logger) {
	done := make(chan struct{})
	go func() { engine.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		log.Warn("swaps still running at the shutdown grace: the journal settles them on the next start", zap.Int("swaps", len(engine.Running())))
	}
}
