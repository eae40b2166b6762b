package swap

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/pkg/fence"
	"github.com/inplaced/inplaced/pkg/store"
	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

// CrashAfterEnv names a test-only environment variable: when it holds a step
// name, inplaced kills itself with SIGKILL right after that step, so that the
// e2e tests can prove recovery from a crash at every step.
const CrashAfterEnv = "INPLACED_TEST_CRASH_AFTER"

// Caller identifies the control-socket peer that asked for a swap.
type Caller struct{ UID, PID int64 }

// Engine runs swaps.
type Engine struct {
	rt         runtimeapi.RuntimeServiceClient
	img        runtimeapi.ImageServiceClient
	store      *store.Store
	fences     *fence.Registry
	log        *zap.Logger
	minRuntime time.Duration
	crashAfter string
	now        func() time.Time

	mu   sync.Mutex
	runs map[string]*run // running swaps, for WatchSwap
	wg   sync.WaitGroup
}

// Options configures an Engine.
type Options struct {
	Runtime          runtimeapi.RuntimeServiceClient
	Images           runtimeapi.ImageServiceClient
	Store            *store.Store
	Fences           *fence.Registry
	Logger           *zap.Logger
	HealthMinRuntime time.Duration
}

// New returns an engine.
func New(o Options) (*Engine, error) {
	if o.Runtime == nil || o.Images == nil || o.Store == nil || o.Fences == nil {
		return nil, errors.New("swap.New: runtime, images, store and fences are required")
	}
	log := o.Logger
	if log == nil {
		log = zap.NewNop()
	}
	return &Engine{
		rt: o.Runtime, img: o.Images, store: o.Store, fences: o.Fences, log: log,
		minRuntime: o.HealthMinRuntime, crashAfter: os.Getenv(CrashAfterEnv),
		now: time.Now, runs: map[string]*run{},
	}, nil
}

// Wait blocks until every running swap has ended (used on shutdown).
func (e *Engine) Wait() { e.wg.Wait() }

// Start validates a swap request, resolves its target and takes the fence
// synchronously — so the caller gets InvalidArgument, NotFound or
// FailedPrecondition at once and nothing is touched — then runs the swap in
// the background. It returns a subscription to the swap's events.
func (e *Engine) Start(ctx context.Context, req *inplacedv1.SwapRequest, caller Caller) (*Subscription, error) {
	return e.start(ctx, req, caller, "swap", nil)
}

func (e *Engine) start(ctx context.Context, req *inplacedv1.SwapRequest, caller Caller, kind string,
	override func(*target) (*inplacedv1.Change, error)) (*Subscription, error) {
	change := req.GetChange()
	if change == nil {
		change = &inplacedv1.Change{}
	}
	if err := checkImmutable(change); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "%v", err)
	}
	if override == nil && isEmpty(change) {
		return nil, status.Error(codes.InvalidArgument, "the change is empty: give --image, --env, --unset-env, --command or --args")
	}
	t, err := e.resolve(ctx, req.GetTarget())
	if err != nil {
		return nil, err
	}
	if override != nil {
		if change, err = override(t); err != nil {
			return nil, err
		}
	}
	id := newID(e.now())
	f, swapCtx, err := e.fences.Acquire(context.Background(), fence.Key{SandboxID: t.container.PodSandboxId, Name: t.name}, id, t.container.Id)
	if err != nil {
		return nil, status.Errorf(codes.FailedPrecondition, "%v: wait for it to end (inplacectl swaps)", err)
	}
	r := newRun(e, id, kind, t, change, req.GetOptions(), req.GetAuth(), caller, f)
	sub := r.subscribe()
	e.mu.Lock()
	e.runs[id] = r
	e.mu.Unlock()
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		r.execute(swapCtx)
		e.mu.Lock()
		delete(e.runs, id)
		e.mu.Unlock()
	}()
	return sub, nil
}

// Watch subscribes to a running swap; for an ended one it returns its record.
func (e *Engine) Watch(id string) (*Subscription, *inplacedv1.SwapRecord, error) {
	e.mu.Lock()
	r := e.runs[id]
	e.mu.Unlock()
	if r != nil {
		return r.subscribe(), nil, nil
	}
	rec, err := e.store.Swap(id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil, status.Errorf(codes.NotFound, "no swap %q", id)
	}
	return nil, rec, err
}

// newID returns a time-ordered swap ID: store history sorts by key.
func newID(t time.Time) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s-%s", t.UTC().Format("20060102T150405.000"), hex.EncodeToString(b[:]))
}

// maybeCrash kills the process after step when the test switch names it.
func (e *Engine) maybeCrash(step string) {
	if e.crashAfter != "" && e.crashAfter == step {
		e.log.Warn("test switch: crashing after step", zap.String("step", step))
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // never return: the signal is on its way
	}
}
