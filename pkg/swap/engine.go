package swap

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/pkg/fence"
	"github.com/inplaced/inplaced/pkg/holdmode"
	"github.com/inplaced/inplaced/pkg/kubeletview"
	"github.com/inplaced/inplaced/pkg/runtimeclass"
	"github.com/inplaced/inplaced/pkg/store"
	"github.com/inplaced/inplaced/pkg/strategy"
	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

// CrashAfterEnv names a test-only environment variable: when it names a step
// name, inplaced kills itself with SIGKILL right after that step, so that the
// e2e tests can prove recovery from a crash at every step.
const CrashAfterEnv = "INPLACED_TEST_CRASH_AFTER"

// Caller identifies who asked for a swap: the control-socket peer, or a
// description ("kubelet (pod spec)").
type Caller struct {
	UID, PID    int64
	Exe         string // the peer's executable when it connected
	Description string
}

// journal is where a swap writes each step before it takes it.
type journal interface {
	PutJournal(e *store.JournalEntry) error
	DeleteJournal(id string) error
}

// Engine runs swaps.
type Engine struct {
	rt         runtimeapi.RuntimeServiceClient
	img        runtimeapi.ImageServiceClient
	store      *store.Store
	journal    journal // the store's journal; a seam for tests of a failing write
	fences     *fence.Registry
	kubelet    *kubeletview.View
	log        *zap.Logger
	minRuntime time.Duration
	crashAfter string
	now        func() time.Time

	admit  Admission
	ready  func() error
	onSwap func(SwapNews)
	obs    Observer
	puller Puller

	classes *runtimeclass.Table

	holder            Holder
	holdMode          holdmode.Mode
	holdMax           time.Duration
	listenersOptional bool

	strategy   strategy.Strategy
	taker      Taker
	profileDir string

	mu   sync.Mutex
	runs map[string]*run // running swaps, for WatchSwap
	wg   sync.WaitGroup
}

// Options configures an Engine.
type Options struct {
	Runtime runtimeapi.RuntimeServiceClient
	Images  runtimeapi.ImageServiceClient
	Store   *store.Store
	Fences  *fence.Registry
	// Kubelet is where a swap presents kubelet another hash for its new
	// container (Hooks.SpecHash).
	Kubelet          *kubeletview.View
	Logger           *zap.Logger
	HealthMinRuntime time.Duration
	// Observer (optional) sees swaps, steps and overrides as they happen.
	Observer Observer
	// Puller (optional) pulls with progress; default: CRI PullImage.
	Puller Puller
	// Classes say what each runtime handler's sandbox is; the engine asks
	// whether it runs a network stack of its own, where no connection hold
	// can see a listener. nil: the built-in table.
	Classes *runtimeclass.Table
	// Holder (optional) keeps new connections from being refused while a
	// container is swapped; nil: no connection hold. ConnectionHold is the
	// default mode as --connection-hold spells it (read by holdmode.Parse;
	// empty: holdmode.Default) and HoldMax the default limit (0:
	// DefaultHoldMax); pods override both by annotation.
	Holder         Holder
	ConnectionHold string
	HoldMax        time.Duration
	// ListenersOptional lets a swap commit whose new container has not
	// listened by HoldMax on every port the old one listened on; by
	// default (false) such a swap rolls back. Pods opt out by annotation
	// (inplaced.io/require-listeners: "false"); kubelet-driven swaps never
	// roll back for it.
	ListenersOptional bool
	// SwapStrategy is the node's default strategy as --swap-strategy spells
	// it (read by strategy.Parse; empty: strategy.Default); pods ask with
	// the annotation inplaced.io/swap-strategy, requests with their own.
	SwapStrategy string
	// Taker (optional) hands the old container's listening sockets to the
	// new one in an overlap swap; nil: every swap runs stop-first, saying
	// why. ProfileDir is where the new containers' seccomp profiles are
	// written for their create (required with Taker; a file lives as long
	// as its swap, and New removes those a crash left).
	Taker      Taker
	ProfileDir string
	// Ready (optional) is checked first at every swap start, before
	// anything is read or touched (package daemon: the state store must be
	// usable); its error goes back to the caller as it is.
	Ready func() error
	// Admission (optional) checks the pod before every swap.
	Admission Admission
	// OnSwap (optional) is told the start and end of every swap (package
	// kube reports them on the pod); it must not block.
	OnSwap func(SwapNews)
}

// DefaultHoldMax is the connection hold's default limit.
const DefaultHoldMax = 10 * time.Second

