package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/inplaced/inplaced/pkg/kubeclient"
)

// eventRecorder writes the controller's events about pods as client-go's
// tools/record writes them: the same Event objects (named
// <pod>.<nanoseconds in hex>, first and last timestamps, count, source and
// reporting component), a repeat of an event already written patching that
// event's count, last timestamp and message, a write the API server
// refused dropped and one that did not reach it retried 12 times 10 s
// apart. One goroutine writes, behind a queue of 1000 that drops when full:
// no caller waits on the API server.
//
// tools/record itself is not used: its repeat patch is computed by
// strategic merge patch, which links the OpenAPI models and
// structured-merge-diff into inplaced — with client-go's gentype (see
// pkg/kubeclient), 4.4 MB of its executable and 1.3 MB of the resident
// memory every node pays from the start (`inplaced version`: 21.4 → 20.1
// MiB), Kubernetes mode or not. Not carried over: tools/record's folding
// of more than 10 similar events of one object into a "combined" event,
// and its per-object rate limit (a burst of 25, then one per 5 minutes):
// inplaced writes a handful of events per swap.
type eventRecorder struct {
	events     kubeclient.EventInterface
	source     corev1.EventSource
	log        *zap.Logger
	now        func() time.Time
	queue      chan *corev1.Event
	retryDelay time.Duration

	// The events written, by what makes a repeat (the writer's alone).
	written map[eventKey]writtenEvent
	order   []eventKey // oldest first
}

const (
	eventQueue = 1000 // tools/record's maxQueuedEvents
	eventTries = 12   // tools/record's maxTriesPerEvent
	// eventRetry: tools/record's sleep between tries (the first one a
	// random part of it, so that nodes do not retry in step).
	eventRetry = 10 * time.Second
	// eventsKept: repeats are recognized among this many distinct events
	// (tools/record's LRU cache size).
	eventsKept = 4096
)

// eventKey is what makes two events the same (tools/record's getEventKey).
type eventKey struct {
	uid                                         types.UID
	namespace, name, eventType, reason, message string
}

type writtenEvent struct {
	name  string
	count int32
	first metav1.Time
}

func newEventRecorder(events kubeclient.EventInterface, node string, log *zap.Logger, now func() time.Time) *eventRecorder {
	return &eventRecorder{events: events, source: corev1.EventSource{Component: "inplaced", Host: node}, log: log, now: now,
		queue: make(chan *corev1.Event, eventQueue), retryDelay: eventRetry, written: map[eventKey]writtenEvent{}}
}

// Eventf queues an event about pod.
func (r *eventRecorder) Eventf(pod *corev1.Pod, eventType, reason, format string, args ...any) {
	r.eventf(corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: pod.Namespace, Name: pod.Name,
		UID: pod.UID, ResourceVersion: pod.ResourceVersion}, eventType, reason, format, args...)
}

// NodeEventf queues an event about node, where kubelet writes its own: in
// the default namespace, with the node's name as UID.
func (r *eventRecorder) NodeEventf(node, eventType, reason, format string, args ...any) {
	r.eventf(corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: node, UID: types.UID(node)},
		eventType, reason, format, args...)
}

func (r *eventRecorder) eventf(ref corev1.ObjectReference, eventType, reason, format string, args ...any) {
	t := metav1.NewTime(r.now())
	ns := ref.Namespace
	if ns == "" {
		ns = metav1.NamespaceDefault
	}
	ev := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: fmt.Sprintf("%v.%x", ref.Name, t.UnixNano()), Namespace: ns},
		InvolvedObject: ref,
		Reason:         reason, Message: fmt.Sprintf(format, args...), Type: eventType,
		FirstTimestamp: t, LastTimestamp: t, Count: 1,
		Source: r.source, ReportingController: r.source.Component, ReportingInstance: r.source.Host,
	}
	select {
	case r.queue <- ev:
	default:
		r.log.Warn("event dropped: the queue to the API server is full", zap.String("object", ref.Kind+" "+ns+"/"+ref.Name),
			zap.String("reason", reason), zap.String("message", ev.Message))
	}
}

// run writes the queued events until ctx ends.
func (r *eventRecorder) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case ev := <-r.queue:
			r.write(ctx, ev)
		}
	}
}

func (r *eventRecorder) write(ctx context.Context, ev *corev1.Event) {
	key := eventKey{uid: ev.InvolvedObject.UID, namespace: ev.InvolvedObject.Namespace, name: ev.InvolvedObject.Name,
		eventType: ev.Type, reason: ev.Reason, message: ev.Message}
	prev, repeat := r.written[key]
	if repeat {
		ev.Name, ev.FirstTimestamp, ev.Count = prev.name, prev.first, prev.count+1
	}
	for try := 1; ; try++ {
		err := r.writeOnce(ctx, ev, repeat)
		var status apierrors.APIStatus
		switch {
		case err == nil:
			r.remember(key, writtenEvent{name: ev.Name, count: ev.Count, first: ev.FirstTimestamp})
			return
		case errors.As(err, &status): // the same request would be refused again
			r.log.Warn("event refused by the API server", zap.String("reason", ev.Reason), zap.String("event", ev.Namespace+"/"+ev.Name), zap.Error(err))
			return
		case try >= eventTries:
			r.log.Error("event not written: the API server was not reached", zap.Int("tries", try),
				zap.String("reason", ev.Reason), zap.String("event", ev.Namespace+"/"+ev.Name), zap.Error(err))
			return
		}
		delay := r.retryDelay
		if try == 1 {
			delay = time.Duration(rand.Float64() * float64(delay))
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
	}
}

// writeOnce patches a repeat's event, or creates the event (also a repeat
// whose event is gone: expired, or deleted).
func (r *eventRecorder) writeOnce(ctx context.Context, ev *corev1.Event, repeat bool) error {
	if repeat {
		patch, err := json.Marshal(map[string]any{"count": ev.Count, "lastTimestamp": ev.LastTimestamp, "message": ev.Message})
		if err != nil {
			return err
		}
		if _, err = r.events.Patch(ctx, ev.Namespace, ev.Name, patch); !apierrors.IsNotFound(err) {
			return err
		}
	}
	ev.ResourceVersion = ""
	_, err := r.events.Create(ctx, ev)
	return err
}

func (r *eventRecorder) remember(key eventKey, w writtenEvent) {
	if _, ok := r.written[key]; !ok {
		r.order = append(r.order, key)
	}
	r.written[key] = w
	if len(r.order) > eventsKept {
		delete(r.written, r.order[0])
		r.order[0] = eventKey{}
		r.order = r.order[1:]
	}
}
