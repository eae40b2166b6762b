//go:build !qemu_user

// Not built under qemu-user: a network namespace test (hold_netns_test.go
// says why).

package hold

import (
	"slices"
	"testing"
)

// A Lister sees the namespace's listeners as they come and go, from its
// one socket.
func TestLister(t *testing.T) {
	tn := newTestNS(t)
	l, err := NewLister(tn.path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ports := func() []uint16 {
		t.Helper()
		p, err := l.Ports()
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	if p := ports(); len(p) != 0 {
		t.Fatalf("ports before listening: %v", p)
	}
	ln := tn.serve(t, "v1", 8080)
	if p := ports(); !slices.Contains(p, 8080) {
		t.Fatalf("ports while listening on 8080: %v", p)
	}
	ln.Close()
	if p := ports(); slices.Contains(p, 8080) {
		t.Fatalf("ports after closing 8080: %v", p)
	}
}
