package main

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"path"
	"slices"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

// machines is the ELF machine of each architecture's binaries.
var machines = map[string]elf.Machine{
	"amd64": elf.EM_X86_64,
	"arm64": elf.EM_AARCH64,
}

// Verify checks an index as a user gets it (read back from a layout or a
// registry): exactly the platforms of s, each image's config naming its
// platform and the entrypoint, every binary of s in BinDir, static and
// built for that platform's machine, and every host file of s under
// HostFilesDir as it is in the repository.
func Verify(idx v1.ImageIndex, s Spec) error {
	m, err := idx.IndexManifest()
	if err != nil {
		return err
	}
	var got []string
	for _, desc := range m.Manifests {
		if desc.Platform == nil {
			return fmt.Errorf("manifest %s has no platform", desc.Digest)
		}
		got = append(got, desc.Platform.String())
		img, err := idx.Image(desc.Digest)
		if err != nil {
			return err
		}
		if err := verifyImage(img, *desc.Platform, s); err != nil {
			return fmt.Errorf("%s: %w", desc.Platform, err)
		}
	}
	var want []string
	for _, p := range s.Platforms {
		want = append(want, p.String())
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		return fmt.Errorf("index has platforms %q, want %q", got, want)
	}
	return nil
}

func verifyImage(img v1.Image, p v1.Platform, s Spec) error {
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	if cf.OS != p.OS || cf.Architecture != p.Architecture || cf.Variant != p.Variant {
		return fmt.Errorf("config says %s/%s/%s", cf.OS, cf.Architecture, cf.Variant)
	}
	var wantEntry []string
	if s.Entrypoint != "" {
		wantEntry = []string{path.Join(BinDir, s.Entrypoint)}
	}
	if !slices.Equal(cf.Config.Entrypoint, wantEntry) {
		return fmt.Errorf("entrypoint %q, want %q", cf.Config.Entrypoint, wantEntry)
	}
	files, err := regularFiles(img)
	if err != nil {
		return err
	}
	for _, b := range s.Bins {
		data, ok := files[path.Join(BinDir, b)]
		if !ok {
			return fmt.Errorf("no %s in %s", b, BinDir)
		}
		if err := checkBinary(data, p.Architecture); err != nil {
			return fmt.Errorf("%s: %w", b, err)
		}
	}
	return checkHostFiles(files, s)
}

// regularFiles is the image's file system, flattened: each regular file's
// contents by its absolute path.
func regularFiles(img v1.Image) (map[string][]byte, error) {
	rc := mutate.Extract(img)
	defer rc.Close()
	files := map[string][]byte{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files, nil
		}
		if err != nil {
			return nil, err
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			return nil, err
		}
		files[path.Join("/", h.Name)] = data
	}
}

// checkBinary checks that data is an executable for arch's machine with
// no dynamic loader or shared library: it runs in an image with nothing
// else in it.
func checkBinary(data []byte, arch string) error {
	f, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		return err
	}
	defer f.Close()
	if want, ok := machines[arch]; !ok || f.Machine != want {
		return fmt.Errorf("ELF machine %s, want %s's", f.Machine, arch)
	}
	if f.Type != elf.ET_EXEC && f.Type != elf.ET_DYN {
		return fmt.Errorf("ELF type %s: not an executable", f.Type)
	}
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			return fmt.Errorf("dynamically linked (has an interpreter): build it with CGO_ENABLED=0")
		}
	}
	return nil
}

// checkHostFiles checks that every host file of s is in the image at
// HostFilesDir/<its path in the repository>, with the same contents, and
// nothing else is under HostFilesDir.
func checkHostFiles(files map[string][]byte, s Spec) error {
	n := 0
	err := walkHostFiles(s, func(dst string, want []byte) error {
		if got, ok := files[dst]; !ok || !bytes.Equal(got, want) {
			return fmt.Errorf("%s is missing or differs from the repository's", dst)
		}
		n++
		return nil
	})
	if err != nil {
		return err
	}
	var inImage int
	for f := range files {
		if strings.HasPrefix(f, HostFilesDir+"/") {
			inImage++
		}
	}
	if inImage != n {
		return fmt.Errorf("%d files under %s, want the %d of %q", inImage, HostFilesDir, n, s.HostFiles)
	}
	return nil
}
