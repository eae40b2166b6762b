package resources

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// fakeTree is a cgroup hierarchy made of plain files in a temp dir, laid out
// like v1 (<root>/<controller>/<cgroup>/<file>) or v2 (<root>/<cgroup>/<file>).
type fakeTree struct {
	t    *testing.T
	root string
	v2   bool
}

func newFakeTree(t *testing.T, v2 bool) *fakeTree {
	t.Helper()
	tr := &fakeTree{t: t, root: t.TempDir(), v2: v2}
	if v2 {
		tr.writeFile(filepath.Join(tr.root, "cgroup.controllers"), "cpu memory pids")
	}
	return tr
}

func (tr *fakeTree) path(cg, file string) string {
	if tr.v2 {
		return filepath.Join(tr.root, cg, file)
	}
	controller, _, _ := strings.Cut(file, ".")
	return filepath.Join(tr.root, controller, cg, file)
}

func (tr *fakeTree) writeFile(p, content string) {
	tr.t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		tr.t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content+"\n"), 0o644); err != nil {
		tr.t.Fatal(err)
	}
}

// cgroup creates cg with the given files (file name → content).
func (tr *fakeTree) cgroup(cg string, files map[string]string) {
	tr.t.Helper()
	for f, v := range files {
		tr.writeFile(tr.path(cg, f), v)
	}
}

func (tr *fakeTree) get(cg, file string) string {
	tr.t.Helper()
	b, err := os.ReadFile(tr.path(cg, file))
	if err != nil {
		tr.t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// v1Files and v2Files are the files Read needs, with a kubelet-like
// container: 0.5 CPU limit, 512 shares, 256 MiB limit, 100 MiB in use.
func v1Files(quota, shares, mem string) map[string]string {
	return map[string]string{
		fileQuota: quota, filePeriod: "100000", fileShares: shares,
		fileMemLimit: mem, fileMemUsageV1: "104857600",
	}
}

func v2Files(cpuMax, weight, mem string) map[string]string {
	return map[string]string{
		fileCPUMax: cpuMax, fileWeight: weight, fileMemMax: mem, fileMemCurrent: "104857600",
	}
}

// recFS records every write as "<path relative to root>=<value>" and can make
// the failAt-th write (1-based, counting restores) fail with EINVAL, the way
// the kernel rejects a value.
type recFS struct {
	FS
	root   string
	failAt map[int]bool
	n      int
	writes []string
}

func newRecFS(root string, failAt ...int) *recFS {
	f := &recFS{FS: OSFS(), root: root, failAt: map[int]bool{}}
	for _, n := range failAt {
		f.failAt[n] = true
	}
	return f
}

func (f *recFS) WriteFile(p string, data []byte) error {
	f.n++
	if f.failAt[f.n] {
		return fmt.Errorf("injected failure of write %d: %w", f.n, syscall.EINVAL)
	}
	rel, _ := filepath.Rel(f.root, p)
	f.writes = append(f.writes, rel+"="+string(data))
	return f.FS.WriteFile(p, data)
}

func newTestManager(t *testing.T, tr *fakeTree, fsys FS) *Manager {
	t.Helper()
	m, err := New(tr.root, WithFS(fsys))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := m.Version() == 2, tr.v2; got != want {
		t.Fatalf("Version() = %d, want v2=%v", m.Version(), want)
	}
	return m
}
