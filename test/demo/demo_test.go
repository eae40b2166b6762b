// Package demo is `make demo`: a private containerd and inplaced, a pod run
// through the proxy with crictl, an in-place swap of its container while a
// client polls the app over the pod IP, a prepull of a large image over a
// paced registry link with its progress bar, `inplacectl ps`, then a full
// clean-up. Each line it prints says what it did or what it measured.
//
// It fails when the client saw a failed request outside the gap (before
// the old container's last answer or after the new one's first), when the
// pod IP changed, or when the prepull's bar did not advance to the image's
// size.
package demo

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/test/harness"
)

const (
	// pollEvery is how often the client asks the pod for /version.
	pollEvery = 10 * time.Millisecond
	// linkBits is the paced registry link's rate: the ≥ 100 MiB image
	// takes a few seconds, long enough to watch the bar move.
	linkBits = 400_000_000
)

func TestDemo(t *testing.T) {
	say := func(format string, a ...any) { t.Helper(); t.Logf(format, a...) }
	backend := harness.Containerd2
	if !backend.Available() {
		backend = harness.Containerd16
	}
	reg := harness.StartRegistry(t)
	// Containerd lists the links started before it as plain-HTTP registries.
	link := reg.StartLink(t, linkBits)
	say("registry on %s with locally built test images; the same registry paced to %d Mbit/s on %s", reg.Addr, linkBits/1_000_000, link)
	c := harness.StartContainerd(t, backend, reg)
	say("private %s: %s (CNI bridge %s, %s)", backend, c.Endpoint, c.Bridge, c.Subnet)
	px := harness.StartInplaced(t, c.Endpoint)
	say("inplaced: CRI proxy on %s, control socket %s", px.Endpoint, px.ControlSocket)
	ctl := filepath.Join(harness.BinDir(t), "inplacectl")

	crictl := func(args ...string) string {
		t.Helper()
		out, err := harness.Crictl(t, px.Endpoint, args...)
		if err != nil {
			t.Fatal(err)
		}
		out = strings.TrimSpace(out)
		say("$ crictl %s\n%s", strings.Join(args, " "), indent(out))
		return out
	}
	dir := t.TempDir()
	pod := harness.PodConfig("demo", t.TempDir())
	pod.Labels = map[string]string{"io.kubernetes.pod.name": "demo", "io.kubernetes.pod.namespace": "default", "io.kubernetes.pod.uid": "uid-demo"}
	writeJSON(t, filepath.Join(dir, "pod.json"), pod)
	ctr := harness.ContainerConfig("app", c.Images.App1)
	ctr.Labels = map[string]string{"io.kubernetes.pod.name": "demo", "io.kubernetes.pod.namespace": "default",
		"io.kubernetes.pod.uid": "uid-demo", "io.kubernetes.container.name": "app"}
	ctr.Annotations = map[string]string{"io.kubernetes.container.hash": "demo", "io.kubernetes.container.restartCount": "0"}
	writeJSON(t, filepath.Join(dir, "ctr.json"), ctr)

	crictl("pull", c.Images.App1)
	podID := crictl("runp", filepath.Join(dir, "pod.json"))
	t.Cleanup(func() {
		_, _ = harness.Crictl(t, px.Endpoint, "stopp", podID)
		_, _ = harness.Crictl(t, px.Endpoint, "rmp", "-f", podID)
	})
	ip := crictl("inspectp", "-o", "go-template", "--template", "{{.status.network.ip}}", podID)
	ctrID := crictl("create", podID, filepath.Join(dir, "ctr.json"), filepath.Join(dir, "pod.json"))
	crictl("start", ctrID)
	crictl("ps", "--pod", podID)
	crictl("exec", ctrID, "cat", "/VERSION")

	// A client on the node polls the app over the pod IP through the swap.
	// It starts once the app answers: requests before the app listens are
	// not the swap's.
	url := fmt.Sprintf("http://%s:%d/version", ip, harness.AppPort)
	if err := harness.WaitHTTPAnswer(url, "v1", 10*time.Second); err != nil {
		t.Fatalf("GET %s before the swap: %v", url, err)
	}
	poll := harness.StartHTTPPoll(url, pollEvery, "v1", "v2")
	defer poll.Stop()
	say("a client polls GET %s every %s, each request on a new connection; it is answered v1", url, pollEvery)

	swapArgs := []string{"swap", "demo", "-n", "default", "-c", "app", "--image", c.Images.App2, "--env", "GREETING=hello",
		"--health-http", fmt.Sprintf("%d/healthz", harness.AppPort), "--min-runtime", "1s"}
	say("$ inplacectl %s", strings.Join(swapArgs, " "))
	swapOut, err := streamed(t, say, exec.Command(ctl, append([]string{"--control-socket", px.ControlSocket}, swapArgs...)...))
	if err != nil {
		t.Fatalf("swap: %v", err)
	}
	if err := poll.Wait("v2", 10*time.Second); err != nil {
		t.Fatalf("GET %s after the swap: %v", url, err)
	}
	time.Sleep(time.Second) // the client keeps asking the new container a while
	samples := poll.Stop()
	newIP := crictl("inspectp", "-o", "go-template", "--template", "{{.status.network.ip}}", podID)
	r, err := analyze(samples, "v1", "v2")
	if err != nil {
		t.Fatalf("the client's view of the swap: %v", err)
	}
	say("the client saw: %d requests, %d answered (%d by v1, %d by v2), %d failed (%s)\n"+
		"    gap (v1's last answer → v2's first): %s, with %d failed requests in it; failed outside the gap: %d\n"+
		"    longest stretch without an answer in the whole run: %s\n"+
		"    pod IP before %s, after %s",
		r.Requests, r.Answered, r.AnsweredOld, r.AnsweredNew, r.Failed, r.causes(),
		r.Gap.Round(time.Millisecond), r.FailedInGap, r.FailedOutside, r.Longest.Round(time.Millisecond), ip, newIP)
	for _, l := range swapOut {
		if d, ok := strings.CutPrefix(l, "downtime: "); ok {
			say("inplaced's own downtime (old container stopped → new one started) was %s; the client's gap also holds the old app's\n"+
				"    shutdown after SIGTERM and the new one's start until it listens", d)
		}
		if h, ok := strings.CutPrefix(l, "connections: "); ok {
			say("inplaced's connection hold: %s", h)
		}
	}
	say("with the connection hold (--connection-hold=queue, the default): %d failed requests during the swap; the slowest request took %s\n"+
		"    (it waited in its TCP handshake for v2 to listen)", r.Failed, r.Slowest.Round(time.Millisecond))
	if r.FailedOutside > 0 {
		t.Errorf("%d requests failed outside the gap", r.FailedOutside)
	}
	if r.Failed > 0 {
		t.Errorf("%d requests failed with the connection hold on (%s)", r.Failed, r.causes())
	}

	// The same swap back with the hold off: the refusals it prevented.
	px.ExtraArgs = []string{"--connection-hold=off"}
	if err := px.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := px.Start(); err != nil {
		t.Fatal(err)
	}
	poll = harness.StartHTTPPoll(url, pollEvery, "v1", "v2")
	backArgs := []string{"swap", "demo", "-n", "default", "-c", "app", "--image", c.Images.App1,
		"--health-http", fmt.Sprintf("%d/healthz", harness.AppPort), "--min-runtime", "1s"}
	say("inplaced restarted with --connection-hold=off; the client polls again\n$ inplacectl %s", strings.Join(backArgs, " "))
	if _, err := streamed(t, say, exec.Command(ctl, append([]string{"--control-socket", px.ControlSocket}, backArgs...)...)); err != nil {
		t.Fatalf("swap back: %v", err)
	}
	if err := poll.Wait("v1", 10*time.Second); err != nil {
		t.Fatalf("GET %s after the swap back: %v", url, err)
	}
	time.Sleep(time.Second)
	off, err := analyze(poll.Stop(), "v2", "v1")
	if err != nil {
		t.Fatalf("the client's view of the swap back: %v", err)
	}
	say("with --connection-hold=off: %d requests, %d failed (%s), gap %s: the refusals the hold prevented; the slowest answered request took %s",
		off.Requests, off.Failed, off.causes(), off.Gap.Round(time.Millisecond), off.Slowest.Round(time.Millisecond))
	if off.FailedOutside > 0 {
		t.Errorf("%d requests failed outside the gap of the swap back", off.FailedOutside)
	}
	px.ExtraArgs = nil
	if err := px.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := px.Start(); err != nil {
		t.Fatal(err)
	}
	if newIP != ip {
		t.Fatalf("pod IP changed %s → %s", ip, newIP)
	}
	crictl("ps", "-a", "--pod", podID)
	ids := strings.Fields(crictl("ps", "-q", "--pod", podID))
	if len(ids) != 1 {
		t.Fatalf("running containers after swap: %v", ids)
	}
	crictl("exec", ids[0], "cat", "/VERSION")
	say("same sandbox %s, same IP %s; the container runs v1 again after two swaps — no pod was recreated", podID[:13], ip)

	prepull(t, say, c, px, ctl, link+strings.TrimPrefix(c.Images.Large, reg.Addr))

	out, err := px.Ctl("ps")
	if err != nil {
		t.Fatal(err)
	}
	say("$ inplacectl ps\n%s", indent(strings.TrimSpace(out)))
	hist, _ := px.Ctl("swaps")
	say("$ inplacectl swaps\n%s", indent(strings.TrimSpace(hist)))
	say("cleaning up: pod, inplaced, containerd, bridge, registry")
}

