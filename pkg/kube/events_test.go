package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/inplaced/inplaced/pkg/kube/podapi"
)

// fakeEvents is an events API: it keeps what was created and patched, and
// fails the next calls with the errors queued in fail.
type fakeEvents struct {
	mu      sync.Mutex
	created []*corev1.Event
	patches []string // namespace/name patch
	fail    []error
	store   map[string]bool // namespace/name of events that exist
}

func (f *fakeEvents) next() error {
	if len(f.fail) == 0 {
		return nil
	}
	err := f.fail[0]
	f.fail = f.fail[1:]
	return err
}

func (f *fakeEvents) Create(_ context.Context, ev *corev1.Event) (*corev1.Event, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.next(); err != nil {
		return nil, err
	}
	c := ev.DeepCopy()
	f.created = append(f.created, c)
	f.store[ev.Namespace+"/"+ev.Name] = true
	return c, nil
}

func (f *fakeEvents) Patch(_ context.Context, ns, name string, data []byte) (*corev1.Event, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.next(); err != nil {
		return nil, err
	}
	if !f.store[ns+"/"+name] {
		return nil, apierrors.NewNotFound(corev1.Resource("events"), name)
	}
	f.patches = append(f.patches, ns+"/"+name+" "+string(data))
	return &corev1.Event{}, nil
}

func testRecorder(f *fakeEvents) *eventRecorder {
	t0 := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	n := 0
	r := newEventRecorder(f, "node-1", zap.NewNop(), func() time.Time { n++; return t0.Add(time.Duration(n) * time.Second) })
	r.retryDelay = time.Millisecond
	return r
}

// writeQueued writes what is queued.
func writeQueued(r *eventRecorder) {
	for {
		select {
		case ev := <-r.queue:
			r.write(context.Background(), ev)
		default:
			return
		}
	}
}

var eventPod = &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web", UID: "u1", ResourceVersion: "7"}}

