package daemon

import (
	"net"
	"os"
	"path/filepath"
	"testing"

	"go.uber.org/zap/zaptest"
	"golang.org/x/sys/unix"
)

// notifySocket is a stand-in for systemd's notify socket: it returns each
// message with the fds that came with it.
func notifySocket(t *testing.T) (string, func() (string, []int)) {
	t.Helper()
	dir, err := os.MkdirTemp("", "fds") // short: a socket path has 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, "notify")
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return path, func() (string, []int) {
		b, oob := make([]byte, 4096), make([]byte, 4096)
		n, oobn, _, _, err := c.ReadMsgUnix(b, oob)
		if err != nil {
			t.Fatal(err)
		}
		var fds []int
		msgs, _ := unix.ParseSocketControlMessage(oob[:oobn])
		for _, m := range msgs {
			rights, _ := unix.ParseUnixRights(&m)
			fds = append(fds, rights...)
		}
		return string(b[:n]), fds
	}
}

// A stored fd reaches systemd with its name, and is the same open file;
// a removal names it.
func TestFDStore(t *testing.T) {
	path, next := notifySocket(t)
	s := fdStore{socket: path}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if err := s.put("takeover.1.YWJj.c3dhcA", w); err != nil {
		t.Fatal(err)
	}
	msg, fds := next()
	if msg != "FDSTORE=1\nFDNAME=takeover.1.YWJj.c3dhcA" || len(fds) != 1 {
		t.Fatalf("message %q with %d fds", msg, len(fds))
	}
	stored := os.NewFile(uintptr(fds[0]), "stored")
	if _, err := stored.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	stored.Close()
	if b := make([]byte, 1); func() bool { n, _ := r.Read(b); return n != 1 || b[0] != 'x' }() {
		t.Error("the stored fd is not the pipe's")
	}
	if err := s.remove("takeover.1.YWJj.c3dhcA"); err != nil {
		t.Fatal(err)
	}
	if msg, fds := next(); msg != "FDSTOREREMOVE=1\nFDNAME=takeover.1.YWJj.c3dhcA" || len(fds) != 0 {
		t.Errorf("message %q with %d fds", msg, len(fds))
	}
	// Not run by systemd: nothing to keep, nothing fails.
	if err := (fdStore{}).put("x", w); err != nil {
		t.Error(err)
	}
}

// The files systemd passes back: the stored notify fds go to the agent
// (closed when there is none: systemd keeps its copies), the rest to the
// CRI listener.
func TestTakerAdoptSplitsActivatedFiles(t *testing.T) {
	var files []*os.File
	for _, name := range []string{"inplaced.socket", "takeover.1.YWJj.c3dhcA", "other"} {
		// Raw fds, each owned by one *os.File only: wrapping an os.Pipe's
		// r.Fd() left r's finalizer to close the same number again at some
		// later GC, by then another test's file (a TempDir's RemoveAll
		// failed with EBADF in CI).
		var p [2]int
		if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
			t.Fatal(err)
		}
		unix.Close(p[1])
		files = append(files, os.NewFile(uintptr(p[0]), name))
	}
	tk := &taker{log: zaptest.NewLogger(t), adopted: map[string]bool{}}
	rest := tk.adopt(files)
	if len(rest) != 2 || rest[0].Name() != "inplaced.socket" || rest[1].Name() != "other" {
		t.Fatalf("rest %v", rest)
	}
	if err := files[1].Close(); err == nil {
		t.Error("the notify fd with no agent to serve it was not closed")
	}
	for _, f := range rest {
		f.Close()
	}
}
