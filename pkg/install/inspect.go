package install

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"go.uber.org/zap"
)

// smallFile is the largest file whose content Facts carries (configs,
// units, the record); a larger one (a binary) is known by its digest.
const smallFile = 1 << 20

// Inspector reads the facts a plan decides from.
type Inspector struct {
	// Root is the host's root as the installer sees it; Proc the host's
	// /proc (the pod's own with hostPID).
	Root, Proc string
	Systemd    Systemd
	Node       Node // nil: no annotation read
	Log        *zap.Logger
}

// Facts reads the host for layout l (the record's or the annotation's
// layout wins, as in the planners) and the payload p.
func (in *Inspector) Facts(ctx context.Context, l Layout, p Payload) (Facts, error) {
	f := Facts{Files: map[string]HostFile{}, Dirs: map[string][]string{}, Units: map[string]UnitState{}}
	if err := in.readFile(&f, RecordPath); err != nil {
		return f, err
	}
	rec, err := RecordOf(f)
	if err != nil {
		return f, err
	}
	if err := in.annotation(ctx, &f); err != nil {
		return f, err
	}
	l = effectiveLayout(l, rec, f.Annotation)
	if err := in.units(ctx, &f, p); err != nil {
		return f, err
	}
	f.KubeletUnit = kubeletUnitOf(l, rec, f.Units)
	if f.KubeletUnit != "" {
		if pid := f.Units[f.KubeletUnit].MainPID; pid != 0 {
			f.KubeletArgs = in.cmdline(pid)
		}
	}
	sd, err := newSide(l, f, rec)
	if err != nil {
		return f, err
	}
	return f, in.files(&f, sd, p, rec)
}

// effectiveLayout is the layout a node was installed with, when it says.
func effectiveLayout(l Layout, rec *Record, ann *Installed) Layout {
	switch {
	case rec != nil && rec.Layout != "":
		return rec.Layout
	case ann != nil && ann.Layout != "":
		return ann.Layout
	}
	return l
}

// kubeletUnitOf is the unit that runs kubelet: the record's, else the
// layout's — for k3s the agent's or the server's, whichever runs.
func kubeletUnitOf(l Layout, rec *Record, units map[string]UnitState) string {
	if rec != nil && rec.KubeletUnit != "" {
		return rec.KubeletUnit
	}
	if l != K3s {
		return KubeletUnit
	}
	for _, u := range []string{"k3s-agent.service", "k3s.service"} {
		if units[u].running() {
			return u
		}
	}
	return ""
}

func (in *Inspector) annotation(ctx context.Context, f *Facts) error {
	if in.Node == nil {
		return nil
	}
	n, err := in.Node.Get(ctx)
	if err != nil {
		return fmt.Errorf("read the Node: %w", err)
	}
	v, ok := n.Annotations[AnnotationInstalled]
	if !ok {
		return nil
	}
	ann, err := ParseInstalled(v)
	if err != nil {
		in.log().Warn("the Node's annotation is not understood: the host's record alone counts", zap.Error(err))
		return nil
	}
	f.Annotation = ann
	return nil
}

func (in *Inspector) units(ctx context.Context, f *Facts, p Payload) error {
	names := []string{ServiceUnit, "inplaced.socket", KubeletUnit, "k3s.service", "k3s-agent.service"}
	services, sockets := unitNames(p)
	for _, n := range append(append(names, services...), sockets...) {
		if _, done := f.Units[n]; done {
			continue
		}
		st, err := in.Systemd.Unit(ctx, n)
		if err != nil {
			return fmt.Errorf("unit %s: %w", n, err)
		}
		f.Units[n] = st
	}
	return nil
}

// cmdline is a process's command line, nil when it cannot be read (gone).
func (in *Inspector) cmdline(pid uint32) []string {
	b, err := os.ReadFile(filepath.Join(in.Proc, strconv.FormatUint(uint64(pid), 10), "cmdline"))
	if err != nil {
		return nil
	}
	return strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
}

