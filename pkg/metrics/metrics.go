// Package metrics exports inplaced's Prometheus metrics (client_golang) on
// the opt-in --metrics-listen address.
//
// The relayed CRI calls are counted by a gRPC stream interceptor on the CRI
// server, outside package relay: grpc-go runs it around the relay's
// UnknownServiceHandler for every method, so the relay's pass-through stays
// as it is. Its per-call cost is a map read, a clock read and two atomic
// adds on label children made once per method and code — no allocation
// after a method's first call with a code.
//
// Swaps, steps, overrides and recoveries come in through swap.Observer,
// fence waits through fence.WaitObserver, resizes through the store's
// resize recorder, pulled bytes from the pull progress.
package metrics

import (
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/pkg/fence"
	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

const namespace = "inplaced"

// Metric names (the tests and deploy/prometheus/ refer to them).
const (
	CRIRequests       = "inplaced_cri_requests_total"
	CRIDuration       = "inplaced_cri_request_duration_seconds"
	Swaps             = "inplaced_swaps_total"
	SwapsRunning      = "inplaced_swaps_running"
	StepDuration      = "inplaced_swap_step_duration_seconds"
	Downtime          = "inplaced_swap_downtime_seconds"
	Resizes           = "inplaced_resizes_total"
	FenceWaits        = "inplaced_fence_waits_total"
	FenceWaitDuration = "inplaced_fence_wait_duration_seconds"
	ActiveOverrides   = "inplaced_active_overrides"
	Recoveries        = "inplaced_journal_recoveries_total"
	PullBytes         = "inplaced_pull_bytes_total"
	RelayAbuse        = "inplaced_relay_abuse_total"
	Degraded          = "inplaced_degraded"
	JournalSetAside   = "inplaced_journal_entries_set_aside_total"
	Holds             = "inplaced_swap_holds_total"
	HoldDuration      = "inplaced_swap_hold_duration_seconds"
	HoldParked        = "inplaced_swap_hold_parked_connections_total"
)

// otherMethod is the label of methods this build does not know (a CRI
// method added after it): cardinality stays bounded.
const otherMethod = "other"

// Metrics keeps the collectors of one daemon. It implements
// swap.Observer and fence.WaitObserver.
type Metrics struct {
	reg *prometheus.Registry

	criRequests *prometheus.CounterVec
	criDuration *prometheus.HistogramVec
	methods     map[string]*methodMetrics // full method → children, built at New; read-only after

	swaps        *prometheus.CounterVec
	swapsRunning prometheus.Gauge
	steps        *prometheus.HistogramVec
	downtime     *prometheus.HistogramVec
	resizes      *prometheus.CounterVec
	fenceWaits   prometheus.Counter
	fenceWait    prometheus.Histogram
	recoveries   *prometheus.CounterVec
	pullBytes    prometheus.Counter
	relayAbuse   *prometheus.CounterVec
	degraded     *prometheus.GaugeVec
	setAside     prometheus.Counter
	holds        *prometheus.CounterVec
	holdDuration *prometheus.HistogramVec
	holdParked   prometheus.Counter
}

type methodMetrics struct {
	name     string
	mu       sync.Mutex
	byCode   [codes.Unauthenticated + 1]atomic.Pointer[prometheus.Counter]
	duration atomic.Pointer[prometheus.Observer]
	parent   *prometheus.CounterVec
	hists    *prometheus.HistogramVec
}

// observer is the method's latency child, made on first use so that
// methods never called export no buckets.
func (m *methodMetrics) observer() prometheus.Observer {
	if p := m.duration.Load(); p != nil {
		return *p
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if p := m.duration.Load(); p != nil {
		return *p
	}
	o := m.hists.WithLabelValues(m.name)
	m.duration.Store(&o)
	return o
}

func (m *methodMetrics) counter(c codes.Code) prometheus.Counter {
	if int(c) >= len(m.byCode) {
		return m.parent.WithLabelValues(m.name, c.String())
	}
	if p := m.byCode[c].Load(); p != nil {
		return *p
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if p := m.byCode[c].Load(); p != nil {
		return *p
	}
	ctr := m.parent.WithLabelValues(m.name, c.String())
	m.byCode[c].Store(&ctr)
	return ctr
}

// OverrideCounter counts the active overrides (the store), read at scrape.
type OverrideCounter func() (int, error)

// New returns the metrics; overrides (optional) is read at every scrape.
func New(version string, overrides OverrideCounter) *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry(), methods: map[string]*methodMetrics{}}
	latency := []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 120}
	m.criRequests = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "cri_requests_total",
		Help: "CRI calls relayed to the backend, by method and gRPC code."}, []string{"method", "code"})
	m.criDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: namespace, Name: "cri_request_duration_seconds",
		Help: "Time to serve a relayed CRI call, by method.", Buckets: latency}, []string{"method"})
	m.swaps = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "swaps_total",
		Help: "Swaps ended, by kind (swap, revert, kubelet) and result (committed, failed, rollback_failed, aborted)."},
		[]string{"kind", "result"})
	m.swapsRunning = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: namespace, Name: "swaps_running",
		Help: "Swaps under way."})
	m.steps = prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: namespace, Name: "swap_step_duration_seconds",
		Help: "Duration of swap steps, by step and whether it failed.", Buckets: prometheus.ExponentialBuckets(0.005, 2.5, 12)},
		[]string{"step", "failed"})
	m.downtime = prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: namespace, Name: "swap_downtime_seconds",
		Help:    "Time between the old container's stop and the new one running, by swap kind.",
		Buckets: []float64{.025, .05, .1, .15, .2, .3, .5, 1, 2, 5, 10}}, []string{"kind"})
	m.holds = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "swap_holds_total",
		Help: "Connection holds of swaps, by mode used (queue, drop, off) and release reason (listening, limit, aborted, crash-recovered; none when off)."},
		[]string{"mode", "reason"})
	m.holdDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: namespace, Name: "swap_hold_duration_seconds",
		Help:    "How long new connections were held during swaps, by mode.",
		Buckets: []float64{.025, .05, .1, .15, .2, .3, .5, 1, 2, 5, 10, 30}}, []string{"mode"})
	m.holdParked = prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Name: "swap_hold_parked_connections_total",
		Help: "Connection attempts (SYNs, retransmits included) parked by connection holds and released to the new process."})
	m.resizes = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "resizes_total",
		Help: "Resizes, by result (applied, refused, failed), method (cgroup: per-container host cgroups; sandbox: the pod cgroup of a sandbox governed as a whole; backend: the runtime only, not verified on the host) and runtime class (container-cgroups, sandbox-cgroup, vm, unknown)."},
		[]string{"result", "method", "runtime_class"})
	m.fenceWaits = prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Name: "fence_waits_total",
		Help: "kubelet calls that waited for a running swap of their container."})
	m.fenceWait = prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: namespace, Name: "fence_wait_duration_seconds",
		Help: "How long kubelet calls waited for a running swap.", Buckets: prometheus.ExponentialBuckets(0.01, 3, 10)})
	m.recoveries = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "journal_recoveries_total",
		Help: "Swaps left in the journal by a crash and settled at start, by result (ok, failed)."}, []string{"result"})
	m.pullBytes = prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Name: "pull_bytes_total",
		Help: "Image bytes written to the backend's content store by pulls inplaced made (prepull, swaps)."})
	m.relayAbuse = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "relay_abuse_total",
		Help: "Caller or backend connections the relay ended for hitting one of its limits (rapid_reset, ping_flood, settings_flood, control_queue, continuation_flood)."},
		[]string{"limit"})
	m.degraded = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Name: "degraded",
		Help: "1 while a part of inplaced is out of service (state, kubeconfig, metrics, control-socket): CRI calls pass through meanwhile; inplacectl status says what to do."},
		[]string{"part"})
	m.setAside = prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Name: "journal_entries_set_aside_total",
		Help: "Journal entries that could not be decoded, set aside in the state file and not recovered."})
	buildInfo := prometheus.NewGauge(prometheus.GaugeOpts{Namespace: namespace, Name: "build_info",
		Help: "inplaced's version.", ConstLabels: prometheus.Labels{"version": version}})
	buildInfo.Set(1)
	m.reg.MustRegister(m.criRequests, m.criDuration, m.swaps, m.swapsRunning, m.steps, m.downtime, m.resizes,
		m.fenceWaits, m.fenceWait, m.recoveries, m.pullBytes, m.relayAbuse, m.degraded, m.setAside,
		m.holds, m.holdDuration, m.holdParked, buildInfo,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if overrides != nil {
		m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: namespace, Name: "active_overrides",
			Help: "Containers running a swapped config that kubelet's next create gets too."}, func() float64 {
			n, err := overrides()
			if err != nil {
				return -1
			}
			return float64(n)
		}))
	}
	for _, sd := range []grpc.ServiceDesc{runtimeapi.RuntimeService_ServiceDesc, runtimeapi.ImageService_ServiceDesc} {
		for _, md := range sd.Methods {
			m.method("/"+sd.ServiceName+"/"+md.MethodName, md.MethodName)
		}
		for _, st := range sd.Streams {
			m.method("/"+sd.ServiceName+"/"+st.StreamName, st.StreamName)
		}
	}
	m.method(otherMethod, otherMethod)
	return m
}