// New returns an engine.
func New(o Options) (*Engine, error) {
	if o.Runtime == nil || o.Images == nil || o.Store == nil || o.Fences == nil || o.Kubelet == nil {
		return nil, errors.New("swap.New: runtime, images, store, fences and the kubelet view are required")
	}
	log := o.Logger
	if log == nil {
		log = zap.NewNop()
	}
	obs := o.Observer
	if obs == nil {
		obs = nopObserver{}
	}
	classes, err := classesOrBuiltin(o.Classes)
	if err != nil {
		return nil, err
	}
	mode, holdMax, err := holdDefaults(o.ConnectionHold, o.HoldMax)
	if err != nil {
		return nil, err
	}
	strat, err := strategyDefaults(o.SwapStrategy, o.Taker, o.ProfileDir)
	if err != nil {
		return nil, err
	}
	taker := o.Taker
	if taker != nil {
		// Fail open: a profile directory that cannot be used costs the
		// overlap only; every swap then runs stop-first, saying why.
		if err := sweepProfiles(o.ProfileDir); err != nil {
			log.Warn("overlap swaps run stop-first", zap.Error(err))
			taker = downTaker{err.Error()}
		}
	}
	return &Engine{
		strategy: strat, taker: taker, profileDir: o.ProfileDir,
		rt: o.Runtime, img: o.Images, store: o.Store, journal: o.Store, fences: o.Fences, kubelet: o.Kubelet, log: log,
		minRuntime: o.HealthMinRuntime, crashAfter: os.Getenv(CrashAfterEnv),
		now: time.Now, runs: map[string]*run{}, obs: obs, puller: o.Puller, classes: classes,
		holder: o.Holder, holdMode: mode, holdMax: holdMax, listenersOptional: o.ListenersOptional,
		ready: o.Ready, admit: o.Admission, onSwap: o.OnSwap,
	}, nil
}

// strategyDefaults checks the engine's default strategy and readies the
// profile directory of a Taker.
func strategyDefaults(word string, taker Taker, dir string) (strategy.Strategy, error) {
	s := strategy.Default
	if word != "" {
		var err error
		if s, err = strategy.Parse(word); err != nil {
			return "", fmt.Errorf("swap.New: swap strategy %w", err)
		}
	}
	if taker == nil {
		return s, nil
	}
	if !filepath.IsAbs(dir) {
		return "", fmt.Errorf("swap.New: a takeover agent needs an absolute profile directory, not %q", dir)
	}
	return s, nil
}

// classesOrBuiltin is t, or the built-in table when t is nil.
func classesOrBuiltin(t *runtimeclass.Table) (*runtimeclass.Table, error) {
	if t != nil {
		return t, nil
	}
	builtin, err := runtimeclass.New(nil)
	if err != nil {
		return nil, fmt.Errorf("swap.New: the built-in runtime classes: %w", err)
	}
	return builtin, nil
}

// holdDefaults checks the engine's connection hold defaults and fills in
// what is not set.
func holdDefaults(modeWord string, holdMax time.Duration) (holdmode.Mode, time.Duration, error) {
	mode := holdmode.Default
	if modeWord != "" {
		var err error
		if mode, err = holdmode.Parse(modeWord); err != nil {
			return "", 0, fmt.Errorf("swap.New: connection hold %w", err)
		}
	}
	if holdMax == 0 {
		holdMax = DefaultHoldMax
	}
	if holdMax < 0 || holdMax > maxHoldMax {
		return "", 0, fmt.Errorf("swap.New: hold max %s: give a duration above 0 and up to %s", holdMax, maxHoldMax)
	}
	return mode, holdMax, nil
}

// Admission checks a pod before every swap of one of its containers
// (package kube: affinity drift). A warning is recorded in the swap record
// and the swap goes on; an error refuses the swap.
type Admission func(ctx context.Context, namespace, pod, podUID string) (warning string, err error)

// SwapNews is a swap's start (Ended false) or end, with a copy of its record.
type SwapNews struct {
	Ended  bool
	Record *inplacedv1.SwapRecord
}

func (e *Engine) tell(ended bool, rec *inplacedv1.SwapRecord) {
	if ended {
		e.obs.SwapEnded(rec)
	} else {
		e.obs.SwapStarted(rec)
	}
	if e.onSwap != nil {
		e.onSwap(SwapNews{Ended: ended, Record: proto.Clone(rec).(*inplacedv1.SwapRecord)})
	}
}

