package daemon

import (
	"time"

	"github.com/inplaced/inplaced/pkg/config"
	"github.com/inplaced/inplaced/pkg/events"
	"github.com/inplaced/inplaced/pkg/fence"
	"github.com/inplaced/inplaced/pkg/metrics"
	"github.com/inplaced/inplaced/pkg/store"
	"github.com/inplaced/inplaced/pkg/swap"
	"github.com/inplaced/inplaced/pkg/version"
	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

// observers are who hears what the daemon does: the control API's Watch
// (always) and the Prometheus metrics (with --metrics-listen).
type observers struct {
	hub     *events.Hub
	metrics *metrics.Metrics // nil: metrics off
	swap    swap.Observer
}

func newObservers(cfg config.Config, st *store.Store) (*observers, error) {
	o := &observers{hub: events.New()}
	list := swap.Observers{o.hub}
	if cfg.MetricsListen != "" {
		o.metrics = metrics.New(version.Version, func() (int, error) {
			os, err := st.Overrides()
			return len(os), err
		})
		list = append(list, o.metrics)
	}
	o.swap = list
	return o, nil
}

// WaitStarted implements fence.WaitObserver.
func (o *observers) WaitStarted(f *fence.Fence) {
	o.hub.WaitStarted(f)
	if o.metrics != nil {
		o.metrics.WaitStarted(f)
	}
}

// WaitEnded implements fence.WaitObserver.
func (o *observers) WaitEnded(f *fence.Fence, waited time.Duration) {
	o.hub.WaitEnded(f, waited)
	if o.metrics != nil {
		o.metrics.WaitEnded(f, waited)
	}
}

func (o *observers) pulledBytes(n int64) {
	if o.metrics != nil {
		o.metrics.PulledBytes(n)
	}
}

func (o *observers) resized(rec *inplacedv1.ResizeRecord) {
	o.hub.Resized(rec)
	if o.metrics != nil {
		o.metrics.Resized(rec)
	}
}

// resizeRecorder stores every resize record and reports it.
type resizeRecorder struct {
	*store.Store
	obs *observers
}

func (r resizeRecorder) PutResize(rec *inplacedv1.ResizeRecord) error {
	err := r.Store.PutResize(rec)
	r.obs.resized(rec)
	return err
}
