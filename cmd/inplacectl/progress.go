package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"golang.org/x/term"

	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

// progressPrinter shows pull progress: a bar redrawn in place on a
// terminal, one line per update otherwise (logs, pipes).
type progressPrinter struct {
	w      io.Writer
	tty    bool
	prefix string
	open   bool // a bar is drawn and its line not ended
}

func newProgressPrinter(w io.Writer, prefix string) *progressPrinter {
	p := &progressPrinter{w: w, prefix: prefix}
	if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		p.tty = true
	}
	return p
}

func (p *progressPrinter) update(u *inplacedv1.PullProgress) {
	line := p.prefix + progressLine(u)
	if !p.tty {
		fmt.Fprintln(p.w, line)
		return
	}
	fmt.Fprintf(p.w, "\r\x1b[K%s", line)
	p.open = true
	if u.Done {
		p.end()
	}
}

func (p *progressPrinter) end() {
	if p.open {
		fmt.Fprintln(p.w)
		p.open = false
	}
}

const barWidth = 24

func mib(n int64) string { return fmt.Sprintf("%.1f", float64(n)/(1<<20)) }

// progressLine is one pull update in words.
func progressLine(u *inplacedv1.PullProgress) string {
	elapsed := time.Duration(u.ElapsedNs).Round(100 * time.Millisecond)
	switch {
	case u.Error != "":
		return fmt.Sprintf("%s  failed after %s: %s", u.Image, elapsed, u.Error)
	case !u.BytesKnown && u.Done:
		return fmt.Sprintf("%s  pulled in %s (%s)", u.Image, elapsed, u.Note)
	case !u.BytesKnown:
		return fmt.Sprintf("%s  pulling, %s elapsed (%s)", u.Image, elapsed, u.Note)
	case u.Done:
		rate := int64(0)
		if u.ElapsedNs > 0 {
			rate = int64(float64(u.BytesDone) / time.Duration(u.ElapsedNs).Seconds())
		}
		return fmt.Sprintf("%s  [%s]  %s/%s MiB  %d/%d layers  %s MiB/s  done in %s", u.Image, strings.Repeat("#", barWidth),
			mib(u.BytesDone), mib(u.BytesTotal), u.LayersDone, u.LayersTotal, mib(rate), elapsed)
	}
	filled := 0
	if u.BytesTotal > 0 {
		filled = int(float64(barWidth) * float64(u.BytesDone) / float64(u.BytesTotal))
	}
	filled = min(max(filled, 0), barWidth)
	eta := "-"
	if u.EtaNs > 0 {
		eta = time.Duration(u.EtaNs).Round(time.Second).String()
	}
	return fmt.Sprintf("%s  [%s%s]  %s/%s MiB  %d/%d layers  %s MiB/s  ETA %s", u.Image, strings.Repeat("#", filled),
		strings.Repeat(".", barWidth-filled), mib(u.BytesDone), mib(u.BytesTotal), u.LayersDone, u.LayersTotal,
		mib(u.BytesPerSecond), eta)
}