func (m *Metrics) method(full, name string) {
	m.methods[full] = &methodMetrics{name: name, hists: m.criDuration, parent: m.criRequests}
}

// Handler serves /metrics, uncompressed: a gzip writer keeps about 1 MB of
// compression tables, and promhttp keeps them in a pool between scrapes —
// 1.8 MB of inplaced's 4.4 MB live heap under a 60-pod kubelet load scraped
// every 15 s (a heap profile, 2026-12-04), doubled by the GC's headroom in
// resident memory, to save a few tens of kB per scrape of a node-local
// endpoint.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg, DisableCompression: true})
}

// Registry is the registry (tests).
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// StreamInterceptor counts and times every call of the CRI server it is
// installed on (grpc.ChainStreamInterceptor).
func (m *Metrics) StreamInterceptor() grpc.StreamServerInterceptor {
	other := m.methods[otherMethod]
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		start := time.Now()
		err := handler(srv, ss)
		m.observe(other, info.FullMethod, status.Code(err), time.Since(start))
		return err
	}
}

// Observe counts and times one relayed call (relay.WithObserver: the CRI
// server is the relay's HTTP/2 router, which sees every call, passed
// through or intercepted).
func (m *Metrics) Observe(method string, code codes.Code, elapsed time.Duration) {
	m.observe(m.methods[otherMethod], method, code, elapsed)
}

