package events

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/inplaced/inplaced/pkg/fence"
	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

func newTestHub() *Hub {
	h := New()
	t0 := time.Unix(1_700_000_000, 0)
	n := 0
	h.now = func() time.Time { n++; return t0.Add(time.Duration(n) * time.Millisecond) }
	return h
}

// drain returns what is buffered on c now.
func drain(c <-chan *inplacedv1.Event) []*inplacedv1.Event {
	var out []*inplacedv1.Event
	for {
		select {
		case ev := <-c:
			out = append(out, ev)
		default:
			return out
		}
	}
}

func line(ev *inplacedv1.Event) string {
	return fmt.Sprintf("%s %s/%s/%s swap=%s step=%s state=%s ctr=%s: %s", ev.Kind, ev.Namespace, ev.Pod, ev.Container,
		ev.SwapId, ev.Step, ev.State, ev.ContainerId, ev.Message)
}

// TestSwapEvents: one swap's life as a watcher sees it, in order, with
// the pod named on a fence wait, and nothing of another pod's swap.
func TestSwapEvents(t *testing.T) {
	h := newTestHub()
	all, endAll := h.Subscribe(Filter{})
	defer endAll()
	web, endWeb := h.Subscribe(Filter{Namespace: "shop", Pod: "web"})
	defer endWeb()

	rec := &inplacedv1.SwapRecord{Id: "s1", Namespace: "shop", Pod: "web", Container: "app", OldContainerId: "old",
		Kind: "swap", Caller: &inplacedv1.Caller{Uid: 0, Pid: 42, Exe: "/usr/bin/inplacectl"},
		From: &inplacedv1.ConfigSummary{Image: "web:v1"}, To: &inplacedv1.ConfigSummary{Image: "web:v2"}}
	other := &inplacedv1.SwapRecord{Id: "s2", Namespace: "shop", Pod: "db", Container: "pg", Kind: "kubelet",
		Caller: &inplacedv1.Caller{Description: "kubelet (pod spec)"}}
	f := &fence.Fence{Key: fence.Key{SandboxID: "sb", Name: "app"}, SwapID: "s1"}

	h.SwapStarted(rec)
	h.SwapStarted(other)
	h.StepStarted(rec, "pull")
	h.StepEnded(rec, &inplacedv1.Step{Name: "pull", DurationNs: int64(1500 * time.Millisecond)})
	h.WaitStarted(f)
	h.StepEnded(rec, &inplacedv1.Step{Name: "health", Error: "GET /healthz: 503"})
	h.WaitEnded(f, 250*time.Millisecond)
	h.OverrideChanged(rec, true)
	rec.State, rec.RunningContainerId, rec.DowntimeNs = inplacedv1.SwapState_SWAP_STATE_COMMITTED, "new", int64(120*time.Millisecond)
	h.SwapEnded(rec)
	h.OverrideChanged(rec, false)
	// After the swap ended, a fence event no longer knows its pod.
	h.WaitStarted(f)

	want := []string{
		"swap-started shop/web/app swap=s1 step= state= ctr=old: swap by uid=0 pid=42 /usr/bin/inplacectl",
		"step-started shop/web/app swap=s1 step=pull state= ctr=old: ",
		"step-done shop/web/app swap=s1 step=pull state= ctr=old: done in 1.5s",
		"fence-wait shop/web/app swap=s1 step= state= ctr=: a kubelet call waits for the swap to end",
		"step-failed shop/web/app swap=s1 step=health state= ctr=old: GET /healthz: 503",
		"fence-wait-done shop/web/app swap=s1 step= state= ctr=: waited 250ms",
		"override-set shop/web/app swap=s1 step= state= ctr=old: kubelet's next create of this container gets the swapped config",
		"swap-ended shop/web/app swap=s1 step= state=COMMITTED ctr=new: web:v1 → web:v2, downtime 120ms",
		"override-dropped shop/web/app swap=s1 step= state= ctr=old: the container runs what the pod spec declares again",
	}
	got := drain(web)
	var lines []string
	for _, ev := range got {
		lines = append(lines, line(ev))
	}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Errorf("the web watcher got\n%s\nwant\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
	for i := 1; i < len(got); i++ {
		if got[i].TimeUnixNano <= got[i-1].TimeUnixNano {
			t.Errorf("event %d: time %d not after %d", i, got[i].TimeUnixNano, got[i-1].TimeUnixNano)
		}
	}
	everything := drain(all)
	if len(everything) != len(want)+2 {
		t.Fatalf("the unfiltered watcher got %d events, want %d", len(everything), len(want)+2)
	}
	if l := line(everything[1]); l != "swap-started shop/db/pg swap=s2 step= state= ctr=: kubelet by kubelet (pod spec)" {
		t.Errorf("other pod's start: %s", l)
	}
	if l := line(everything[len(everything)-1]); l != "fence-wait //app swap=s1 step= state= ctr=: a kubelet call waits for the swap to end" {
		t.Errorf("fence wait after the swap ended: %s", l)
	}
}

func TestResizeAndRecovered(t *testing.T) {
	h := newTestHub()
	c, end := h.Subscribe(Filter{Namespace: "shop"})
	defer end()
	h.Resized(&inplacedv1.ResizeRecord{Id: "r1", Namespace: "shop", Pod: "web", Container: "app", ContainerId: "c1",
		To: &inplacedv1.ResizeValues{CpuQuota: 150000, CpuPeriod: 100000, MemoryLimitBytes: 512 << 20}, Method: "cgroup",
		Result: "applied", DurationNs: int64(12 * time.Millisecond),
		Enforced: "on the host, per container", EnforcedBy: "container cgroup /kubepods/pod1/c1", Verified: "read back from the cgroup files"})
	h.Resized(&inplacedv1.ResizeRecord{Id: "r2", Namespace: "kube-system", Pod: "dns"})
	// Recovery events carry no pod: only unfiltered watchers get them.
	h.Recovered("s9", errors.New("container gone"))
	got := drain(c)
	if len(got) != 1 {
		t.Fatalf("got %d events, want the shop resize only", len(got))
	}
	if l, want := line(got[0]), "resize shop/web/app swap= step= state=applied ctr=c1: cpu quota 150000/100000, memory 536870912 via cgroup in 12ms; "+
		"enforced on the host, per container, by container cgroup /kubepods/pod1/c1; verified: read back from the cgroup files"; l != want {
		t.Errorf("resize event\n %s\nwant\n %s", l, want)
	}
	if got[0].ResizeId != "r1" {
		t.Errorf("resize id %q", got[0].ResizeId)
	}

	all, endAll := h.Subscribe(Filter{})
	defer endAll()
	h.Recovered("s9", errors.New("container gone"))
	h.Recovered("s10", nil)
	got = drain(all)
	if len(got) != 2 || got[0].Message != "recovery failed: container gone" || got[1].Message != "journaled swap settled after a restart" {
		t.Errorf("recovered events: %v", got)
	}
}

// TestSlowWatcher: publishing never blocks; a watcher that fell behind is
// told once, then gets events again; ending a subscription twice is safe.
func TestSlowWatcher(t *testing.T) {
	h := newTestHub()
	c, end := h.Subscribe(Filter{})
	rec := &inplacedv1.SwapRecord{Id: "s1", Namespace: "ns", Pod: "p"}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < subBuffer+10; i++ {
			h.StepStarted(rec, fmt.Sprint(i))
		}
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("publishing blocked on a full watcher")
	}
	got := drain(c)
	if len(got) != subBuffer || got[subBuffer-1].Step != fmt.Sprint(subBuffer-1) {
		t.Fatalf("got %d events, want the first %d", len(got), subBuffer)
	}
	h.StepStarted(rec, "next")
	got = drain(c)
	if len(got) != 2 || got[0].Kind != KindLost || got[1].Step != "next" {
		t.Fatalf("after falling behind: %v", got)
	}
	end()
	end()
	if _, ok := <-c; ok {
		t.Error("channel open after the subscription ended")
	}
	h.StepStarted(rec, "after") // no subscriber: must not panic on the closed channel
}