// TestEventsAsToolsRecordWritesThem: the first event is created with
// tools/record's fields; a repeat patches its count, last timestamp and
// message; another message is another event.
func TestEventsAsToolsRecordWritesThem(t *testing.T) {
	f := &fakeEvents{store: map[string]bool{}}
	r := testRecorder(f)
	r.Eventf(eventPod, corev1.EventTypeNormal, podapi.EventSwapStarted, "swap of %s", "app")
	r.Eventf(eventPod, corev1.EventTypeNormal, podapi.EventSwapStarted, "swap of %s", "app")
	r.Eventf(eventPod, corev1.EventTypeNormal, podapi.EventSwapStarted, "swap of %s", "app")
	r.Eventf(eventPod, corev1.EventTypeWarning, podapi.EventSwapFailed, "swap of %s failed", "app")
	writeQueued(r)

	if len(f.created) != 2 {
		t.Fatalf("created %d events, want 2: %+v", len(f.created), f.created)
	}
	ev := f.created[0]
	first := metav1.NewTime(time.Date(2026, 12, 4, 12, 0, 1, 0, time.UTC))
	want := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprintf("web.%x", first.UnixNano())},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: "ns", Name: "web", UID: "u1", ResourceVersion: "7"},
		Reason:         podapi.EventSwapStarted, Message: "swap of app", Type: corev1.EventTypeNormal,
		FirstTimestamp: first, LastTimestamp: first, Count: 1,
		Source:              corev1.EventSource{Component: "inplaced", Host: "node-1"},
		ReportingController: "inplaced", ReportingInstance: "node-1",
	}
	if got, _ := json.Marshal(ev); string(got) != mustJSON(t, want) {
		t.Errorf("event\n%s\nwant\n%s", got, mustJSON(t, want))
	}
	if len(f.patches) != 2 {
		t.Fatalf("patches %q, want 2", f.patches)
	}
	third := metav1.NewTime(time.Date(2026, 12, 4, 12, 0, 3, 0, time.UTC))
	wantPatch := fmt.Sprintf(`ns/%s {"count":3,"lastTimestamp":%s,"message":"swap of app"}`, want.Name, mustJSON(t, third))
	if f.patches[1] != wantPatch {
		t.Errorf("second repeat's patch %s, want %s", f.patches[1], wantPatch)
	}
	if f.created[1].Reason != podapi.EventSwapFailed || f.created[1].Count != 1 {
		t.Errorf("the other event: %+v", f.created[1])
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestEventWriteErrors: a repeat whose event is gone is created again with
// its count; an error from the API server is not retried; a server not
// reached is retried until it answers.
func TestEventWriteErrors(t *testing.T) {
	f := &fakeEvents{store: map[string]bool{}}
	r := testRecorder(f)
	r.Eventf(eventPod, corev1.EventTypeNormal, "A", "a")
	writeQueued(r)
	clear(f.store) // expired
	r.Eventf(eventPod, corev1.EventTypeNormal, "A", "a")
	writeQueued(r)
	if len(f.created) != 2 || f.created[1].Count != 2 || f.created[1].Name != f.created[0].Name {
		t.Fatalf("a repeat of an expired event: created %+v", f.created)
	}

	f.fail = []error{apierrors.NewForbidden(corev1.Resource("events"), "x", errors.New("no"))}
	r.Eventf(eventPod, corev1.EventTypeNormal, "B", "b")
	writeQueued(r)
	if len(f.created) != 2 || len(f.fail) != 0 {
		t.Fatalf("refused event: created %d, errors left %d", len(f.created), len(f.fail))
	}

	down := errors.New("connection refused")
	f.fail = []error{down, down, down}
	r.Eventf(eventPod, corev1.EventTypeNormal, "C", "c")
	writeQueued(r)
	if len(f.created) != 3 || f.created[2].Reason != "C" {
		t.Fatalf("event after 3 failed tries: created %+v", f.created)
	}

	f.fail = make([]error, eventTries)
	for i := range f.fail {
		f.fail[i] = down
	}
	r.Eventf(eventPod, corev1.EventTypeNormal, "D", "d")
	writeQueued(r)
	if len(f.created) != 3 || len(f.fail) != 0 {
		t.Fatalf("gave up after %d tries: created %d, errors left %d", eventTries, len(f.created), len(f.fail))
	}
}

// TestEventQueueNeverBlocks: a full queue drops, and says so.
func TestEventQueueNeverBlocks(t *testing.T) {
	r := testRecorder(&fakeEvents{store: map[string]bool{}})
	done := make(chan struct{})
	go func() {
		for range eventQueue + 10 {
			r.Eventf(eventPod, corev1.EventTypeNormal, "A", "a")
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Eventf blocked on a full queue")
	}
	if len(r.queue) != eventQueue {
		t.Errorf("queued %d, want %d", len(r.queue), eventQueue)
	}
}

// TestRepeatsRememberedBounded: the recorder keeps eventsKept events.
func TestRepeatsRememberedBounded(t *testing.T) {
	r := testRecorder(&fakeEvents{store: map[string]bool{}})
	for i := range eventsKept + 5 {
		r.remember(eventKey{message: fmt.Sprint(i)}, writtenEvent{count: 1})
	}
	if len(r.written) != eventsKept || len(r.order) != eventsKept {
		t.Fatalf("remembers %d (%d in order), want %d", len(r.written), len(r.order), eventsKept)
	}
	if _, ok := r.written[eventKey{message: "0"}]; ok {
		t.Error("the oldest is still remembered")
	}
}

// TestNodeEvents: inplaced's own health goes on the Node, where kubelet
// writes its events (default namespace, the node's name as UID); one
// reported before Run has started is written once it has.
func TestNodeEvents(t *testing.T) {
	f := &fakeEvents{store: map[string]bool{}}
	c := compose(Options{NodeName: "node-1", Logger: zap.NewNop()})
	c.NodeEvent(corev1.EventTypeWarning, "InplacedDegraded", "state out")
	if len(c.writer.nodeEvents) != 1 {
		t.Fatalf("event before Run: %v, want it kept", c.writer.nodeEvents)
	}
	r := testRecorder(f)
	c.writer.setRecorder(r) // as Run does
	c.NodeEvent(corev1.EventTypeNormal, "InplacedRecovered", "state back")
	writeQueued(r)
	if len(f.created) != 2 {
		t.Fatalf("created %d events, want 2", len(f.created))
	}
	for i, want := range []string{"InplacedDegraded", "InplacedRecovered"} {
		ev := f.created[i]
		ref := ev.InvolvedObject
		if ev.Reason != want || ev.Namespace != metav1.NamespaceDefault || ref.Kind != "Node" || ref.Name != "node-1" || ref.UID != "node-1" || ref.Namespace != "" {
			t.Errorf("event %d: reason %s in %s about %+v", i, ev.Reason, ev.Namespace, ref)
		}
	}
}
