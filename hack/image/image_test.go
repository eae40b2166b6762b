package main

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// root is the repository, seen from this package's directory.
const root = "../.."

var withInstaller = []string{"inplaced", "inplacectl", "inplaced-installer"}

// standIns writes, under every name of withInstaller and as make release
// names them, a stand-in for each platform: an ELF header of its machine
// (staticELF). The index only carries the binaries, so their headers are
// all there is to check, and a real build of four binaries for two
// architectures would cost minutes.
var standIns = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "inplaced-image-test-")
	if err != nil {
		return "", err
	}
	for _, p := range DefaultPlatforms {
		for _, b := range withInstaller {
			if err := os.WriteFile(filepath.Join(dir, ReleaseName(b, p)), elfFile(machines[p.Architecture], false), 0o755); err != nil {
				return "", err
			}
		}
	}
	return dir, nil
})

// elfFile is a 64-bit little-endian ELF executable's header for machine,
// with one PT_INTERP program header (a dynamically linked program's) when
// interp is set.
func elfFile(machine elf.Machine, interp bool) []byte {
	const ehsize, phentsize = 64, 56
	var phnum, phoff uint64
	if interp {
		phnum, phoff = 1, ehsize
	}
	b := []byte{0x7f, 'E', 'L', 'F', byte(elf.ELFCLASS64), byte(elf.ELFDATA2LSB), byte(elf.EV_CURRENT), 0, 0, 0, 0, 0, 0, 0, 0, 0}
	le := binary.LittleEndian
	b = le.AppendUint16(b, uint16(elf.ET_EXEC))
	b = le.AppendUint16(b, uint16(machine))
	b = le.AppendUint32(b, uint32(elf.EV_CURRENT))
	b = le.AppendUint64(b, 0x401000) // entry
	b = le.AppendUint64(b, phoff)
	b = le.AppendUint64(b, 0) // no section headers
	b = le.AppendUint32(b, 0) // flags
	b = le.AppendUint16(b, ehsize)
	b = le.AppendUint16(b, phentsize)
	b = le.AppendUint16(b, uint16(phnum))
	b = le.AppendUint16(b, 64) // shentsize
	b = le.AppendUint16(b, 0)  // shnum
	b = le.AppendUint16(b, 0)  // shstrndx
	if interp {
		path := []byte("/lib/ld-linux.so\x00")
		b = le.AppendUint32(b, uint32(elf.PT_INTERP))
		b = le.AppendUint32(b, uint32(elf.PF_R))
		b = le.AppendUint64(b, ehsize+phentsize) // offset
		b = le.AppendUint64(b, 0)                // vaddr
		b = le.AppendUint64(b, 0)                // paddr
		b = le.AppendUint64(b, uint64(len(path)))
		b = le.AppendUint64(b, uint64(len(path)))
		b = le.AppendUint64(b, 1) // align
		b = append(b, path...)
	}
	return b
}

func TestMain(m *testing.M) {
	code := m.Run()
	if dir, err := standIns(); err == nil {
		os.RemoveAll(dir)
	}
	os.Exit(code)
}

func testSpec(t *testing.T) Spec {
	t.Helper()
	dir, err := standIns()
	if err != nil {
		t.Fatal(err)
	}
	return Spec{
		BinDir:     dir,
		Bins:       withInstaller,
		Entrypoint: "inplaced-installer",
		SourceDir:  root,
		HostFiles:  DefaultHostFiles,
		Version:    "v0.0.0-test",
		Commit:     "0123456789abcdef",
		Created:    time.Unix(1700000000, 0).UTC(),
		Platforms:  DefaultPlatforms,
	}
}

// The index written to an OCI layout and read back from disk: both
// platforms, each image's config naming its own, its binaries of that
// platform's ELF machine, the host files shared as one layer, the layout
// tagged with the version; and the same inputs give the same digest.
func TestLayoutBothPlatforms(t *testing.T) {
	s := testSpec(t)
	idx, err := Build(s)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "image")
	if err := WriteLayout(dir, idx, s.Version); err != nil {
		t.Fatal(err)
	}
	back, err := ReadLayout(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := Verify(back, s); err != nil {
		t.Fatal(err)
	}
	m, err := back.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Manifests) != 2 {
		t.Fatalf("%d manifests, want 2", len(m.Manifests))
	}
	var shared []v1.Hash
	for _, desc := range m.Manifests {
		img, err := back.Image(desc.Digest)
		if err != nil {
			t.Fatal(err)
		}
		checkPlatformImage(t, img, *desc.Platform)
		layers, err := img.Layers()
		if err != nil || len(layers) != 2 {
			t.Fatalf("%s: %d layers (%v), want the host files' and the binaries'", desc.Platform, len(layers), err)
		}
		d, _ := layers[0].Digest()
		shared = append(shared, d)
	}
	if shared[0] != shared[1] {
		t.Errorf("the host files' layer differs between platforms: %v", shared)
	}
	checkLayoutTag(t, dir, s.Version)

	again, err := Build(s)
	if err != nil {
		t.Fatal(err)
	}
	d1, _ := idx.Digest()
	d2, _ := again.Digest()
	if d1 != d2 {
		t.Errorf("two builds of the same inputs: %s and %s", d1, d2)
	}
}

