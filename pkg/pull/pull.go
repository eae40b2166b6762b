// Package pull pulls images through the backend's CRI image service and
// reports their progress. Where the backend is containerd, the byte counts
// come from its content store: while CRI PullImage runs, the blobs being
// written show as ingests (refs "layer-sha256:…", "config-…",
// "manifest-…") with their offset and expected size; that is what
// containerd's own `ctr pull` shows. This is the only use of the containerd
// client here. A CRI-only backend (CRI-O) has no such API: progress is the
// elapsed time, and the note says why there is no byte count.
//
// The ingests carry no image name, so a pull counts the ingests that
// appeared after it started; two pulls at once (a prepull while kubelet
// pulls) may each count the other's blobs until they end. Prepull pulls its
// images one after the other for that reason; the final update of every
// pull is exact: the image's size as the backend reports it.
package pull

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	contentapi "github.com/containerd/containerd/api/services/content/v1"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/content/proxy"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

// K8sNamespace is the containerd namespace of CRI's images.
const K8sNamespace = "k8s.io"

// Options configures a Puller.
type Options struct {
	Images runtimeapi.ImageServiceClient
	// ContainerdAddress is the backend's containerd socket (the CRI
	// endpoint, for containerd); empty: CRI only.
	ContainerdAddress string
	Logger            *zap.Logger
	// Interval between progress updates; default 250 ms.
	Interval time.Duration
	// Bytes (optional) is told how many bytes each update added.
	Bytes func(n int64)
}

// Puller pulls with progress.
type Puller struct {
	img      runtimeapi.ImageServiceClient
	addr     string
	log      *zap.Logger
	interval time.Duration
	bytes    func(int64)

	mu   sync.Mutex
	cs   content.Store // nil until the content API answered
	conn *grpc.ClientConn
	note string // why there are no byte counts
}

// New returns a Puller.
func New(o Options) (*Puller, error) {
	if o.Images == nil {
		return nil, fmt.Errorf("pull.New: an image service is required")
	}
	p := &Puller{img: o.Images, addr: strings.TrimPrefix(o.ContainerdAddress, "unix://"), log: o.Logger,
		interval: o.Interval, bytes: o.Bytes}
	if p.log == nil {
		p.log = zap.NewNop()
	}
	if p.interval <= 0 {
		p.interval = 250 * time.Millisecond
	}
	if p.addr == "" {
		p.note = "the backend is CRI only: no byte counts"
	}
	return p, nil
}

// Close closes the content store connection.
func (p *Puller) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conn != nil {
		return p.conn.Close()
	}
	return nil
}

// store returns the content store, or nil and why not. It asks the
// backend once it answers; a backend that is not containerd is
// remembered.
func (p *Puller) store(ctx context.Context) (content.Store, string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cs != nil || p.addr == "" {
		return p.cs, p.note
	}
	if p.conn == nil {
		conn, err := grpc.NewClient("unix://"+p.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return nil, "no byte counts: " + err.Error()
		}
		p.conn = conn
	}
	cs := proxy.NewContentStore(contentapi.NewContentClient(p.conn))
	cctx, cancel := context.WithTimeout(namespaces.WithNamespace(ctx, K8sNamespace), 5*time.Second)
	defer cancel()
	if _, err := cs.ListStatuses(cctx); err != nil {
		p.log.Info("no containerd content store on the backend: pulls show elapsed time only", zap.Error(err))
		return nil, "the backend has no containerd content API (" + err.Error() + "): no byte counts"
	}
	p.cs = cs
	return cs, ""
}

type ingest struct {
	offset, total int64
	layer, gone   bool
}

