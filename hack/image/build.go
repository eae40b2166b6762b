package main

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Where things are in the image.
const (
	// BinDir holds the binaries.
	BinDir = "/usr/local/bin"
	// HostFilesDir holds the files the installer writes onto the host,
	// at their paths in the repository (systemd/inplaced.service,
	// deploy/kubelet/10-inplaced.conf, ...).
	HostFilesDir = "/opt/inplaced"
)

// DefaultPlatforms are the platforms of make release and so of the index.
var DefaultPlatforms = []v1.Platform{
	{OS: "linux", Architecture: "amd64"},
	{OS: "linux", Architecture: "arm64"},
}

// DefaultHostFiles are what the installer may write onto a node: the
// units, inplaced's configuration, kubelet's drop-in and configuration
// snippets, and k3s's. A directory brings every file under it, so a file
// added there ships without a change here.
var DefaultHostFiles = []string{"systemd", "deploy/inplaced", "deploy/kubelet", "deploy/k3s"}

// ReleaseName is a release binary's file name: the name, the OS and the
// architecture (make release writes them so).
func ReleaseName(bin string, p v1.Platform) string {
	return fmt.Sprintf("%s-%s-%s", bin, p.OS, p.Architecture)
}

// Spec is what an index is built from.
type Spec struct {
	BinDir     string   // the release binaries (ReleaseName)
	Bins       []string // the ones that go in the image
	Entrypoint string   // one of Bins, or "" for none
	SourceDir  string   // the repository
	HostFiles  []string // relative to SourceDir
	Version    string
	Commit     string
	Created    time.Time
	Platforms  []v1.Platform
}

// Build makes the index: one image per platform, the host files' layer
// shared.
func Build(s Spec) (v1.ImageIndex, error) {
	if s.Entrypoint != "" && !slices.Contains(s.Bins, s.Entrypoint) {
		return nil, fmt.Errorf("entrypoint %q is not among the binaries %q", s.Entrypoint, s.Bins)
	}
	files, err := hostFilesLayer(s)
	if err != nil {
		return nil, err
	}
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, p := range s.Platforms {
		img, err := platformImage(s, p, files)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
			Add:        img,
			Descriptor: v1.Descriptor{Platform: &p},
		})
	}
	return mutate.Annotations(idx, labels(s)).(v1.ImageIndex), nil
}

// labels are the OCI annotation keys the images carry as labels and the
// index as annotations.
func labels(s Spec) map[string]string {
	return map[string]string{
		"org.opencontainers.image.title":    "inplaced",
		"org.opencontainers.image.version":  s.Version,
		"org.opencontainers.image.revision": s.Commit,
		"org.opencontainers.image.created":  s.Created.Format(time.RFC3339),
	}
}