func (in *Inspector) files(f *Facts, sd side, p Payload, rec *Record) error {
	paths := append(append(append([]string(nil), knownFiles...), sd.paths()...), sd.owned()...)
	for _, pl := range placeAll(p) {
		paths = append(paths, pl.host)
	}
	if rec != nil {
		paths = append(paths, rec.Files...)
	}
	for _, d := range append(sd.dirs(), StateDir, RuntimeDir) {
		names, err := in.readDir(d)
		if err != nil {
			return err
		}
		if names == nil {
			continue
		}
		f.Dirs[d] = names
		if d != StateDir && d != RuntimeDir {
			for _, n := range names {
				paths = append(paths, path.Join(d, n))
			}
		}
	}
	for _, p := range paths {
		if err := in.readFile(f, p); err != nil {
			return err
		}
	}
	return nil
}

// readDir lists a host directory; nil when it does not exist.
func (in *Inspector) readDir(d string) ([]string, error) {
	p, err := hostPath(in.Root, d, false)
	if err != nil {
		return nil, err
	}
	es, err := os.ReadDir(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	names := []string{}
	for _, e := range es {
		names = append(names, e.Name())
	}
	return names, nil
}

func (in *Inspector) readFile(f *Facts, p string) error {
	if _, done := f.Files[p]; done {
		return nil
	}
	hp, err := hostPath(in.Root, p, false)
	if err != nil {
		return fmt.Errorf("read %s: %w", p, err)
	}
	h, err := readHostFile(hp)
	if err != nil {
		return fmt.Errorf("read %s: %w", p, err)
	}
	if h.Exists {
		f.Files[p] = h
	}
	return nil
}

func readHostFile(p string) (HostFile, error) {
	fh, err := os.Open(p)
	if errors.Is(err, fs.ErrNotExist) {
		return HostFile{}, nil
	}
	if err != nil {
		return HostFile{}, err
	}
	defer fh.Close()
	st, err := fh.Stat()
	if err != nil {
		return HostFile{}, err
	}
	if st.IsDir() {
		return HostFile{}, fmt.Errorf("a directory where a file belongs")
	}
	h := HostFile{Exists: true, Mode: st.Mode().Perm()}
	sum := sha256.New()
	var buf bytes.Buffer
	w := io.Writer(sum)
	if st.Size() <= smallFile {
		w = io.MultiWriter(sum, &buf)
	}
	if _, err := io.Copy(w, fh); err != nil {
		return HostFile{}, err
	}
	h.Digest = hex.EncodeToString(sum.Sum(nil))
	if st.Size() <= smallFile {
		h.Data = buf.Bytes()
	}
	return h, nil
}

func (in *Inspector) log() *zap.Logger {
	if in.Log == nil {
		return zap.NewNop()
	}
	return in.Log
}

// LoadPayload reads the image's payload: the host files under filesDir at
// their repository paths, the binaries (payload paths bin/...) in binDir.
// Every file HostFiles and PayloadTemplates name is read, the binaries by
// digest, the rest whole.
func LoadPayload(filesDir, binDir string) (Payload, error) {
	p := Payload{}
	var pats []string
	for _, r := range HostFiles {
		pats = append(pats, r.Payload)
	}
	pats = append(pats, PayloadTemplates...)
	for _, pat := range pats {
		dir, rel := filesDir, pat
		if strings.HasPrefix(pat, binPrefix) {
			dir, rel = binDir, strings.TrimPrefix(pat, binPrefix)
		}
		matches, err := filepath.Glob(filepath.Join(dir, filepath.FromSlash(rel)))
		if err != nil {
			return nil, err
		}
		for _, m := range matches {
			h, err := readHostFile(m)
			if err != nil {
				return nil, fmt.Errorf("payload %s: %w", m, err)
			}
			r, _ := filepath.Rel(dir, m)
			key := filepath.ToSlash(r)
			if dir == binDir {
				key = binPrefix + key
			}
			p[key] = PayloadFile{Source: m, Digest: h.Digest, Mode: h.Mode, Data: h.Data}
		}
	}
	return p, nil
}

// binPrefix starts the payload paths of the binaries, which the image
// keeps apart from the host files.
const binPrefix = "bin/"