// Pull runs CRI PullImage and calls progress every interval and once at
// the end (Done set, the image's size as the backend reports it). progress
// is called from Pull's goroutine.
func (p *Puller) Pull(ctx context.Context, req *runtimeapi.PullImageRequest, progress func(*inplacedv1.PullProgress)) (string, error) {
	image := req.GetImage().GetImage()
	start := time.Now()
	cs, note := p.store(ctx)
	nsctx := namespaces.WithNamespace(ctx, K8sNamespace)
	before := map[string]bool{}
	if cs != nil {
		if sts, err := cs.ListStatuses(nsctx); err == nil {
			for _, st := range sts {
				before[st.Ref] = true
			}
		}
	}
	type result struct {
		ref string
		err error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := p.img.PullImage(ctx, req)
		done <- result{resp.GetImageRef(), err}
	}()
	t := track{ingests: map[string]*ingest{}, start: start, now: time.Now}
	tick := time.NewTicker(p.interval)
	defer tick.Stop()
	var res result
	for {
		select {
		case res = <-done:
		case <-tick.C:
			if cs != nil {
				if sts, err := cs.ListStatuses(nsctx); err == nil {
					p.add(t.update(sts, before))
				}
			}
			progress(t.progress(image, cs != nil, note, false))
			continue
		}
		break
	}
	final := t.progress(image, cs != nil, note, true)
	if res.err != nil {
		final.Error = res.err.Error()
		progress(final)
		return "", res.err
	}
	final.ImageRef = res.ref
	if cs != nil {
		// The exact size: what the backend says the image takes.
		if st, err := p.img.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: res.ref}}); err == nil && st.GetImage() != nil {
			size := int64(st.GetImage().GetSize())
			if size >= final.BytesDone {
				p.add(size - final.BytesDone)
				final.BytesDone, final.BytesTotal = size, size
			}
		}
		final.LayersDone = final.LayersTotal
		final.EtaNs = 0
	}
	progress(final)
	return res.ref, nil
}

func (p *Puller) add(n int64) {
	if p.bytes != nil && n > 0 {
		p.bytes(n)
	}
}

// track adds up a pull's ingests.
type track struct {
	ingests map[string]*ingest
	start   time.Time
	samples []sample // for the rate: the last few seconds
	done    int64
	now     func() time.Time
}

type sample struct {
	at   time.Time
	done int64
}

// update folds the statuses in and returns how many bytes were added.
func (t *track) update(sts []content.Status, before map[string]bool) int64 {
	seen := map[string]bool{}
	for _, st := range sts {
		if before[st.Ref] {
			continue
		}
		seen[st.Ref] = true
		in := t.ingests[st.Ref]
		if in == nil {
			in = &ingest{layer: strings.HasPrefix(st.Ref, "layer-")}
			t.ingests[st.Ref] = in
		}
		if st.Offset > in.offset {
			in.offset = st.Offset
		}
		if st.Total > 0 {
			in.total = st.Total
		}
	}
	for ref, in := range t.ingests {
		if !seen[ref] && !in.gone {
			// Committed (or abandoned): count it whole.
			in.gone = true
			if in.total > in.offset {
				in.offset = in.total
			}
		}
	}
	var done int64
	for _, in := range t.ingests {
		done += in.offset
	}
	added := done - t.done
	if added < 0 {
		added = 0
	} else {
		t.done = done
	}
	return added
}

func (t *track) progress(image string, known bool, note string, final bool) *inplacedv1.PullProgress {
	now := t.now()
	p := &inplacedv1.PullProgress{Image: image, ElapsedNs: int64(now.Sub(t.start)), BytesKnown: known, Note: note,
		Done: final, TimeUnixNano: now.UnixNano()}
	if !known {
		return p
	}
	for _, in := range t.ingests {
		p.BytesTotal += max(in.total, in.offset)
		if in.layer {
			p.LayersTotal++
			if in.gone {
				p.LayersDone++
			}
		}
	}
	p.BytesDone = t.done
	t.samples = append(t.samples, sample{now, t.done})
	for len(t.samples) > 2 && now.Sub(t.samples[0].at) > 3*time.Second {
		t.samples = t.samples[1:]
	}
	if first := t.samples[0]; now.Sub(first.at) > 0 {
		p.BytesPerSecond = int64(float64(t.done-first.done) / now.Sub(first.at).Seconds())
	}
	if p.BytesPerSecond > 0 && p.BytesTotal > p.BytesDone {
		p.EtaNs = int64(float64(p.BytesTotal-p.BytesDone) / float64(p.BytesPerSecond) * float64(time.Second))
	}
	return p
}