var progressRe = regexp.MustCompile(`([0-9.]+)/([0-9.]+) MiB`)

// prepull runs `inplacectl prepull` of the large image over the paced link
// on a pseudo-terminal (script), as an operator at a terminal would, and
// shows each redraw of its bar as a line. It fails unless the bar advanced
// and ended at the image's size.
func prepull(t *testing.T, say func(string, ...any), c *harness.Containerd, px *harness.Inplaced, ctl, image string) {
	t.Helper()
	cri := c.CRI(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, _ = cri.Image.RemoveImage(ctx, &runtimeapi.RemoveImageRequest{Image: &runtimeapi.ImageSpec{Image: image}})
	say("$ inplacectl prepull %s\n    (on a pty; the bar is redrawn in place every 250 ms, here each redraw is a line)", image)
	start := time.Now()
	cmdline := fmt.Sprintf("%s --control-socket %s prepull %s", ctl, px.ControlSocket, image)
	frames, err := streamed(t, say, exec.Command("script", "-qefc", cmdline, "/dev/null"))
	if err != nil {
		t.Fatalf("prepull: %v", err)
	}
	took := time.Since(start)
	st, err := cri.Image.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: image}})
	if err != nil || st.GetImage() == nil {
		t.Fatalf("image status after prepull: %v %v", st, err)
	}
	size := int64(st.GetImage().GetSize())
	var counts []float64
	last := ""
	for _, f := range frames {
		if m := progressRe.FindStringSubmatch(f); m != nil {
			v, _ := strconv.ParseFloat(m[1], 64)
			if len(counts) == 0 || v > counts[len(counts)-1] {
				counts = append(counts, v)
			}
			last = f
		}
	}
	sizeMiB := fmt.Sprintf("%.1f/%.1f MiB", float64(size)/(1<<20), float64(size)/(1<<20))
	say("prepull: %d redraws with growing byte counts in %s; the image is on the node: %s bytes (%.1f MiB), %.0f Mbit/s on average",
		len(counts), took.Round(100*time.Millisecond), strconv.FormatInt(size, 10), float64(size)/(1<<20), float64(size)*8/took.Seconds()/1e6)
	if size < 100<<20 || len(counts) < 3 || !strings.Contains(last, sizeMiB) || !strings.Contains(last, "done in") {
		t.Fatalf("prepull progress: %d growing counts %v, last frame %q; want ≥ 3 ending at %s (image size %d)", len(counts), counts, last, sizeMiB, size)
	}
}