// checkPlatformImage reads what Verify reads, on its own: the config's
// platform and each binary's ELF machine.
func checkPlatformImage(t *testing.T, img v1.Image, p v1.Platform) {
	t.Helper()
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.OS != "linux" || cf.Architecture != p.Architecture {
		t.Errorf("%s: config says %s/%s", p, cf.OS, cf.Architecture)
	}
	if want := "/usr/local/bin/inplaced-installer"; len(cf.Config.Entrypoint) != 1 || cf.Config.Entrypoint[0] != want {
		t.Errorf("%s: entrypoint %q, want %s", p, cf.Config.Entrypoint, want)
	}
	files, err := regularFiles(img)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}[p.Architecture]
	for _, b := range withInstaller {
		data := files["/usr/local/bin/"+b]
		f, err := elf.NewFile(bytes.NewReader(data))
		if err != nil {
			t.Fatalf("%s: %s: %v", p, b, err)
		}
		if f.Machine != want {
			t.Errorf("%s: %s is for %s, want %s", p, b, f.Machine, want)
		}
	}
	for _, f := range []string{"/opt/inplaced/systemd/inplaced.service", "/opt/inplaced/deploy/inplaced/config.yaml",
		"/opt/inplaced/deploy/kubelet/10-inplaced.conf", "/opt/inplaced/deploy/kubelet/kubelet-config.yaml"} {
		if _, ok := files[f]; !ok {
			t.Errorf("%s: no %s", p, f)
		}
	}
}

// checkLayoutTag checks that index.json tags the index with the version,
// as `skopeo copy --all oci:DIR:TAG` looks for it.
func checkLayoutTag(t *testing.T, dir, tag string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "index.json"))
	if err != nil {
		t.Fatal(err)
	}
	var top v1.IndexManifest
	if err := json.Unmarshal(b, &top); err != nil {
		t.Fatal(err)
	}
	if len(top.Manifests) != 1 || top.Manifests[0].Annotations[refNameAnnotation] != tag {
		t.Errorf("index.json: %s, want one entry tagged %s", b, tag)
	}
}

// Verify itself, on indexes made to fail it: a check that cannot fail
// proves nothing.
func TestVerifyCatches(t *testing.T) {
	s := testSpec(t)
	swapped := s
	swapped.BinDir = t.TempDir()
	for _, b := range s.Bins {
		// Each platform's name holds the other platform's binary.
		link(t, filepath.Join(s.BinDir, ReleaseName(b, s.Platforms[1])), filepath.Join(swapped.BinDir, ReleaseName(b, s.Platforms[0])))
		link(t, filepath.Join(s.BinDir, ReleaseName(b, s.Platforms[0])), filepath.Join(swapped.BinDir, ReleaseName(b, s.Platforms[1])))
	}
	oneArch := s
	oneArch.Platforms = s.Platforms[:1]
	noInstaller := s
	noInstaller.Bins, noInstaller.Entrypoint = s.Bins[:2], ""
	dynamic := s
	dynamic.BinDir = t.TempDir()
	for _, b := range s.Bins {
		for _, p := range s.Platforms {
			data := elfFile(machines[p.Architecture], b == "inplacectl")
			if err := os.WriteFile(filepath.Join(dynamic.BinDir, ReleaseName(b, p)), data, 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, c := range []struct {
		name        string
		built, want Spec
		err         string // "" for none
	}{
		{"as built", s, s, ""},
		{"without the installer", noInstaller, noInstaller, ""},
		{"binaries of the other architecture", swapped, s, "ELF machine"},
		{"a dynamically linked binary", dynamic, s, "inplacectl: dynamically linked"},
		{"a platform missing", oneArch, s, "platforms"},
		{"the entrypoint missing", noInstaller, s, "entrypoint"},
		{"a host file more", s, withHostFiles(s, "deploy/kubelet"), "files under /opt/inplaced"},
	} {
		idx, err := Build(c.built)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		err = Verify(idx, c.want)
		if (err == nil) != (c.err == "") || (err != nil && !strings.Contains(err.Error(), c.err)) {
			t.Errorf("%s: Verify = %v, want an error with %q", c.name, err, c.err)
		}
	}
	bad := s
	bad.Entrypoint = "sh"
	if _, err := Build(bad); err == nil {
		t.Error("Build with an entrypoint that is not among the binaries: no error")
	}
}

func withHostFiles(s Spec, files ...string) Spec {
	s.HostFiles = files
	return s
}

func link(t *testing.T, from, to string) {
	t.Helper()
	if err := os.Symlink(from, to); err != nil {
		t.Fatal(err)
	}
}

// The tool as make image runs it, writing the layout and pushing to a
// registry on loopback (go-containerregistry's, in process); the index
// pulled back from the registry is the one in the layout and passes
// Verify.
func TestPushAndPull(t *testing.T) {
	s := testSpec(t)
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	ref := strings.TrimPrefix(srv.URL, "http://") + "/inplaced:" + s.Version
	dir := filepath.Join(t.TempDir(), "image")
	err := run([]string{"-bin-dir", s.BinDir, "-bins", strings.Join(s.Bins, " "), "-entrypoint", s.Entrypoint,
		"-version", s.Version, "-commit", s.Commit, "-created", fmt.Sprint(s.Created.Unix()), "-source", root,
		"-layout", dir, "-push", ref, "-insecure"})
	if err != nil {
		t.Fatal(err)
	}
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	pulled, err := remote.Index(r)
	if err != nil {
		t.Fatal(err)
	}
	if err := Verify(pulled, s); err != nil {
		t.Fatalf("pulled back: %v", err)
	}
	local, err := ReadLayout(dir)
	if err != nil {
		t.Fatal(err)
	}
	d1, _ := pulled.Digest()
	d2, _ := local.Digest()
	if d1 != d2 {
		t.Errorf("registry has %s, the layout %s", d1, d2)
	}
}
