package install

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestHostPath: links under the host root resolve as on the host, an
// absolute target included, never into the installer's own filesystem.
func TestHostPath(t *testing.T) {
	root := t.TempDir()
	mk := func(p string) {
		if err := os.MkdirAll(filepath.Join(root, p), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	link := func(target, p string) {
		if err := os.Symlink(target, filepath.Join(root, p)); err != nil {
			t.Fatal(err)
		}
	}
	mk("/var/usrlocal/bin")
	mk("/usr")
	mk("/run")
	link("/var/usrlocal", "/usr/local") // Fedora CoreOS: absolute
	link("../run", "/var/run")          // relative
	link("/etc/loop", "/etc-loop")
	mk("/etc")
	link("/etc-loop", "/etc/loop")
	for _, c := range []struct {
		p        string
		keepLast bool
		want     string
	}{
		{"/usr/local/bin/inplaced", false, "/var/usrlocal/bin/inplaced"},
		{"/var/run/inplaced/inplaced.sock", false, "/run/inplaced/inplaced.sock"},
		{"/usr/local", true, "/usr/local"}, // the link itself, to remove it
		{"/etc/systemd/system/x.service", false, "/etc/systemd/system/x.service"},
		{"/../../etc/passwd", false, "/etc/passwd"},
	} {
		got, err := hostPath(root, c.p, c.keepLast)
		if err != nil {
			t.Errorf("%s: %v", c.p, err)
			continue
		}
		if got != filepath.Join(root, c.want) {
			t.Errorf("%s: %s, want %s under the root", c.p, strings.TrimPrefix(got, root), c.want)
		}
	}
	if _, err := hostPath(root, "/etc/loop/x", false); err == nil {
		t.Error("a link loop resolved")
	}
}

// TestExecutorFollowsHostLinks: on a host whose /usr/local is a link
// (/var/usrlocal), the binaries land in the link's target and the link
// stays; uninstall removes them from there.
func TestExecutorFollowsHostLinks(t *testing.T) {
	h := newHost(t)
	if err := os.MkdirAll(filepath.Join(h.root, "/var/usrlocal/bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(h.root, "/usr"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/var/usrlocal", filepath.Join(h.root, "/usr/local")); err != nil {
		t.Fatal(err)
	}
	if _, err := h.run("install", "v1"); err != nil {
		t.Fatal(err)
	}
	if got := h.read("/var/usrlocal/bin/inplaced"); got != "#!inplaced v1\n" {
		t.Errorf("binary in the link's target: %q", got)
	}
	if st, err := os.Lstat(filepath.Join(h.root, "/usr/local")); err != nil || st.Mode()&os.ModeSymlink == 0 {
		t.Errorf("/usr/local is no longer a link: %v %v", st, err)
	}
	if p, err := h.run("install", "v1"); err != nil || !p.Empty() {
		t.Errorf("second run: %v\n%s", err, p)
	}
	if _, err := h.run("uninstall", "v1"); err != nil {
		t.Fatal(err)
	}
	if h.exists("/var/usrlocal/bin/inplaced") {
		t.Error("binary left in the link's target")
	}
}
