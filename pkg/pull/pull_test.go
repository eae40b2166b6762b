package pull

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/content"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

const mib = 1 << 20

// TestTrack follows one pull's ingests through the content store's
// statuses: blobs from before the pull are not counted, a committed blob
// counts whole, an offset never goes back, and rate and ETA come from the
// last seconds only.
func TestTrack(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	now := t0
	tr := track{ingests: map[string]*ingest{}, start: t0, now: func() time.Time { return now }}
	before := map[string]bool{"layer-sha256:other": true}
	other := content.Status{Ref: "layer-sha256:other", Offset: 5 * mib, Total: 50 * mib}
	step := func(at time.Duration, wantAdded int64, sts ...content.Status) *inplacedv1.PullProgress {
		t.Helper()
		now = t0.Add(at)
		if got := tr.update(append(sts, other), before); got != wantAdded {
			t.Errorf("at %s: update added %d bytes, want %d", at, got, wantAdded)
		}
		return tr.progress("img", true, "", false)
	}
	check := func(p *inplacedv1.PullProgress, done, total int64, layersDone, layersTotal int32, rate int64, eta time.Duration) {
		t.Helper()
		if p.BytesDone != done || p.BytesTotal != total || p.LayersDone != layersDone || p.LayersTotal != layersTotal ||
			p.BytesPerSecond != rate || (time.Duration(p.EtaNs)-eta).Abs() > time.Microsecond {
			t.Errorf("progress = done %d total %d layers %d/%d rate %d eta %s; want done %d total %d layers %d/%d rate %d eta %s",
				p.BytesDone, p.BytesTotal, p.LayersDone, p.LayersTotal, p.BytesPerSecond, time.Duration(p.EtaNs),
				done, total, layersDone, layersTotal, rate, eta)
		}
	}

	// 1 s: layer a a quarter done, layer b of unknown size, the config whole.
	p := step(time.Second, 10*mib+1024,
		content.Status{Ref: "layer-sha256:a", Offset: 10 * mib, Total: 40 * mib},
		content.Status{Ref: "layer-sha256:b"},
		content.Status{Ref: "config-sha256:c", Offset: 1024, Total: 1024})
	check(p, 10*mib+1024, 40*mib+1024, 0, 2, 0, 0) // one sample: no rate yet
	if p.ElapsedNs != int64(time.Second) || !p.BytesKnown || p.Done {
		t.Errorf("elapsed %d known %v done %v", p.ElapsedNs, p.BytesKnown, p.Done)
	}

	// 2 s: both layers move, the config was committed (gone).
	p = step(2*time.Second, 24*mib,
		content.Status{Ref: "layer-sha256:a", Offset: 30 * mib, Total: 40 * mib},
		content.Status{Ref: "layer-sha256:b", Offset: 4 * mib, Total: 20 * mib})
	// 24 MiB in the last second; 26 MiB to go.
	check(p, 34*mib+1024, 60*mib+1024, 0, 2, 24*mib, 26*mib*time.Second/(24*mib))

	// 3 s: a committed (counts its 40 MiB), b's ingest restarted lower.
	p = step(3*time.Second, 10*mib,
		content.Status{Ref: "layer-sha256:b", Offset: 2 * mib, Total: 20 * mib})
	check(p, 44*mib+1024, 60*mib+1024, 1, 2, 34*mib/2, 16*mib*time.Second/(34*mib/2))

	// 10 s: stalled; the rate only looks at the last seconds.
	p = step(10*time.Second, 0,
		content.Status{Ref: "layer-sha256:b", Offset: 4 * mib, Total: 20 * mib})
	check(p, 44*mib+1024, 60*mib+1024, 1, 2, 0, 0)

	// CRI only: no byte counts, the note says why.
	q := tr.progress("img", false, "why not", true)
	if q.BytesKnown || q.BytesDone != 0 || q.Note != "why not" || !q.Done {
		t.Errorf("unknown bytes: %v", q)
	}
}

// fakeImages answers PullImage after release is closed.
type fakeImages struct {
	runtimeapi.ImageServiceClient
	release chan struct{}
	err     error
	mu      sync.Mutex
	calls   int
}

func (f *fakeImages) PullImage(ctx context.Context, req *runtimeapi.PullImageRequest, _ ...grpc.CallOption) (*runtimeapi.PullImageResponse, error) {
	f.mu.Lock()
	f.calls++
	f.mu.Unlock()
	select {
	case <-f.release:
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	if f.err != nil {
		return nil, f.err
	}
	return &runtimeapi.PullImageResponse{ImageRef: "sha256:" + req.GetImage().GetImage()}, nil
}

func TestPullCRIOnly(t *testing.T) {
	if _, err := New(Options{}); err == nil {
		t.Error("New without an image service: no error")
	}
	for _, tc := range []struct {
		name string
		err  error
	}{{"ok", nil}, {"not found", status.Error(codes.NotFound, "no such image")}} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeImages{release: make(chan struct{}), err: tc.err}
			p, err := New(Options{Images: f, Interval: 5 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			time.AfterFunc(60*time.Millisecond, func() { close(f.release) })
			var got []*inplacedv1.PullProgress
			ref, err := p.Pull(context.Background(), &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: "app"}},
				func(u *inplacedv1.PullProgress) { got = append(got, u) })
			if status.Code(err) != status.Code(tc.err) {
				t.Fatalf("Pull error %v, want code %s (the backend's status unchanged)", err, status.Code(tc.err))
			}
			if len(got) < 3 {
				t.Fatalf("%d updates in 60 ms at 5 ms, want several", len(got))
			}
			for i, u := range got {
				if u.BytesKnown || !strings.Contains(u.Note, "CRI only") || u.Image != "app" {
					t.Errorf("update %d: %v", i, u)
				}
				if i > 0 && u.ElapsedNs < got[i-1].ElapsedNs {
					t.Errorf("update %d: elapsed went back", i)
				}
				if u.Done != (i == len(got)-1) {
					t.Errorf("update %d of %d: done %v", i, len(got), u.Done)
				}
			}
			last := got[len(got)-1]
			if tc.err == nil && (ref != "sha256:app" || last.ImageRef != ref || last.Error != "") {
				t.Errorf("ref %q, last update %v", ref, last)
			}
			if tc.err != nil && (ref != "" || !strings.Contains(last.Error, "no such image")) {
				t.Errorf("ref %q, last update %v", ref, last)
			}
		})
	}
}
