package harness

import (
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// TestLinkPace checks that a registry link never delivers faster than its
// rate: the benchmark's "over a link" figures rest on it. (Only the lower
// bound is checked: how much slower a loaded machine makes it is not the
// link's doing.)
func TestLinkPace(t *testing.T) {
	const size = 4 << 20
	const bitsPerSec = 64_000_000 // 4 MiB in ~0.52 s
	reg := StartRegistry(t)
	link := reg.StartLink(t, bitsPerSec)
	layer, err := random.Layer(size, types.OCIUncompressedLayer)
	if err != nil {
		t.Fatal(err)
	}
	repo, err := name.NewRepository(reg.Addr+"/linktest", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteLayer(repo, layer); err != nil {
		t.Fatalf("push a layer: %v", err)
	}
	digest, err := layer.Digest()
	if err != nil {
		t.Fatal(err)
	}
	blobSize, err := layer.Size()
	if err != nil {
		t.Fatal(err)
	}
	get := func(host string) (int64, time.Duration) {
		t.Helper()
		start := time.Now()
		resp, err := http.Get(fmt.Sprintf("http://%s/v2/linktest/blobs/%s", host, digest))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET blob from %s: %s", host, resp.Status)
		}
		n, err := io.Copy(io.Discard, resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return n, time.Since(start)
	}
	n, d := get(link)
	if n != blobSize {
		t.Fatalf("the link served %d bytes, want %d", n, blobSize)
	}
	least := time.Duration(float64(blobSize*8)/bitsPerSec*float64(time.Second)) - pacerSlack
	t.Logf("%d bytes over a %d bit/s link in %s (no faster than %s allowed)", n, bitsPerSec, d, least)
	if d < least {
		t.Errorf("the link delivered %d bytes in %s, faster than its rate allows (%s)", n, d, least)
	}
	if n, d := get(reg.Addr); n != blobSize {
		t.Fatalf("the registry served %d bytes, want %d", n, blobSize)
	} else {
		t.Logf("the same blob from the registry itself: %s", d)
	}
}
