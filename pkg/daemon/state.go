package daemon

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/pkg/errkind"
	"github.com/inplaced/inplaced/pkg/health"
	"github.com/inplaced/inplaced/pkg/resize"
	"github.com/inplaced/inplaced/pkg/store"
	"github.com/inplaced/inplaced/pkg/swap"
	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

// stateKeeper watches the state store. While it is unusable, kubelet's
// calls pass through (package intercept only logs what it cannot record),
// swaps and resizes are refused, and the store is retried every
// store.RetryInterval; once it is back the journal is settled before swaps
// are let in again.
type stateKeeper struct {
	st     *store.Store
	board  *health.Board
	engine *swap.Engine
	log    *zap.Logger
	// ready: the store is usable and the journal was settled since it came
	// back (or since the start).
	ready atomic.Bool
	// settling: a recovery is running (maybe retrying in the background).
	settling atomic.Bool
	// sweep drops what kubelet's calls could not clean up while the store
	// could not be written (overrides of ended sandboxes) and records what
	// they changed meanwhile (kubelet's resizes); run calls it at its start
	// and each time the store is back. Set before run.
	sweep func(context.Context)
}

// start settles the journal when the store is usable, else reports why it
// is not; run keeps watching.
func (k *stateKeeper) start(ctx context.Context) {
	if p := k.st.Problem(); p != nil {
		k.report(p)
		return
	}
	// Unfinished swaps are settled before kubelet is served, so it never
	// sees a half-done swap from before the crash.
	k.settle(ctx)
	k.ready.Store(true)
}

func (k *stateKeeper) run(ctx context.Context) {
	t := time.NewTicker(store.RetryInterval)
	defer t.Stop()
	if k.st.Problem() == nil {
		k.swept(ctx)
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		k.check(ctx)
	}
}

// check reports a problem a write ran into, retries an unusable store, and
// lets swaps in again once it is back.
func (k *stateKeeper) check(ctx context.Context) {
	if p := k.st.Problem(); p != nil {
		k.ready.Store(false)
		k.report(p)
		if !k.st.Retry() {
			if p := k.st.Problem(); p != nil {
				k.report(p)
			}
			return
		}
		k.log.Info("state store usable again: settling the swap journal", zap.String("state_file", p.Path))
		k.settle(ctx)
		k.swept(ctx)
	}
	if !k.ready.Load() {
		k.ready.Store(true)
		k.board.Clear(health.PartState)
	}
}

// swept runs the sweep, bounded.
func (k *stateKeeper) swept(ctx context.Context) {
	if k.sweep == nil {
		return
	}
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	k.sweep(sctx)
}

func (k *stateKeeper) report(p *store.Problem) {
	k.board.Set(health.Problem{Part: health.PartState, BlocksSwaps: true, Since: p.Since,
		What:   fmt.Sprintf("state store %s is unusable (%s): %v", p.Path, p.Cause, p.Err),
		Action: p.Action})
}

// refusal is the error a swap or resize gets while the store cannot keep
// its journal and records; nil when they may go ahead.
func (k *stateKeeper) refusal() error {
	if err := k.st.Usable(); err != nil {
		return errkind.Errorf(errkind.Unavailable, "refused: %v (kubelet's calls pass through meanwhile; inplacectl status)", err)
	}
	if !k.ready.Load() {
		return errkind.Errorf(errkind.Unavailable, "refused: the state store is back and the swap journal is being settled; try again in %s", store.RetryInterval)
	}
	return nil
}

// guardedResizer is the resizer as the control API and kubelet's
// UpdateContainerResources reach it: while the state store is unusable the
// control API's resizes are refused and kubelet's go to the backend as they
// came, as without inplaced; the resizer notes their limits, and the
// keeper's sweep records them when the store is back.
type guardedResizer struct {
	r *resize.Resizer
	k *stateKeeper
}

func (g guardedResizer) Resize(ctx context.Context, req *inplacedv1.ResizeRequest, uid, pid int64) (*inplacedv1.ResizeRecord, error) {
	if err := g.k.refusal(); err != nil {
		return nil, err
	}
	return g.r.Resize(ctx, req, uid, pid)
}

func (g guardedResizer) UpdateContainerResources(ctx context.Context, req *runtimeapi.UpdateContainerResourcesRequest,
	next func(context.Context, *runtimeapi.UpdateContainerResourcesRequest) (*runtimeapi.UpdateContainerResourcesResponse, error),
) (*runtimeapi.UpdateContainerResourcesResponse, error) {
	if g.k.refusal() != nil {
		resp, err := next(ctx, req)
		if err == nil {
			// Recorded once the store is back (the keeper's sweep), and
			// counted by the pod rule until then.
			g.r.PassedThrough(req.GetContainerId(), req.GetLinux())
		}
		return resp, err
	}
	return g.r.UpdateContainerResources(ctx, req, next)
}

// settle settles the journal. When the backend is not reachable yet it
// keeps trying in the background rather than keeping kubelet waiting; one
// recovery runs at a time.
func (k *stateKeeper) settle(ctx context.Context) {
	if !k.settling.CompareAndSwap(false, true) {
		return
	}
	try := func() error {
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		return k.engine.Recover(rctx)
	}
	err := try()
	if err == nil {
		k.settling.Store(false)
		return
	}
	k.log.Error("swap recovery failed; retrying in the background", zap.Error(err))
	go func() {
		defer k.settling.Store(false)
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(5 * time.Second):
			}
			if err := try(); err == nil {
				k.log.Info("swap recovery done")
				return
			}
		}
	}()
}
