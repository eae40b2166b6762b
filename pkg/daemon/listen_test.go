package daemon

import (
	"net"
	"os"
	"path/filepath"
	"testing"
)

// socketFile is a listening unix socket at path as systemd passes one: a
// file, whose listener here is closed without unlinking the path.
func socketFile(t *testing.T, path string) *os.File {
	t.Helper()
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	f, err := l.File()
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	return f
}

// TestTakeActivated: of the sockets systemd passed, the one listening at
// --listen is taken (through a symlinked directory too); the others, and a
// connection whose local address is the path, are left; none is unlinked.
func TestTakeActivated(t *testing.T) {
	dir := t.TempDir()
	cri := filepath.Join(dir, "cri.sock")
	other := filepath.Join(dir, "other.sock")
	if err := os.Symlink(dir, filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	criF, otherF := socketFile(t, cri), socketFile(t, other)
	defer criF.Close()
	defer otherF.Close()
	// An accepted connection's local address is the listening path: a
	// connection, not a listener, and never taken.
	ln, err := net.FileListener(criF)
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	defer ln.Close()
	client, err := net.Dial("unix", cri)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	server, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	connF, err := server.(*net.UnixConn).File()
	server.Close()
	if err != nil {
		t.Fatal(err)
	}
	defer connF.Close()

	for _, c := range []struct {
		name   string
		files  []*os.File
		listen string
		taken  bool
		rest   int
	}{
		{"the CRI socket", []*os.File{criF}, cri, true, 0},
		{"among others, after a connection", []*os.File{connF, otherF, criF}, cri, true, 2},
		{"through a symlinked directory", []*os.File{criF}, filepath.Join(dir, "link", "cri.sock"), true, 0},
		{"another socket only", []*os.File{otherF}, cri, false, 1},
		{"a connection only", []*os.File{connF}, cri, false, 1},
		{"none", nil, cri, false, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			l, rest := takeActivated(dup(t, c.files), c.listen)
			for _, f := range rest {
				f.Close()
			}
			if (l != nil) != c.taken || len(rest) != c.rest {
				t.Fatalf("taken %v, %d left; want taken %v, %d left", l != nil, len(rest), c.taken, c.rest)
			}
			if l != nil {
				if l.Addr().String() != cri {
					t.Errorf("took the socket at %s", l.Addr())
				}
				l.Close()
			}
			for _, p := range []string{cri, other} {
				if fi, err := os.Lstat(p); err != nil || fi.Mode().Type() != os.ModeSocket {
					t.Errorf("%s after the listener closed: %v %v: systemd's socket was unlinked", p, fi, err)
				}
			}
		})
	}
	if c, err := net.Dial("unix", cri); err != nil {
		t.Errorf("the CRI socket no longer takes connections: %v", err)
	} else {
		c.Close()
	}
}

// dup gives takeActivated descriptors of its own, as each process gets
// from systemd, since it closes what it takes.
func dup(t *testing.T, files []*os.File) []*os.File {
	t.Helper()
	var out []*os.File
	for _, f := range files {
		l, err := net.FileListener(f)
		if err == nil {
			l.(*net.UnixListener).SetUnlinkOnClose(false)
			d, err := l.(*net.UnixListener).File()
			l.Close()
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, d)
			continue
		}
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		d, err := c.(*net.UnixConn).File()
		c.Close()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, d)
	}
	return out
}