// streamed runs cmd and shows its output as it comes, one line per line
// or per redraw of a terminal's bar (\r), and returns those frames. A
// failure carries the output.
func streamed(t *testing.T, say func(string, ...any), cmd *exec.Cmd) ([]string, error) {
	t.Helper()
	var all bytes.Buffer
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	waited := make(chan error, 1)
	go func() { err := cmd.Wait(); pw.Close(); waited <- err }()
	sc := bufio.NewScanner(io.TeeReader(pr, &all))
	sc.Split(scanFrames)
	var frames []string
	for sc.Scan() {
		f := strings.TrimSpace(strings.ReplaceAll(sc.Text(), "\x1b[K", ""))
		if f == "" {
			continue
		}
		frames = append(frames, f)
		say("    %s", f)
	}
	if err := <-waited; err != nil {
		return frames, fmt.Errorf("%s: %w\n%s", strings.Join(cmd.Args, " "), err, all.String())
	}
	return frames, nil
}

// scanFrames is bufio.ScanLines that also ends a token at \r.
func scanFrames(data []byte, atEOF bool) (int, []byte, error) {
	if i := bytes.IndexAny(data, "\r\n"); i >= 0 {
		return i + 1, data[:i], nil
	}
	if atEOF && len(data) > 0 {
		return len(data), data, nil
	}
	return 0, nil, nil
}

func indent(s string) string { return "    " + strings.ReplaceAll(s, "\n", "\n    ") }

func writeJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}
