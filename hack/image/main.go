// Command image builds inplaced's OCI image index (linux/amd64 and
// linux/arm64) from the release binaries without a container engine, and
// writes it to an OCI layout, pushes it to a registry, or both. make image
// runs it after make release:
//
//	go run ./hack/image -bin-dir _output/release/<version> -platforms "linux/amd64 linux/arm64" \
//	    -bins "inplaced inplacectl inplaced-installer" -entrypoint inplaced-installer \
//	    -version <version> -commit <sha> -created <unix seconds> \
//	    -layout _output/image [-push registry.local:5000/inplaced:<version>] [-insecure]
//
// Each platform's image has two layers: the host files (one layer, the
// same blob in both images) and that platform's binaries. There is no base
// image: the binaries are static and the installer is a Go program that
// needs no shell. Every file time and the config's creation time are
// -created, so the same inputs give the same digests.
//
// It is a build tool, not part of the product: it lives in hack/ so that
// the product's code checks (test/codecheck) and dependency lists do not
// count it.
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("image", flag.ContinueOnError)
	var (
		spec              Spec
		bins, layoutDir   string
		push              string
		insecure          bool
		created           int64
		hostFileRootFlags string
		platforms         string
	)
	fs.StringVar(&spec.BinDir, "bin-dir", "", "directory of the release binaries, named <name>-linux-<arch>")
	fs.StringVar(&bins, "bins", "inplaced inplacectl", "binaries to put in /usr/local/bin, space-separated")
	fs.StringVar(&spec.Entrypoint, "entrypoint", "", "the binary (one of -bins) the image runs; none when empty")
	fs.StringVar(&spec.Version, "version", "dev", "version, in the images' labels and the layout's tag")
	fs.StringVar(&spec.Commit, "commit", "unknown", "commit, in the images' labels")
	fs.Int64Var(&created, "created", 0, "creation time and every file's time, in Unix seconds (SOURCE_DATE_EPOCH)")
	fs.StringVar(&spec.SourceDir, "source", ".", "the repository, where the host files are read from")
	fs.StringVar(&hostFileRootFlags, "host-files", strings.Join(DefaultHostFiles, " "),
		"files and directories (relative to -source) copied under "+HostFilesDir+", space-separated")
	var defaultPlatforms []string
	for _, p := range DefaultPlatforms {
		defaultPlatforms = append(defaultPlatforms, p.String())
	}
	fs.StringVar(&platforms, "platforms", strings.Join(defaultPlatforms, " "), "the index's platforms (os/arch), space-separated")
	fs.StringVar(&layoutDir, "layout", "", "write an OCI layout to this directory (replaced)")
	fs.StringVar(&push, "push", "", "push the index to this reference (registry/repository:tag)")
	fs.BoolVar(&insecure, "insecure", false, "push over plain HTTP")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if layoutDir == "" && push == "" {
		return fmt.Errorf("give -layout DIR, -push REF or both")
	}
	spec.Bins = strings.Fields(bins)
	spec.HostFiles = strings.Fields(hostFileRootFlags)
	spec.Created = time.Unix(created, 0).UTC()
	for _, p := range strings.Fields(platforms) {
		pl, err := v1.ParsePlatform(p)
		if err != nil {
			return err
		}
		spec.Platforms = append(spec.Platforms, *pl)
	}

	idx, err := Build(spec)
	if err != nil {
		return err
	}
	if layoutDir != "" {
		if err := WriteLayout(layoutDir, idx, spec.Version); err != nil {
			return err
		}
		// Read back from disk, not from memory: what is checked is what
		// a user gets.
		back, err := ReadLayout(layoutDir)
		if err != nil {
			return err
		}
		if err := Verify(back, spec); err != nil {
			return fmt.Errorf("%s: %w", layoutDir, err)
		}
		fmt.Printf("image: %s: OCI layout, tag %s, %s\n", layoutDir, spec.Version, summary(idx))
	}
	if push != "" {
		var opts []name.Option
		if insecure {
			opts = append(opts, name.Insecure)
		}
		d, err := Push(push, idx, opts...)
		if err != nil {
			return err
		}
		fmt.Printf("image: pushed %s@%s\n", push, d)
	}
	return nil
}