func platformImage(s Spec, p v1.Platform, files v1.Layer) (v1.Image, error) {
	bins, err := binariesLayer(s, p)
	if err != nil {
		return nil, err
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	created := v1.Time{Time: s.Created}
	img, err = mutate.Append(img,
		mutate.Addendum{Layer: files, History: v1.History{Created: created, CreatedBy: "hack/image: host files in " + HostFilesDir}},
		mutate.Addendum{Layer: bins, History: v1.History{Created: created, CreatedBy: "hack/image: " + strings.Join(s.Bins, " ") + " in " + BinDir}})
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Variant = p.OS, p.Architecture, p.Variant
	cf.Created = created
	cf.Config.Env = []string{"PATH=" + BinDir + ":/usr/sbin:/usr/bin:/sbin:/bin"}
	cf.Config.WorkingDir = "/"
	cf.Config.Labels = labels(s)
	if s.Entrypoint != "" {
		cf.Config.Entrypoint = []string{path.Join(BinDir, s.Entrypoint)}
	}
	return mutate.ConfigFile(img, cf)
}

// binariesLayer holds the platform's binaries in BinDir.
func binariesLayer(s Spec, p v1.Platform) (v1.Layer, error) {
	t := newTarLayer(s.Created)
	t.dirs(BinDir)
	for _, b := range s.Bins {
		data, err := os.ReadFile(filepath.Join(s.BinDir, ReleaseName(b, p)))
		if err != nil {
			return nil, fmt.Errorf("binary %s (make release builds it): %w", b, err)
		}
		t.file(path.Join(BinDir, b), 0o755, data)
	}
	return t.layer()
}

// hostFilesLayer holds the host files under HostFilesDir, at their paths
// in the repository.
func hostFilesLayer(s Spec) (v1.Layer, error) {
	t := newTarLayer(s.Created)
	t.dirs(HostFilesDir)
	err := walkHostFiles(s, func(dst string, data []byte) error {
		t.dirs(path.Dir(dst))
		t.file(dst, 0o644, data)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return t.layer()
}

// walkHostFiles calls fn with each regular file under the HostFiles of s:
// its path in the image (HostFilesDir/<its path in the repository>) and
// its contents, in lexical order.
func walkHostFiles(s Spec, fn func(dst string, data []byte) error) error {
	for _, root := range s.HostFiles {
		err := filepath.WalkDir(filepath.Join(s.SourceDir, root), func(p string, d fs.DirEntry, err error) error {
			if err != nil || !d.Type().IsRegular() {
				return err
			}
			rel, err := filepath.Rel(s.SourceDir, p)
			if err != nil {
				return err
			}
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			return fn(path.Join(HostFilesDir, filepath.ToSlash(rel)), data)
		})
		if err != nil {
			return fmt.Errorf("host files %s: %w", root, err)
		}
	}
	return nil
}

// tarLayer writes a layer's tar in memory, every entry owned by root and
// dated at one fixed time, each directory once and before its contents.
type tarLayer struct {
	buf  bytes.Buffer
	tw   *tar.Writer
	time time.Time
	seen map[string]bool
	err  error
}

func newTarLayer(t time.Time) *tarLayer {
	l := &tarLayer{time: t, seen: map[string]bool{}}
	l.tw = tar.NewWriter(&l.buf)
	return l
}

// dirs adds dir and its parents (absolute, slash-separated) not added yet.
func (l *tarLayer) dirs(dir string) {
	if dir == "/" || dir == "." || l.seen[dir] {
		return
	}
	l.dirs(path.Dir(dir))
	l.seen[dir] = true
	l.write(&tar.Header{Typeflag: tar.TypeDir, Name: strings.TrimPrefix(dir, "/") + "/", Mode: 0o755}, nil)
}

func (l *tarLayer) file(name string, mode int64, data []byte) {
	l.write(&tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(name, "/"), Mode: mode, Size: int64(len(data))}, data)
}

func (l *tarLayer) write(h *tar.Header, data []byte) {
	if l.err != nil {
		return
	}
	h.ModTime, h.Format = l.time, tar.FormatPAX
	if l.err = l.tw.WriteHeader(h); l.err == nil && data != nil {
		_, l.err = l.tw.Write(data)
	}
}

func (l *tarLayer) layer() (v1.Layer, error) {
	if l.err != nil {
		return nil, l.err
	}
	if err := l.tw.Close(); err != nil {
		return nil, err
	}
	data := l.buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data)), nil
	}, tarball.WithMediaType(types.OCILayer))
}

// refNameAnnotation tags an entry of an OCI layout's index.json, as skopeo
// (oci:DIR:TAG) and crane read it.
const refNameAnnotation = "org.opencontainers.image.ref.name"

// WriteLayout writes idx as the only entry of a new OCI layout at dir,
// tagged tag: `skopeo copy --all oci:DIR:TAG docker://...` copies it.
func WriteLayout(dir string, idx v1.ImageIndex, tag string) error {
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	return p.AppendIndex(idx, layout.WithAnnotations(map[string]string{refNameAnnotation: tag}))
}

// ReadLayout reads back the index WriteLayout wrote.
func ReadLayout(dir string) (v1.ImageIndex, error) {
	top, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, err
	}
	m, err := top.IndexManifest()
	if err != nil {
		return nil, err
	}
	if len(m.Manifests) != 1 || m.Manifests[0].MediaType != types.OCIImageIndex {
		return nil, fmt.Errorf("%s: want one image index in index.json, got %d entries", dir, len(m.Manifests))
	}
	return top.ImageIndex(m.Manifests[0].Digest)
}

// Push writes idx, its images and their blobs to ref and returns the
// index's digest. Credentials come from the docker config
// (~/.docker/config.json), as docker and crane use them.
func Push(ref string, idx v1.ImageIndex, opts ...name.Option) (v1.Hash, error) {
	r, err := name.ParseReference(ref, opts...)
	if err != nil {
		return v1.Hash{}, err
	}
	if err := remote.WriteIndex(r, idx, remote.WithAuthFromKeychain(authn.DefaultKeychain)); err != nil {
		return v1.Hash{}, fmt.Errorf("push %s: %w", ref, err)
	}
	return idx.Digest()
}

func summary(idx v1.ImageIndex) string {
	d, err := idx.Digest()
	if err != nil {
		return err.Error()
	}
	m, err := idx.IndexManifest()
	if err != nil {
		return err.Error()
	}
	var ps []string
	for _, desc := range m.Manifests {
		ps = append(ps, desc.Platform.String())
	}
	return fmt.Sprintf("index %s (%s)", d, strings.Join(ps, ", "))
}