func (m *Metrics) observe(other *methodMetrics, method string, code codes.Code, elapsed time.Duration) {
	mm := m.methods[method]
	if mm == nil {
		mm = other
	}
	mm.observer().Observe(elapsed.Seconds())
	mm.counter(code).Inc()
}

// RelayAbuse counts a connection the relay ended for hitting a limit
// (relay.WithAbuseObserver).
func (m *Metrics) RelayAbuse(limit string) { m.relayAbuse.WithLabelValues(limit).Inc() }

// SwapStarted implements swap.Observer.
func (m *Metrics) SwapStarted(*inplacedv1.SwapRecord) { m.swapsRunning.Inc() }

// StepStarted implements swap.Observer.
func (m *Metrics) StepStarted(*inplacedv1.SwapRecord, string) {}

// StepEnded implements swap.Observer.
func (m *Metrics) StepEnded(_ *inplacedv1.SwapRecord, st *inplacedv1.Step) {
	failed := "false"
	if st.Error != "" {
		failed = "true"
	}
	m.steps.WithLabelValues(st.Name, failed).Observe(time.Duration(st.DurationNs).Seconds())
}

// SwapEnded implements swap.Observer.
func (m *Metrics) SwapEnded(rec *inplacedv1.SwapRecord) {
	m.swapsRunning.Dec()
	m.swaps.WithLabelValues(rec.Kind, Result(rec.State)).Inc()
	if rec.DowntimeNs > 0 {
		m.downtime.WithLabelValues(rec.Kind).Observe(time.Duration(rec.DowntimeNs).Seconds())
	}
	if h := rec.Hold; h != nil {
		reason := h.Reason
		if reason == "" {
			reason = "none"
		}
		m.holds.WithLabelValues(h.Mode, reason).Inc()
		if h.DurationNs > 0 {
			m.holdDuration.WithLabelValues(h.Mode).Observe(time.Duration(h.DurationNs).Seconds())
		}
		m.holdParked.Add(float64(h.Parked))
	}
}

// Result is the swaps_total result label of a state.
func Result(s inplacedv1.SwapState) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "SWAP_STATE_"))
}

// OverrideChanged implements swap.Observer (the gauge reads the store).
func (m *Metrics) OverrideChanged(*inplacedv1.SwapRecord, bool) {}

// Recovered implements swap.Observer.
func (m *Metrics) Recovered(_ string, err error) {
	if err != nil {
		m.recoveries.WithLabelValues("failed").Inc()
		return
	}
	m.recoveries.WithLabelValues("ok").Inc()
}

// Resized counts a resize record.
func (m *Metrics) Resized(rec *inplacedv1.ResizeRecord) {
	m.resizes.WithLabelValues(rec.Result, rec.Method, rec.RuntimeClass).Inc()
}

// WaitStarted implements fence.WaitObserver.
func (m *Metrics) WaitStarted(*fence.Fence) { m.fenceWaits.Inc() }

// WaitEnded implements fence.WaitObserver.
func (m *Metrics) WaitEnded(_ *fence.Fence, waited time.Duration) {
	m.fenceWait.Observe(waited.Seconds())
}

// PulledBytes adds n bytes written by a pull.
func (m *Metrics) PulledBytes(n int64) {
	if n > 0 {
		m.pullBytes.Add(float64(n))
	}
}

// SetDegraded sets whether part is out of service.
func (m *Metrics) SetDegraded(part string, out bool) {
	v := 0.0
	if out {
		v = 1
	}
	m.degraded.WithLabelValues(part).Set(v)
}

// SetAside counts a journal entry set aside.
func (m *Metrics) SetAside() { m.setAside.Inc() }
