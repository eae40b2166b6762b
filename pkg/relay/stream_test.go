package relay

import "testing"

// TestStreamTransitions walks a stream through each path of its state
// machine (streamState, halfState) without a connection.
func TestStreamTransitions(t *testing.T) {
	up := &peer{streams: map[uint32]*stream{}, initWindow: 100}

	st := &stream{}
	st.queue(up)
	if st.state != stateWaiting || len(up.waiting) != 1 || st.upLive() {
		t.Fatalf("queued: state %d, %d waiting, upLive %v", st.state, len(up.waiting), st.upLive())
	}
	st.openOn(7)
	if st.state != stateOpen || up.streams[7] != st || st.win[sideUp] != 100 || !st.cancelable() {
		t.Fatalf("opened: state %d, on up %v, window %d, cancelable %v", st.state, up.streams[7] == st, st.win[sideUp], st.cancelable())
	}
	st.endSent(sideUp)
	st.endRecv(sideUp)
	if !st.sentEnd(sideUp) || !st.gotEnd(sideUp) || st.half[sideUp] != halfClosed || st.cancelable() || !st.upLive() {
		t.Fatalf("both ends upstream: half %b, cancelable %v, upLive %v", st.half[sideUp], st.cancelable(), st.upLive())
	}
	if st.gotEnd(sideDown) || st.sentEnd(sideDown) {
		t.Fatalf("the caller's side changed with the backend's: half %b", st.half[sideDown])
	}
	st.upReset()
	if st.state != stateUpReset || st.up != nil || up.streams[7] != nil {
		t.Fatalf("upstream reset: state %d, up %v, still on up %v", st.state, st.up, up.streams[7] != nil)
	}
	if wasOpen, ok := st.close(); wasOpen || !ok {
		t.Fatalf("close after an upstream reset: wasOpen %v ok %v, want false true", wasOpen, ok)
	}
	if _, ok := st.close(); ok {
		t.Fatal("closed twice")
	}

	local := &stream{}
	local.toLocal()
	if local.state != stateLocal || !local.answered || local.half[sideUp] != halfClosed || local.upLive() {
		t.Fatalf("answered locally: state %d, answered %v, half %b", local.state, local.answered, local.half[sideUp])
	}

	open := &stream{up: up}
	open.openOn(9)
	if wasOpen, ok := open.close(); !wasOpen || !ok {
		t.Fatalf("close of an open stream: wasOpen %v ok %v, want true true", wasOpen, ok)
	}
}