func (e *Engine) checkReady() error {
	if e.ready == nil {
		return nil
	}
	return e.ready()
}

// admission runs the check for a resolved target.
func (e *Engine) admission(ctx context.Context, t *target) (string, error) {
	if e.admit == nil {
		return "", nil
	}
	l := t.container.Labels
	return e.admit(ctx, l[LabelPodNamespace], l[LabelPodName], l[LabelPodUID])
}

// StepAdmission names the record entry of a warning from the admission
// check (the swap went on).
const StepAdmission = "affinity-check"

// StepJournal names the record entry of a journal write that failed after
// the old container was stopped (run.journal): the swap went on without it.
const StepJournal = "journal"

// Running returns a copy of the records of the swaps under way, the step
// running last (DurationNs 0) included.
func (e *Engine) Running() []*inplacedv1.SwapRecord {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []*inplacedv1.SwapRecord
	for _, r := range e.runs {
		if rec := r.record(); rec != nil {
			out = append(out, proto.Clone(rec).(*inplacedv1.SwapRecord))
		}
	}
	return out
}

// Wait blocks until every running swap has ended (used on shutdown).
func (e *Engine) Wait() { e.wg.Wait() }

// Hooks are a caller's steps inside a swap.
type Hooks struct {
	// BeforeStop runs (as step "drain") after the new container was created
	// and before the old one is stopped: package kube takes the pod out of
	// its Services' endpoints there. An error is recorded, not fatal.
	BeforeStop func(ctx context.Context) error
	// SpecHash, when set, is kubelet's hash for the pod spec the caller
	// writes once the swap has committed (package kube: the image of a
	// request on the pod goes into the spec). The new container carries it,
	// and kubelet is shown the old hash for it until SpecWritten.
	SpecHash string
}

// Start validates a swap request, resolves its target and takes the fence
// synchronously — so the caller gets InvalidArgument, NotFound or
// FailedPrecondition at once and nothing is touched — then runs the swap in
// the background. It returns a subscription to the swap's events. hooks
// are the caller's steps inside the swap (none for inplacectl swap).
func (e *Engine) Start(ctx context.Context, req *inplacedv1.SwapRequest, caller Caller, hooks Hooks) (*Subscription, error) {
	if err := e.checkReady(); err != nil {
		return nil, err
	}
	change := req.GetChange()
	if change == nil {
		change = &inplacedv1.Change{}
	}
	if err := checkImmutable(change); err != nil {
		return nil, invalidf("%v", err)
	}
	if v := req.GetOptions().GetStrategy(); v != "" {
		if _, err := strategy.Parse(v); err != nil {
			return nil, invalidf("strategy %v; nothing was changed", err)
		}
	}
	if isEmpty(change) {
		return nil, invalidf("the change is empty: give --image, --env, --unset-env, --command or --args")
	}
	t, err := e.resolve(ctx, req.GetTarget())
	if err != nil {
		return nil, err
	}
	return e.begin(ctx, t, KindSwap, change, req, caller, hooks)
}

// begin runs the admission check, takes the fence and launches the swap of
// a resolved target.
func (e *Engine) begin(ctx context.Context, t *target, kind string, change *inplacedv1.Change, req *inplacedv1.SwapRequest,
	caller Caller, hooks Hooks) (*Subscription, error) {
	warning, err := e.admission(ctx, t)
	if err != nil {
		return nil, err
	}
	id := newID(e.now())
	f, swapCtx, err := e.fences.Acquire(context.Background(), fence.Key{SandboxID: t.container.PodSandboxId, Name: t.name}, id, t.container.Id)
	if err != nil {
		return nil, refusedf("%v: wait for it to end (inplacectl swaps)", err)
	}
	r := newRun(e, id, kind, t, change, req.GetOptions(), req.GetAuth(), caller, f)
	r.hooks = hooks
	r.admitted(warning)
	sub := r.subscribe()
	e.launch(swapCtx, r, nil)
	return sub, nil
}

// launch runs r in the background, listed as running until it ends; done
// (optional) is closed after.
func (e *Engine) launch(ctx context.Context, r *run, done chan struct{}) {
	id := r.rec.Id
	e.mu.Lock()
	e.runs[id] = r
	e.mu.Unlock()
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		if done != nil {
			defer close(done)
		}
		r.execute(ctx)
		e.mu.Lock()
		delete(e.runs, id)
		e.mu.Unlock()
	}()
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
		return nil, nil, notFoundf("no swap %q", id)
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
