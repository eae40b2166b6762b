package swap

import (
	"context"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

// Observer sees what the engine does: package metrics counts it, the
// control API's Watch streams it. Calls come from the swap's goroutine and
// must not block; the record passed must be neither kept nor changed.
type Observer interface {
	SwapStarted(rec *inplacedv1.SwapRecord)
	StepStarted(rec *inplacedv1.SwapRecord, step string)
	StepEnded(rec *inplacedv1.SwapRecord, st *inplacedv1.Step)
	SwapEnded(rec *inplacedv1.SwapRecord)
	// OverrideChanged: a committed swap made its config sticky (set) or a
	// revert dropped it.
	OverrideChanged(rec *inplacedv1.SwapRecord, set bool)
	// Recovered: a journaled swap left by a crash was settled at start.
	Recovered(swapID string, err error)
}

// Observers fans calls out to several observers.
type Observers []Observer

func (os Observers) each(f func(Observer)) {
	for _, o := range os {
		f(o)
	}
}

func (os Observers) SwapStarted(rec *inplacedv1.SwapRecord) {
	os.each(func(o Observer) { o.SwapStarted(rec) })
}
func (os Observers) StepStarted(rec *inplacedv1.SwapRecord, step string) {
	os.each(func(o Observer) { o.StepStarted(rec, step) })
}
func (os Observers) StepEnded(rec *inplacedv1.SwapRecord, st *inplacedv1.Step) {
	os.each(func(o Observer) { o.StepEnded(rec, st) })
}
func (os Observers) SwapEnded(rec *inplacedv1.SwapRecord) {
	os.each(func(o Observer) { o.SwapEnded(rec) })
}
func (os Observers) OverrideChanged(rec *inplacedv1.SwapRecord, set bool) {
	os.each(func(o Observer) { o.OverrideChanged(rec, set) })
}
func (os Observers) Recovered(swapID string, err error) {
	os.each(func(o Observer) { o.Recovered(swapID, err) })
}

// Puller pulls an image and reports its progress (package pull: byte
// counts from containerd's content store). Optional: without it a swap's
// pull is a plain CRI PullImage.
type Puller interface {
	Pull(ctx context.Context, req *runtimeapi.PullImageRequest, progress func(*inplacedv1.PullProgress)) (imageRef string, err error)
}

type nopObserver struct{}

func (nopObserver) SwapStarted(*inplacedv1.SwapRecord)                 {}
func (nopObserver) StepStarted(*inplacedv1.SwapRecord, string)         {}
func (nopObserver) StepEnded(*inplacedv1.SwapRecord, *inplacedv1.Step) {}
func (nopObserver) SwapEnded(*inplacedv1.SwapRecord)                   {}
func (nopObserver) OverrideChanged(*inplacedv1.SwapRecord, bool)       {}
func (nopObserver) Recovered(string, error)                            {}
