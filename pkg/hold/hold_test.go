package hold

import (
	"context"
	"fmt"
	"testing"

	"github.com/inplaced/inplaced/pkg/holdmode"
)

func TestClassify(t *testing.T) {
	ls := []listener{
		{port: 8080, inode: 1}, {port: 8080, inode: 2}, // v4 and v6 of the container
		{port: 9090, inode: 3},                         // a sidecar
		{port: 7070, inode: 4}, {port: 7070, inode: 5}, // shared by the container and a sidecar
	}
	mine := map[uint32]bool{1: true, 2: true, 4: true}
	got := classify(ls, mine, []uint16{8080, 9090, 8443, 0})
	if fmt.Sprint(got.Hold) != "[8080 8443]" || fmt.Sprint(got.Observed) != "[8080]" || fmt.Sprint(got.Others) != "[7070 9090]" {
		t.Errorf("classify = %+v", got)
	}
}

func TestNetlinkRoundTrip(t *testing.T) {
	a := nlMsg{typ: 3<<8 | 2, flags: 5, seq: 7, data: append(attr(1, []byte{1, 0, 0, 0}), attr(2, []byte{0, 0, 0, 0, 1})...)}
	b := append(a.marshal(), nlMsg{typ: 3, seq: 8}.marshal()...)
	msgs, err := parseMsgs(b)
	if err != nil || len(msgs) != 2 || msgs[0].typ != a.typ || msgs[0].seq != 7 || msgs[1].seq != 8 {
		t.Fatalf("parse = %+v, %v", msgs, err)
	}
	var seen []string
	attrs(msgs[0].data, func(typ uint16, v []byte) { seen = append(seen, fmt.Sprint(typ, v)) })
	if fmt.Sprint(seen) != "[1 [1 0 0 0] 2 [0 0 0 0 1]]" {
		t.Errorf("attrs = %v", seen)
	}
}

// A hold that fails after opening the namespace undoes what it set up and
// returns the error: here the context is cancelled before any slot is
// tried (as root), or entering the namespace is refused (not root), or the
// kernel (or an emulator) has no sock_diag. None of these may panic.
func TestHoldFailsCleanly(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	h, err := Hold(ctx, "/proc/self/ns/net", []uint16{8080}, holdmode.Drop)
	if err == nil || h != nil {
		t.Fatalf("Hold with a cancelled context = %v, %v; want nil and an error", h, err)
	}
}
